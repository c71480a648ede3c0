"""Metric functions against hand-computed cases, baselines, and a tiny train-and-evaluate run.

The end-to-end case plants structure a model can learn and popularity cannot: 4 clusters of 12
items; every user walks one cluster in order (item c*12 + (o + j) % 12), so the next item is a
function of the last one. Trained through `train_model` and evaluated through the torch engine
(constrained beam search, seen items banned), each method must beat popularity on Recall@10.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from workbench.engines.numerics import logprob_bound

from workbench import names
from workbench.study.baselines import SasrecSettings, popularity_rank, sasrec_rank, train_sasrec
from workbench.study.evaluate import (
    EvalSettings,
    Quality,
    coverage,
    dedup_cut,
    paired_bootstrap,
    per_user_metrics,
    ranks_of,
    summarize,
    top_k_excluding,
)

# ---- metric functions ---------------------------------------------------------------------------


def test_ranks_and_metrics_hand_computed():
    lists = [[5, 3, 9], [1, 2, 3], [7]]
    targets = [9, 4, 7]
    ranks = ranks_of(lists, targets)
    assert ranks.tolist() == [2, -1, 0]
    m = per_user_metrics(ranks, ks=(1, 3))
    assert m[names.recall_at(1)].tolist() == [0, 0, 1]
    assert m[names.recall_at(3)].tolist() == [1, 0, 1]
    assert m[names.ndcg_at(3)][0] == pytest.approx(1 / math.log2(4))  # rank 2 -> 1/log2(4) = 0.5
    assert m[names.ndcg_at(1)].tolist() == [0, 0, 1]
    assert m[names.MRR].tolist() == pytest.approx([1 / 3, 0, 1])
    s = summarize(m)
    assert s[names.recall_at(3)] == pytest.approx(2 / 3)
    assert s[names.ndcg_at(3)] == pytest.approx((0.5 + 1) / 3)


def test_dedup_cut_coverage_and_topk():
    assert dedup_cut([4, None, 4, 2, 7, 2, 9], 3) == [4, 2, 7]
    assert coverage([[0, 1], [1, 2]], n_items=8, k=10) == pytest.approx(3 / 8)
    scores = np.array([[0.1, 0.9, 0.5, 0.7], [1.0, 0.0, 0.2, 0.3]])
    assert top_k_excluding(scores, [np.array([1]), np.array([], dtype=int)], 2) == [[3, 2], [0, 3]]


def test_paired_bootstrap():
    a = np.array([1.0, 1, 1, 0, 1, 1, 1, 1, 0, 1] * 20)
    b = np.zeros_like(a)
    mean, lo, hi = paired_bootstrap(a, b, n_boot=500, seed=0)
    assert mean == pytest.approx(0.8) and 0.7 < lo < 0.8 < hi < 0.9
    mean, lo, hi = paired_bootstrap(a, a, n_boot=200)
    assert mean == 0 and lo == 0 and hi == 0  # identical methods: the interval is exactly 0
    with pytest.raises(ValueError, match="same users"):
        paired_bootstrap(a, a[:-1])


def test_popularity_train_only_and_seen_excluded():
    train = [np.array([0, 1, 2]), np.array([1, 2]), np.array([2])]
    lists = popularity_rank(train, 5, [np.array([2]), np.array([], dtype=int), np.array([0, 1, 2])], k=3)
    assert lists == [[1, 0, 3], [2, 1, 0], [3, 4]]


# ---- synthetic catalog with planted structure ---------------------------------------------------

N_CLUSTERS, PER, N_USERS = 4, 12, 96


def synthetic():
    from workbench.study.prompts import Interactions, UserEncoder

    rng = np.random.default_rng(0)
    n_items = N_CLUSTERS * PER
    from workbench.sids.layout import add_dedup_digit

    codes = add_dedup_digit(np.stack([np.arange(n_items) // PER, np.arange(n_items) % 4, (np.arange(n_items) % PER) // 4], 1))
    train, valid, test = [], [], []
    for u in range(N_USERS):
        c, o = u % N_CLUSTERS, int(rng.integers(PER))
        seq = [c * PER + (o + j) % PER for j in range(10)]
        train.append(np.array(seq[:8]))
        valid.append(seq[8])
        test.append(seq[9])
    data = Interactions(train, np.array(valid), np.array(test), n_items)

    def vectors(users, lists, as_of=None):
        out = np.zeros((len(lists), N_CLUSTERS), np.float32)
        for i, l in enumerate(lists):
            for it in l:
                out[i, int(it) // PER] += 1.0 / len(l)
        return out

    enc = UserEncoder(vectors, N_CLUSTERS, lambda v: np.stack([v.argmax(1), np.zeros(len(v), int)], 1),
                      lambda user, seq, cuts: vectors(None, [seq[:c] for c in cuts]))
    texts = [f"cluster {i // PER} film {i}" for i in range(n_items)]
    return data, codes, enc, texts


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_torch_thread):
    """Train `none` and `soft_token` on the synthetic catalog (shared by the tests below).

    On one torch thread (conftest): a tiny model is as fast and does not fight the other tests for cores.
    """
    from workbench.config import ModelConfig
    from workbench.model.backbone import build_backbone
    from workbench.study.prompts import PromptBuilder, eval_examples, tokenize_item_texts
    from workbench.study.train import TrainSettings, train_model
    from workbench.study.windows import WindowBuilder

    data, codes, enc, texts = synthetic()
    cfg = ModelConfig(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=128,
                      max_position_embeddings=128, bpe_vocab_size=300)
    out = {}
    for method in ("none", "user_sid", "soft_token"):
        bb = build_backbone(cfg, texts, (4, 4, 3), 1, (4, 1), seed=0)
        b = PromptBuilder(method, bb.layout, bb.layout.item_codes_to_ids(codes), recent_k=3, long_m=5,
                          item_text_ids=tokenize_item_texts(bb.tokenizer, texts), max_prompt_tokens=120)
        wb = WindowBuilder(b, max_tokens=120)
        va = eval_examples(b, data, "valid", enc)
        te = eval_examples(b, data, "test", enc)
        st = TrainSettings(epochs=6, batch_targets=64, lr=5e-3, patience=4, seed=0, progress=False, warmup_ratio=0.1,
                           bf16=False)
        res = train_model(bb, lambda rng: wb.epoch(data.train, enc, rng), va, codes, tmp_path_factory.mktemp(method),
                          st, user_dim=N_CLUSTERS if method == "soft_token" else None)
        out[method] = (res, te)
    return data, codes, out


def test_tiny_train_and_evaluate_beats_popularity(trained):
    from workbench.study.evaluate import evaluate_checkpoint

    data, codes, out = trained
    pop_lists = popularity_rank(data.train, data.n_items, out["none"][1].seen, 30)
    pop = Quality.from_lists("popularity", out["none"][1].users, data.test, pop_lists)
    for method, (res, te) in out.items():
        assert res.checkpoint.exists() and res.steps > 0 and res.train_tokens > 0
        assert len([h for h in res.history if "epoch" in h]) == res.epochs_run and res.best_valid_ndcg10 >= 0
        assert res.tokens_per_s > 0 and 0 < res.matmul_share < 1 and res.flops > 0
        ev = evaluate_checkpoint(res.checkpoint, te, EvalSettings(ks=(5, 10, 30), beam_width=30, validity_users=16,
                                                                  latency_requests=2, progress=False))
        r10 = ev["metrics"][names.recall_at(10)]
        assert r10 > pop.summary()[names.recall_at(10)] + 0.2, (method, r10, pop.summary())
        assert ev["metrics"]["eval/failed_requests"] == 0
        # regression: a trained model writes valid SIDs without the trie too (user_sid once scored 0.000
        # here because undertrained models put the frequent dedup token <c_0> at every SID level)
        assert ev["metrics"][names.SID_VALIDITY] >= 0.3, (method, ev["metrics"][names.SID_VALIDITY])
        assert ev["metrics"]["latency/request_mean_ms"] > 0
        # seen items never come back from the banned trie
        for lst, seen in zip(ev["beam"].lists, te.seen):
            assert not set(lst) & set(seen.tolist())
        assert all(len(l) == len(set(l)) <= 30 for l in ev["beam"].lists)


def test_sasrec_learns_planted_structure():
    data, *_ = synthetic()
    res = train_sasrec(data.train, data.valid, data.n_items,
                       SasrecSettings(max_len=8, hidden=32, epochs=15, patience=3, lr=5e-3, progress=False))
    hist = [np.r_[t, v] for t, v in zip(data.train, data.valid)]
    lists = sasrec_rank(res.model, hist, hist, 10, 8)
    r10 = per_user_metrics(ranks_of(lists, data.test), (10,))[names.recall_at(10)].mean()
    assert res.best_valid_ndcg10 > 0.3 and r10 > 0.5


def test_sasrec_resumes_after_an_interrupt_exactly(tmp_path, one_torch_thread):
    """Stopped in its second epoch (a KeyboardInterrupt, as a SIGTERM becomes one), SASRec goes on from the
    state saved after its first and ends with the uninterrupted run's weights, history and best epoch."""
    import torch

    data, *_ = synthetic()
    st = SasrecSettings(max_len=8, hidden=32, epochs=3, patience=3, lr=5e-3, progress=False)
    full = train_sasrec(data.train, data.valid, data.n_items, st)

    def stop_in_epoch_2(metrics, epoch):
        if epoch == 1:  # trained, not yet saved: redone after the resume
            raise KeyboardInterrupt

    state = tmp_path / "resume.pt"
    with pytest.raises(KeyboardInterrupt):
        train_sasrec(data.train, data.valid, data.n_items, st, log_fn=stop_in_epoch_2, resume_file=state)
    assert torch.load(state, weights_only=True)["epochs_done"] == 1
    resumed = train_sasrec(data.train, data.valid, data.n_items, st, resume_file=state)
    assert resumed.history == full.history and resumed.best_epoch == full.best_epoch
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name



