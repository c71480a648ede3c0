"""The torch engine's per-step work that a GPU would wait on, checked on the CPU: the decoding set's padded prompt
KV kept from step to step (only newcomers copied in), and the log-softmax dtype per device.

The padded prompt KV must be exactly what `pad_prompt_kv` builds for the same requests, whatever the order of
changes (requests leaving from the front or the middle, joining at the back, a longer prompt moving Pmax to the
next bucket), so no result changes; the parity suite (test_engine_parity.py) checks the results themselves.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from workbench.engines.torch.model import logprob_dtype  # noqa: E402
from workbench.engines.torch.segments import PROMPT_KV_BUCKET, KVLayout, PromptKVBuffer, pad_prompt_kv  # noqa: E402

KV = KVLayout(n_layers=2, n_kv=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"))


def _prompts(lengths: dict[str, int]) -> dict[str, list]:
    g = torch.Generator().manual_seed(0)
    def kv(n: int):
        return torch.randn(KV.n_kv, n, KV.head_dim, generator=g)

    return {name: [(kv(n), kv(n)) for _ in range(KV.n_layers)] for name, n in lengths.items()}


# (the decoding set after a step, what the buffer may do: "view" = survivors viewed, newcomers copied; "rebuild")
STEPS = [
    (["a", "b", "c"], "rebuild"),  # first set
    (["a", "b", "c"], "view"),  # unchanged
    (["b", "c", "d"], "view"),  # the oldest finished, one joined
    (["c", "d", "e"], "view"),
    (["c", "e", "f"], "rebuild"),  # d left from the middle
    (["e", "f", "g"], "view"),
    (["e", "f", "g", "long"], "rebuild"),  # a prompt past the bucket: Pmax grows
    (["long"], "view"),
    (["h"], "rebuild"),  # the long one gone: Pmax shrinks back (the same reduction length as pad_prompt_kv's)
    (["h", "i", "j"], "rebuild"),  # two newcomers, one spare row: no room
]


def test_prompt_kv_buffer_is_pad_prompt_kv_with_fewer_copies():
    lengths = {name: 5 + 3 * i for i, name in enumerate("abcdefghij")} | {"long": PROMPT_KV_BUCKET + 9}
    prompts = _prompts(lengths)
    buf = PromptKVBuffer(KV)
    prev: list[str] = []
    for keys, kind in STEPS:
        rebuilds, copied = buf.rebuilds, buf.rows_copied
        got, lens = buf.get(keys, [prompts[k] for k in keys], [lengths[k] for k in keys])
        want_lens = torch.as_tensor([lengths[k] for k in keys])
        want = pad_prompt_kv([prompts[k] for k in keys], want_lens, KV)
        assert torch.equal(lens, want_lens)
        for (gk, gv), (wk, wv) in zip(got, want):
            assert gk.shape == wk.shape and gk.is_contiguous() and gv.is_contiguous(), keys
            assert torch.equal(gk, wk) and torch.equal(gv, wv), keys
        if kind == "view":
            assert buf.rebuilds == rebuilds, f"{keys}: rebuilt where the survivors could be viewed"
            assert buf.rows_copied - copied == len(set(keys) - set(prev)), f"{keys}: only newcomers are copied in"
        else:
            assert buf.rebuilds == rebuilds + 1, keys
        prev = keys
    buf.clear()
    assert buf.buf is None and buf.keys == []


@pytest.mark.parametrize("device,dtype,want", [
    ("cpu", torch.float32, torch.float64), ("cpu", torch.bfloat16, torch.float64),
    ("cuda", torch.bfloat16, torch.float32), ("cuda:1", torch.float32, torch.float32),
    ("cuda", torch.float64, torch.float64),
])
def test_log_softmax_dtype_per_device(device, dtype, want):
    """float64 on the CPU (results as recorded), float32 on a GPU (model.logprob_dtype says why), float64 for a
    float64 model anywhere."""
    assert logprob_dtype(device, dtype) == want


def test_cpu_engine_log_probs_stay_float64(tmp_path):
    from workbench.engines.registry import create_engine
    from workbench.testing import make_random_checkpoint

    eng = create_engine("torch", make_random_checkpoint(tmp_path / "ck", n_items=20, levels=(4, 4)))
    try:
        h = torch.randn(3, eng.lm.hidden)
        assert eng.lm.log_probs(h).dtype == torch.float64
    finally:
        eng.shutdown()


def test_float32_log_probs_run_every_path_within_the_bound(tmp_path):
    """The GPU's float32 log-softmax, forced on the CPU: beam search (plain, constrained with bans), sequence and
    label scoring all run (no float64/float32 mix-up in the selection or the score sums) and agree with the
    float64 engine within the derived float32 bound of the parity suite."""
    import asyncio

    import numpy as np

    from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest
    from workbench.engines.numerics import engine_bound
    from workbench.engines.registry import create_engine
    from workbench.testing import make_random_checkpoint

    ck = make_random_checkpoint(tmp_path / "ck", n_items=60, levels=(4, 4), soft_token=False)
    rng = np.random.default_rng(0)
    prompts = [Prompt.of(rng.integers(2, 300, size=n)) for n in (9, 17)]
    cands = tuple((300 + i % 4, 304 + i % 4, 308) for i in range(6))
    reqs = [BeamSearchRequest(prompts[0], 4, 3),
            BeamSearchRequest(prompts[1], 4, 3, constrained=True, banned_items=(1, 2))]
    scores = [ScoreRequest(prompts[0], cands), ScoreRequest(prompts[1], cands, mode="label", label_token_ids=(5, 6))]
    out = {}
    for dt in (torch.float64, torch.float32):
        eng = create_engine("torch", ck)
        eng.lm.logprob_dtype = dt
        try:
            beams = asyncio.run(eng.beam_search(reqs))
            scored = asyncio.run(eng.score(scores))
            bound = engine_bound(eng, prompts, 3)
        finally:
            eng.shutdown()
        assert all(r.success for r in beams + scored), [r.error for r in beams + scored]
        out[dt] = (beams, scored)
    (b64, s64), (b32, s32) = out[torch.float64], out[torch.float32]
    for x, y in zip(b64, b32):
        assert np.abs(np.array([b.cum_logprob for b in x.beams]) - [b.cum_logprob for b in y.beams]).max() < bound
    for x, y in zip(s64, s32):
        assert np.abs(np.asarray(x.scores) - np.asarray(y.scores)).max() < bound
