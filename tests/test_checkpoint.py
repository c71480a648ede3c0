"""Checkpoint format: save/load round trip, and clear errors for broken directories."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from workbench.model.checkpoint import META_FILE, CheckpointError, load_checkpoint, read_meta  # noqa: E402
from workbench.model.projector import SoftTokenProjector  # noqa: E402
from workbench.testing import make_random_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def ck_dir(tmp_path_factory):
    return make_random_checkpoint(tmp_path_factory.mktemp("ck") / "ck", arch="qwen3", n_items=50, levels=(4, 4), seed=3)


def test_round_trip(ck_dir):
    ck = load_checkpoint(ck_dir)
    assert ck.meta.method == "soft_token" and ck.meta.user_vector_dim == 16
    assert ck.model.config.vocab_size == ck.meta.layout.vocab_size
    assert ck.catalog.n_items == 50 and ck.catalog.depth == 3
    assert isinstance(ck.projector, SoftTokenProjector)
    assert ck.projector(torch.zeros(2, 16)).shape == (2, ck.model.config.hidden_size)
    # the tokenizer knows the SID tokens and the placeholder
    ids = ck.tokenizer("w5 <a_1><b_2><|user|>")["input_ids"]
    layout = ck.meta.layout
    assert ids == [5, layout.item_level_offset(0) + 1, layout.item_level_offset(1) + 2, layout.placeholder_id]
    # a second load gives the same weights and outputs
    again = load_checkpoint(ck_dir)
    x = torch.tensor([[5, 6, 7]])
    assert torch.equal(ck.model(x).logits, again.model(x).logits)
    assert np.array_equal(ck.catalog.item_codes, again.catalog.item_codes)


def test_bfloat16_load(ck_dir):
    ck = load_checkpoint(ck_dir, dtype="bfloat16")
    assert next(ck.model.parameters()).dtype == torch.bfloat16


def test_projector_kinds():
    for kind in ("linear", "mlp"):
        p = SoftTokenProjector(8, 32, kind)
        assert p(torch.randn(3, 8)).shape == (3, 32)
    with pytest.raises(ValueError, match="unknown projector kind"):
        SoftTokenProjector(8, 32, "conv")
    with pytest.raises(ValueError, match="expects 8"):
        SoftTokenProjector(8, 32)(torch.randn(1, 7))


def test_clear_errors(ck_dir, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="workbench.json is missing"):
        read_meta(tmp_path)
    with pytest.raises(CheckpointError, match="unknown dtype"):
        load_checkpoint(ck_dir, dtype="float8")
    d = json.loads((ck_dir / META_FILE).read_text())
    d["format_version"] = 99
    (tmp_path / META_FILE).write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match="newer"):
        read_meta(tmp_path)


def test_no_projector(tmp_path):
    ck = load_checkpoint(make_random_checkpoint(tmp_path / "plain", n_items=20, levels=(4,), soft_token=False))
    assert ck.projector is None and ck.meta.user_vector_dim is None and ck.meta.method == "none"


def test_pickle_weights_are_refused(ck_dir, tmp_path):
    """Weights as pytorch_model.bin only (pickle: loading can run code) are refused, never loaded,
    with the reason and the conversion; the same weights as safetensors load as before."""
    import shutil

    from safetensors.torch import load_file

    bin_dir = shutil.copytree(ck_dir, tmp_path / "bin")
    torch.save(load_file(str(bin_dir / "model.safetensors")), bin_dir / "pytorch_model.bin")
    (bin_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"only pickle weights \(pytorch_model.bin\).*safetensors only") as e:
        load_checkpoint(bin_dir)
    assert "save_pretrained" in str(e.value)  # how to convert
    (bin_dir / "pytorch_model.bin").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        load_checkpoint(bin_dir)


def test_special_tokens_saved_and_old_checkpoints_load_the_same(ck_dir, tmp_path):
    """The saved tokenizer lists the structural tokens as special (a plain AutoTokenizer sees them); a
    checkpoint written before (its layout tokens plain added tokens) loads with the same ids, gets them
    marked special at load, and answers token-id requests exactly as before."""
    import asyncio
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest
    from workbench.engines.torch.engine import TorchEngine
    from workbench.sids.layout import SPECIAL_TOKENS

    layout = read_meta(ck_dir).layout
    structural = [layout.special_id(t) for t in SPECIAL_TOKENS]
    assert set(structural) <= set(AutoTokenizer.from_pretrained(ck_dir).all_special_ids)

    # the tokenizer make_word_tokenizer wrote before: every layout token a non-special added token
    old_dir = shutil.copytree(ck_dir, tmp_path / "old")
    vocab = {t: i for i, t in enumerate(["[UNK]", "[PAD]"] + [f"w{i}" for i in range(2, layout.base_vocab_size)])}
    vocab |= {n: layout.base_vocab_size + j for j, n in enumerate(layout.token_names())}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    old_tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]")
    old_tok.add_tokens(layout.token_names(), special_tokens=False)
    old_tok.save_pretrained(old_dir)
    assert not set(structural) & set(AutoTokenizer.from_pretrained(old_dir).all_special_ids)  # really the old kind

    new, old = load_checkpoint(ck_dir), load_checkpoint(old_dir)
    assert len(old.tokenizer) == len(new.tokenizer) == layout.vocab_size
    assert set(structural) <= set(old.tokenizer.all_special_ids)  # marked at load, no id added or moved
    text = "w5 <|user|> <|hist|><a_1><b_2><c_0> w7 <|next|>"
    assert old.tokenizer(text)["input_ids"] == new.tokenizer(text)["input_ids"]

    def answers(ck):
        eng = TorchEngine(ck)
        ph, dim = layout.placeholder_id, ck.meta.user_vector_dim
        try:
            beams = asyncio.run(eng.beam_search([BeamSearchRequest(Prompt.of([5, ph, 7], [0.1] * dim, 1), 4, 3, True),
                                                 BeamSearchRequest(Prompt.of([5, 6, 7]), 3, 2)]))
            (sc,) = asyncio.run(eng.score([ScoreRequest(Prompt.of([5, 6]), ((8, 9), (10,)))]))
        finally:
            asyncio.run(eng.close())
        return [[(b.token_ids, b.cum_logprob) for b in r.beams] for r in beams], sc.scores

    assert answers(old) == answers(new)