def test_sasrec_patience_stops_after_that_many_epochs_without_a_better_one(data_dir, one_torch_thread):
    """`evaluation.sasrec_patience` through the stage's `sasrec` (config -> settings -> cache). At lr 0 the weights
    never move, so no epoch beats the first one's validation NDCG@10: patience p stops after p + 1 epochs, None
    runs every epoch; the best epoch is the first either way (reported 1-based, as the generative models')."""
    from types import SimpleNamespace

    from workbench.config import ConfigError, StudyConfig, parse_config
    from workbench.study.stages.evaluate import sasrec, sasrec_epochs

    data, *_ = synthetic()
    inp = SimpleNamespace(interactions=data, upstream_key="synthetic")
    ran = {}
    for patience in (2, None):
        cfg = StudyConfig(name="p", dataset={"name": "ml-100k"},
                          evaluation={"sasrec_epochs": 6, "sasrec_patience": patience, "sasrec_lr_grid": [0.0],
                                      "sasrec_max_len": 8})  # fmt: skip
        _, st, info = sasrec(cfg, inp, seed=0)
        assert st.patience == patience
        ran[patience] = [h["epoch"] for h in info["history"]]
        assert sasrec_epochs(info) == {names.BEST_EPOCH: 1.0, names.EPOCHS_RUN: float(len(ran[patience]))}
    assert ran == {2: [0, 1, 2], None: [0, 1, 2, 3, 4, 5]}
    with pytest.raises(ConfigError, match="sasrec_patience"):
        parse_config({"name": "p", "dataset": {"name": "ml-100k"}, "evaluation": {"sasrec_patience": 0}})


