"""study/lm_loss.py: the chunked full-vocabulary loss equals F.cross_entropy over the kept logits."""

import pytest

torch = pytest.importorskip("torch")


def _case(n=700, hidden=48, vocab=530, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, hidden, generator=g), torch.randn(vocab, hidden, generator=g) * 0.2,
            torch.randint(0, vocab, (n,), generator=g))


def _grads(fn, h, w, t):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = fn(h, w, t)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _plain(dtype):
    import torch.nn.functional as F

    def fn(h, w, t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            logits = h @ w.T
        return F.cross_entropy(logits.float(), t)

    return fn


@pytest.mark.parametrize("fused", [False, True], ids=["chunked", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_and_gradients_equal_the_plain_path(monkeypatch, dtype, fused):
    """Bounds. float32: the two differ only in the order of float32 sums (log-sum-exp vs log-softmax, chunked vs
    whole matmuls), far under 1e-5 relative (~170 float32 roundings). bfloat16: the logits are the same bf16 matmul
    in both; the gradients go through bf16 in both, the chunked weight gradient as a float32 sum of per-chunk bf16
    products instead of one bf16 product, so an entry may differ by ~2 bf16 roundings (2 x 2^-8 of the largest
    entry): bound 2^-7 of the largest gradient entry; the loss by less than one bf16 rounding of the largest logit.
    `fused` (the chunk kernels compiled) computes the same function, so the same bounds hold. Fault: the fused
    gradient kernel without the -1 at the target -> failed."""
    from workbench.study import lm_loss

    monkeypatch.setattr(lm_loss, "CHUNK_ROWS", 128)  # 700 rows: five full chunks and a partial one
    h, w, t = _case()
    a = _grads(_plain(dtype), h, w, t)
    b = _grads(lambda h, w, t: lm_loss.chunked_lm_loss(h, w, t, dtype, fused), h, w, t)
    if dtype == torch.float32:
        assert abs(float(a[0] - b[0])) <= 1e-5 * abs(float(a[0]))
        for ga, gb in zip(a[1:], b[1:]):
            assert float((ga - gb).abs().max()) <= 1e-5 * float(ga.abs().max())
    else:
        logit_max = float((h @ w.T).abs().max())
        assert abs(float(a[0] - b[0])) <= 2**-8 * logit_max
        for ga, gb in zip(a[1:], b[1:]):
            assert float((ga - gb).abs().max()) <= 2**-7 * float(ga.abs().max())
    assert b[1].dtype == h.dtype and b[2].dtype == w.dtype


def test_a_training_step_with_either_loss_gives_the_same_loss():
    """The study's step (`_Step.forward`) with `training.loss: fused`, `chunked` and `full` on the same batch: the
    same loss within 1e-5 (float32)."""
    from tests.test_windows import _tiny_model, _windows
    from workbench.study.train import _Step

    model = _tiny_model()
    ws = _windows("text_history")
    kinds = ("fused", "chunked", "full")
    step = {kind: _Step(model, None, 0, model.config.vocab_size, loss=kind) for kind in kinds}
    losses = [float(step[kind].loss(ws, range(len(ws)), False)[0].detach()) for kind in kinds]
    assert all(abs(x - losses[-1]) <= 1e-5 * abs(losses[-1]) for x in losses)


def test_sasrec_chunked_loss_equals_its_full_softmax_loss():
    """SASRec's training loss (`baselines.sasrec_loss`): fused, chunked and full give the same mean over the positions
    with a target (padding, -1, left out by all) and the same gradients, within 1e-5 relative in float32 (the first
    test's bound). Fault: the padding rows kept in the chunked loss -> failed."""
    import numpy as np

    from workbench.study.baselines import SasrecSettings, build_sasrec, sasrec_loss

    torch.manual_seed(0)
    st = SasrecSettings(max_len=12, hidden=16, layers=1, heads=2, dropout=0.0)
    model = build_sasrec(40, st).eval()
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.integers(1, 41, (5, 12)))
    y = x.roll(-1, 1) - 1
    y[:, :4] = -1  # left padding: no target there
    got = []
    for kind in ("fused", "chunked", "full"):
        model.zero_grad(set_to_none=True)
        loss = sasrec_loss(model, x, y, kind)
        loss.backward()
        got.append((float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    b, gb = got[-1]
    for a, ga in got[:-1]:
        assert abs(a - b) <= 1e-5 * abs(b) and len(ga) == len(gb)
        for u, v in zip(ga, gb):
            assert float((u - v).abs().max()) <= 1e-5 * float(v.abs().max()) + 1e-12