def test_sasrec_keeps_its_best_epoch_and_stops_on_its_patience():
    """Learning to a plateau (valid NDCG@10 1.0 by epoch ~5 at lr 2e-2): the kept epoch is the best of the history,
    and the run stopped, before its most epochs, exactly when `patience` epochs in a row had not beaten the best."""
    data, *_ = synthetic()
    st = SasrecSettings(max_len=8, hidden=32, epochs=12, patience=2, lr=2e-2, progress=False)
    res = train_sasrec(data.train, data.valid, data.n_items, st)
    vals = [h["valid_ndcg10"] for h in res.history]
    assert res.best_epoch == int(np.argmax(vals)) and res.best_valid_ndcg10 == max(vals)
    bad, stop = 0, len(vals)
    for i, v in enumerate(vals):
        bad = 0 if v > max(vals[:i], default=-1.0) else bad + 1
        if bad >= st.patience:
            stop = i + 1
            break
    assert len(vals) == stop < st.epochs

# ---- regressions: training inputs, SASRec windows, evaluation tags -------------------------------


def _tiny_model(vocab: int = 64):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=64, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).eval()


def test_target_logits_without_mask_equal_masked_and_unpadded():
    """Right-padded rows skip the attention mask (faster); logits must equal the masked and the unpadded ones."""
    import torch

    from workbench.study.train import _right_padded, target_logits

    model = _tiny_model()
    ids = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    tpos = torch.tensor([[3, 4], [1, 2]])
    assert _right_padded(mask) and not _right_padded(torch.tensor([[0, 1, 1]]))
    with torch.no_grad():
        fast = target_logits(model, ids, mask, tpos)
        h = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        masked = model.get_output_embeddings()(torch.gather(h, 1, tpos[..., None].expand(-1, -1, h.shape[-1])))
        alone = model(ids[1:, :3]).logits[0, 1:3]
    # three float32 evaluations that sum in different orders (masked SDPA, unpadded rows): the
    # derived rounding bound of one forward (workbench/engines/numerics.py), not a constant fitted to one CPU
    tol = logprob_bound(model.config, ids.shape[1], 1, float(masked.abs().max()))
    torch.testing.assert_close(fast, masked, atol=tol, rtol=0)
    torch.testing.assert_close(fast[1], alone, atol=tol, rtol=0)


def test_sasrec_windows_cover_every_transition_once():
    """SASRec once trained on only the last max_len + 1 items per user (~10 of ~90 transitions on ML-100K)."""
    from collections import Counter

    from workbench.study.baselines import sasrec_windows

    rng = np.random.default_rng(0)
    train = [rng.integers(0, 100, size=n) for n in (0, 1, 2, 5, 11, 12, 37, 120)]
    wins = sasrec_windows(train, 10)
    assert all(2 <= len(w) <= 11 for w in wins)
    got = Counter((int(w[i]), int(w[i + 1]), id(None)) for w in wins for i in range(len(w) - 1))
    want = Counter((int(s[i]), int(s[i + 1]), id(None)) for s in train for i in range(len(s) - 1))
    assert got == want
    assert sum(len(w) - 1 for w in wins) == sum(max(0, len(s) - 1) for s in train)


def test_eval_runs_carry_the_report_join_tags(tmp_path):
    """Every evaluation child run is tagged with the checkpoint, engine, mode and dtype the report joins on."""
    from workbench.report import html as report
    from workbench.study.stages import evaluate as study

    tags = study.eval_tags("user_sid", 0, tmp_path / "checkpoint")
    for t in report.JOIN_TAGS:
        assert tags.get(t), t
    assert tags[names.TAG_ENGINE] == "torch" and tags[names.TAG_MODE] == "constrained"
    assert tags[names.TAG_DTYPE] in ("float32", "bfloat16")
    assert tags[names.TAG_CHECKPOINT] == str(tmp_path / "checkpoint") and tags[names.TAG_METHOD] == "user_sid"


def test_eval_cache_key_follows_rerank_candidates(tmp_path):
    """A retrained SASRec (other top-100) must not reuse a cached re-rank evaluation."""
    from workbench.study import model_evals
    from workbench.config import StudyConfig

    cfg = StudyConfig(name="k", dataset={"name": "ml-100k"})
    users = np.arange(3)
    a = model_evals.key(cfg, tmp_path, users, [[1, 2], [3], [4]])
    assert a == model_evals.key(cfg, tmp_path, users, [[1, 2], [3], [4]])
    assert a != model_evals.key(cfg, tmp_path, users, [[2, 1], [3], [4]])
    assert a != model_evals.key(cfg, tmp_path, users, None)


def test_sasrec_init_gives_unit_scale_inputs_and_logits():
    """Regression: N(0, 1) item rows x sqrt(hidden) made inputs of std ~8 and initial logits of std ~8
    (near one-hot softmax at step 0); SASRec then trained to valid NDCG@10 0.03 on ML-100K (0.11 fixed)."""
    import torch

    from workbench.study.baselines import _pad_left, build_sasrec

    st = SasrecSettings(max_len=10, hidden=64, dropout=0.0)
    torch.manual_seed(0)
    model = build_sasrec(500, st).eval()
    assert float((model.item.weight[1:].detach() * st.hidden**0.5).std()) < 1.5
    assert float(model.item.weight[0].detach().abs().max()) == 0.0  # padding row
    with torch.no_grad():
        x = torch.from_numpy(_pad_left([list(range(1, 9)), [3, 4]], 10))
        logits = model.logits(model(x)[:, -1])
    assert float(logits.std()) < 2.0


def _soft_token_training(out, log_fn=None, **settings):
    """A small soft_token training run (3 epochs); returns (TrainResult, model)."""
    from workbench.config import ModelConfig
    from workbench.model.backbone import build_backbone
    from workbench.study.prompts import PromptBuilder, eval_examples
    from workbench.study.train import TrainSettings, train_model
    from workbench.study.windows import WindowBuilder

    data, codes, enc, texts = synthetic()
    cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
                      max_position_embeddings=128, bpe_vocab_size=300)
    st = TrainSettings(**{**dict(epochs=3, batch_targets=64, lr=5e-3, patience=5, seed=0, progress=False, bf16=False),
                          **settings})
    bb = build_backbone(cfg, texts, (4, 4, 3), 1, (4, 1), seed=0)
    b = PromptBuilder("soft_token", bb.layout, bb.layout.item_codes_to_ids(codes), recent_k=3, long_m=5,
                      max_prompt_tokens=120)
    wb = WindowBuilder(b, max_tokens=120)
    va = eval_examples(b, data, "valid", enc, users=np.arange(24))
    res = train_model(bb, lambda rng: wb.epoch(data.train, enc, rng), va, codes, out, st, user_dim=N_CLUSTERS,
                      log_fn=log_fn)
    return res, bb.model


def _assert_same_training(full, model_full, resumed, model_resumed):
    import torch

    assert resumed.steps == full.steps and resumed.epochs_run == full.epochs_run == 3
    assert [h.get("train_loss") for h in resumed.history] == [h.get("train_loss") for h in full.history]
    assert [h.get(names.VALID_NDCG10) for h in resumed.history] == [h.get(names.VALID_NDCG10) for h in full.history]
    assert resumed.train_tokens == full.train_tokens and resumed.flops == full.flops
    for (name, a), b in zip(model_full.state_dict().items(), model_resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_training_resumes_after_an_interrupt_exactly(tmp_path, one_torch_thread):
    """Interrupted after epoch 1 (a KeyboardInterrupt, as a SIGTERM becomes one), the same call resumes from
    `resume.pt` and ends with the weights and history of the uninterrupted run: same ops in the same order on
    one thread, so equality is exact."""
    from workbench.cache import RESUME_FILE

    full, model_full = _soft_token_training(tmp_path / "full", save_every_s=0)
    epochs_seen = []

    def stop_in_epoch_2(metrics, step):
        if names.TRAIN_EPOCH_LOSS in metrics:
            epochs_seen.append(step)
            if len(epochs_seen) == 2:  # epoch 2 trained, not yet saved: it is redone after the resume
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _soft_token_training(tmp_path / "cut", stop_in_epoch_2, save_every_s=0)
    assert (tmp_path / "cut" / RESUME_FILE).exists()
    resumed, model_resumed = _soft_token_training(tmp_path / "cut", save_every_s=0)
    assert not (tmp_path / "cut" / RESUME_FILE).exists()  # removed once the checkpoint is saved
    _assert_same_training(full, model_full, resumed, model_resumed)


@pytest.mark.parametrize("epoch", [1, 2])
def test_training_resumes_inside_an_epoch_exactly(tmp_path, one_torch_thread, monkeypatch, epoch):
    """Killed a few batches after a save inside epoch `epoch` (the end of a session mid-epoch), the run resumes
    from that save: the epoch's windows and batches drawn again from the saved RNG state, the batches done
    before the save skipped, the ones after it redone; weights, losses, validation and counters end as in the
    uninterrupted run. epoch 1 covers the windows drawn before the loop, 2 those drawn in it."""
    from workbench.study import train as train_mod

    full, model_full = _soft_token_training(tmp_path / "full", save_every_s=0)
    per_epoch = full.steps // 3
    assert per_epoch >= 4, "the test needs a few batches per epoch"
    real_save, calls, kept = train_mod.save_state, {"backward": 0}, []

    def save_first_mid_of_epoch(path, state):
        mid = state["mid"]
        if mid is None:  # the end of an epoch
            real_save(path, state)
        elif state["epoch"] == epoch - 1 and mid["batches_done"] == 2 and not kept:
            kept.append(mid)
            real_save(path, state)  # every other save inside an epoch is skipped: the kill comes later

    real_backward = train_mod._Step.backward

    def killed_later(self, *a, **k):
        calls["backward"] += 1
        if calls["backward"] == (epoch - 1) * per_epoch + 4:  # 2 batches after the kept save: redone
            raise KeyboardInterrupt
        return real_backward(self, *a, **k)

    monkeypatch.setattr(train_mod, "save_state", save_first_mid_of_epoch)
    monkeypatch.setattr(train_mod._Step, "backward", killed_later)
    with pytest.raises(KeyboardInterrupt):
        _soft_token_training(tmp_path / "cut", save_every_s=1e-9)  # a save after every batch
    assert len(kept) == 1
    monkeypatch.setattr(train_mod._Step, "backward", real_backward)
    resumed, model_resumed = _soft_token_training(tmp_path / "cut", save_every_s=1e-9)
    _assert_same_training(full, model_full, resumed, model_resumed)


def test_bf16_auto_is_the_cpus_choice_unless_bf16_is_clearly_slower():
    """Near-equal step times (the quickstart's small models) must not flip the dtype between runs: bf16 on a CPU
    with bf16 instructions unless its step is BF16_SLOWER_LIMIT (1.2x) float32's or slower."""
    from workbench.study.train import BF16_SLOWER_LIMIT, bf16_from_timings

    assert bf16_from_timings(1.0, 0.5) and bf16_from_timings(1.0, 1.0) and bf16_from_timings(1.0, 1.1)
    assert not bf16_from_timings(1.0, BF16_SLOWER_LIMIT) and not bf16_from_timings(1.0, 2.0)


def test_bf16_auto_on_a_cuda_device_is_bf16_without_timing_a_step():
    """On a CUDA device `bf16: auto` is bf16 (hardware.auto_dtype's rule), decided without timing steps (their
    kernels run asynchronously: a CPU clock around them times the launch). Fault: the CUDA branch removed -> the
    step is timed -> the stand-in step raises."""
    from workbench.study.train import choose_bf16

    class Untimed:
        device = "cuda:0"

        def loss(self, *a):
            raise AssertionError("a step was timed on a CUDA device")

    use, info = choose_bf16("auto", Untimed(), None, None)
    assert use is True and "CUDA" in info["bf16_reason"]
    assert choose_bf16(False, Untimed(), None, None)[0] is False  # an explicit setting stays as it is
