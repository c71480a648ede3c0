"""The GPU engines' first real run as one command: host checks, parity per feature, one small load
sweep per engine, and a table that says what works (driven by scripts/validate_gpu_engines.sh).

    python -m workbench.load.gpu_validation host vllm sglang trtllm      # what this host lacks
    python -m workbench.load.gpu_validation run sglang --checkpoint CK --out DIR [--dry-run]
    python -m workbench.load.gpu_validation table DIR vllm sglang trtllm # exit 0 only if all is well

Why the checks: every GPU environment here pulls CUDA 13 builds (torch cu130, sglang-kernel,
flashinfer cu13, TensorRT-LLM 1.3), which need an NVIDIA driver >= 580 or the `cuda-compat` package
(CUDA forward compatibility); the sglang wheel is manylinux_2_34 (glibc >= 2.34); TensorRT-LLM wants
Python 3.10 or 3.12, MPI (`libopenmpi-dev`), `CUDA_HOME` and NVIDIA's own package index (its registry
entry is a stub that fetches the wheel from there). A missing piece is named with how to get it,
before an hour of installs fails halfway.

"Everything that should work": a parity case passes unless the engine declares the feature
unsupported (then it is skipped, with the reason); the load sweep finishes with a saturation rate.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ENGINES = ("vllm", "sglang", "trtllm")
GPU_DTYPE = "bfloat16"  # FlashInfer (SGLang MIS) and TRT-LLM encode have no float32 attention
MIN_DRIVER = 580  # CUDA 13 user-space; older drivers need cuda-compat
MIN_GLIBC = (2, 34)  # sglang-0.5.23-...-manylinux_2_34_x86_64.whl
MIN_FREE_GPU_GIB = 16.0  # server + scoring layer + KV cache of a small checkpoint, with room
MIN_FREE_DISK_GIB = 60.0  # the three environments take ~15-25 GB each
PYTHONS = {"vllm": ("3.11", "3.12"), "sglang": ("3.11", "3.12"), "trtllm": ("3.12", "3.10")}
FEATURE_CASES = ("beam_search", "beam_search_constrained", "beam_search_soft_token", "score_sequence",
                 "score_label", "score_sequence_soft_token", "score_label_soft_token")


@dataclass
class Check:
    name: str
    status: str  # ok | missing | warn
    detail: str
    needed_by: tuple[str, ...] = ENGINES


def _run(argv: list[str], timeout: float = 20.0) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _gpus() -> list[dict]:
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.free",
                "--format=csv,noheader,nounits"])
    rows = []
    for line in (out or "").strip().splitlines():
        name, driver, total, free = (x.strip() for x in line.split(","))
        rows.append({"name": name, "driver": driver, "total_gib": float(total) / 1024, "free_gib": float(free) / 1024})
    return rows


def _cuda_compat() -> str | None:
    hits = sorted(glob.glob("/usr/local/cuda*/compat/libcuda.so*"))
    return hits[0] if hits else None


def _glibc() -> tuple[int, ...] | None:
    try:
        ver = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
        return tuple(int(x) for x in ver.split()[-1].split(".")[:2])
    except (ValueError, OSError, IndexError):
        return None


def _python(versions: tuple[str, ...]) -> str | None:
    for v in versions:
        exe = shutil.which(f"python{v}")
        if exe:
            return exe
    return None


def host_checks(engines=ENGINES, repo: Path = Path(".")) -> list[Check]:
    """What this host has and lacks for `engines` (nothing is installed or started)."""
    checks: list[Check] = []
    gpus = _gpus()
    if not gpus:
        checks.append(Check("gpu", "missing", "no GPU: `nvidia-smi` is absent or lists none (SGLang, TensorRT-LLM "
                            "and CUDA vLLM need an NVIDIA GPU; run this on a GPU host)"))
    else:
        g = gpus[0]
        checks.append(Check("gpu", "ok", f"{len(gpus)} x {g['name']}, {g['total_gib']:.0f} GiB"))
        major = int(g["driver"].split(".")[0])
        compat = _cuda_compat()
        if major >= MIN_DRIVER:
            checks.append(Check("driver", "ok", f"{g['driver']} (>= {MIN_DRIVER}: CUDA 13 builds run)"))
        elif compat:
            checks.append(Check("driver", "warn", f"{g['driver']} < {MIN_DRIVER}; CUDA 13 through cuda-compat ({compat}): "
                                "put its folder first on LD_LIBRARY_PATH"))
        else:
            checks.append(Check("driver", "missing", f"{g['driver']} < {MIN_DRIVER} and no cuda-compat: install driver "
                                f">= {MIN_DRIVER} or the cuda-compat-13-x package (CUDA forward compatibility)"))
        free = g["free_gib"]
        checks.append(Check("gpu_memory", "ok" if free >= MIN_FREE_GPU_GIB else "missing",
                            f"{free:.1f} GiB free (need >= {MIN_FREE_GPU_GIB:.0f}: stop other GPU jobs)"))
    gl = _glibc()
    checks.append(Check("glibc", "ok" if gl and gl >= MIN_GLIBC else "missing",
                        f"{'.'.join(map(str, gl)) if gl else 'unknown'} (sglang wheel is manylinux_2_34: need >= 2.34)",
                        ("sglang",)))
    for e in engines:
        exe = _python(PYTHONS[e])
        checks.append(Check(f"python_{e}", "ok" if exe else "missing",
                            f"{exe} " if exe else f"no python{' / python'.join(PYTHONS[e])} on PATH (apt-get install "
                            f"python{PYTHONS[e][0]}-venv, or use uv)", (e,)))
    if "trtllm" in engines:
        cuda_home = os.environ.get("CUDA_HOME")
        checks.append(Check("cuda_home", "ok" if cuda_home and Path(cuda_home).is_dir() else "missing",
                            cuda_home or "CUDA_HOME unset: TensorRT-LLM's install guide asks for the CUDA 13 toolkit "
                            "with CUDA_HOME set", ("trtllm",)))
        mpi = _run(["ldconfig", "-p"]) or ""
        checks.append(Check("openmpi", "ok" if "libmpi.so" in mpi else "missing",
                            "libmpi found" if "libmpi.so" in mpi else "no libmpi: apt-get install libopenmpi-dev",
                            ("trtllm",)))
        for var, what in (("TRTLLM_EXTRA_INDEX_URL", "NVIDIA's package index (TensorRT-LLM's install guide)"),
                          ("TORCH_CUDA_INDEX_URL", "PyTorch's CUDA 13.0 wheel index (torch 2.9.1 cu130)")):
            checks.append(Check(var.lower(), "ok" if os.environ.get(var) else "missing",
                                f"{var} set" if os.environ.get(var) else f"set {var} to {what}", ("trtllm",)))
    disk = shutil.disk_usage(repo if repo.exists() else Path("."))
    free_gib = disk.free / 2**30
    checks.append(Check("disk", "ok" if free_gib >= MIN_FREE_DISK_GIB else "warn",
                        f"{free_gib:.0f} GiB free under {repo.resolve()} (the environments take ~{MIN_FREE_DISK_GIB:.0f})"))
    return [c for c in checks if set(c.needed_by) & set(engines)]


def blocked_engines(checks: list[Check], engines=ENGINES) -> dict[str, list[str]]:
    """Engine -> the missing checks that stop it."""
    return {e: [c.name for c in checks if c.status == "missing" and e in c.needed_by] for e in engines}


def _host_cli(engines, out: Path | None) -> int:
    checks = host_checks(engines)
    print(f"host: {platform.node()}  {platform.platform()}")
    for c in checks:
        print(f"  [{c.status:7}] {c.name:24} {c.detail}")
    blocked = blocked_engines(checks, engines)
    for e, why in blocked.items():
        print(f"  {e}: {'ready to build' if not why else 'blocked by ' + ', '.join(why)}")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "host.json").write_text(json.dumps({"checks": [asdict(c) for c in checks], "blocked": blocked}, indent=1))
    return 1 if any(blocked.values()) else 0


# ---- one engine: parity per feature, then one small load sweep -------------------------------------------


def bench_config(engine: str, checkpoint: str, dtype: str = GPU_DTYPE) -> dict:
    """The small sweep behind the table's QPS column: beam search, every beam, a few rates."""
    return {"name": f"gpu_validation_{engine}",
            "engines": [{"name": engine, "dtype": dtype}],
            "load": {"workload": "beam_search", "checkpoints": [str(checkpoint)], "prompt_tokens": 256,
                     "beam_width": 8, "max_new_tokens": 4, "requests_per_rate": 40, "max_rates": 3,
                     "warmup_requests": 4, "unloaded_requests": 4, "time_cap_s": 60},
            "cost": {"hardware": "gpu", "usd_per_hour": 1.0, "reference_engine": engine}}


PARITY_DTYPES = ("float32", "bfloat16")


def run_engine(engine: str, checkpoint: str, out: Path, dtype: str = GPU_DTYPE, dry_run: bool = False,
               parity_dtypes: tuple[str, ...] = PARITY_DTYPES) -> dict:
    """Parity against the torch engine in each of `parity_dtypes`, then the sweep in `dtype`; writes
    out/<engine>.json and returns it.

    Two parity passes because their tolerances differ by four orders: float32 (bound ~1e-2 on these
    checkpoints) checks the adapters strictly on every path that runs in float32; bfloat16 (bound of tens of
    nats, numerics.py) is the only way to reach the paths that exist only in half precision (SGLang's MIS,
    TensorRT-LLM's packed encode), and catches only gross errors there."""
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"engine": engine, "dtype": dtype, "checkpoint": str(checkpoint)}
    if dry_run:
        result["dry_run"] = [f"workbench engines validate {engine} --checkpoint {checkpoint} --dtype {dt}"
                             for dt in parity_dtypes]
        result["dry_run"].append(f"workbench bench <{json.dumps(bench_config(engine, checkpoint, dtype))}>")
        for line in result["dry_run"]:
            print(f"  would run: {line}")
        (out / f"{engine}.json").write_text(json.dumps(result, indent=1))
        return result
    import asyncio

    from workbench.engines.parity import run_parity

    parity: dict = {}
    for dt in parity_dtypes:
        try:
            parity[dt] = asyncio.run(run_parity(engine, checkpoint, dtype=dt))
        except Exception as e:  # noqa: BLE001 - a launch failure is a result of this run, kept with its reason
            parity[dt] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    result["parity"] = parity
    result["parity_ok"] = all(p.get("ok") for p in parity.values())
    if result["parity_ok"]:
        from workbench.config import parse_config
        from workbench.load.bench import run_bench

        try:
            res = run_bench(parse_config(bench_config(engine, checkpoint, dtype), "gpu_validation", kind="sweep"),
                            progress=False)
            child = res.children[0]
            result["bench"] = {"ok": child.error is None and child.saturation_qps is not None,
                               "saturation_qps": child.saturation_qps, "unloaded_p50_ms": child.unloaded_p50_ms,
                               "error": child.error, "run_id": res.parent_run_id}
        except Exception as e:  # noqa: BLE001
            result["bench"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    else:
        result["bench"] = {"ok": False, "error": "not run: parity failed or the server did not start"}
    (out / f"{engine}.json").write_text(json.dumps(result, indent=1, default=str))
    return result


# ---- the table -------------------------------------------------------------------------------------------


DTYPE_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def _cell(case: dict | None) -> tuple[str, bool]:
    if case is None:
        return "-", False
    st = case["status"]
    if st == "passed":
        return f"pass ({case.get('max_abs_diff') or 0:.1e})", True
    if st == "skipped":
        return "unsupported", True
    return "FAIL", False


def _cells(parity: dict, name: str) -> tuple[str, bool]:
    """One feature's cell over the parity passes, e.g. "f32 pass (3.1e-06); bf16 pass (1.2e-01)"."""
    parts, good = [], True
    for dt, rep in parity.items():
        cell, ok = _cell({c["name"]: c for c in rep.get("cases", [])}.get(name))
        parts.append(f"{DTYPE_SHORT.get(dt, dt)} {cell}")
        good &= ok
    return ("; ".join(parts) or "-"), good and bool(parity)


def table(out: Path, engines=ENGINES) -> tuple[str, bool]:
    """Markdown table engine x (environment, parity case, load sweep) from out/*.json; ok = all that
    should work works."""
    header = ["engine", "environment", *FEATURE_CASES, "bench QPS"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    all_ok = True
    host = json.loads((out / "host.json").read_text()) if (out / "host.json").exists() else {}
    for e in engines:
        env = json.loads((out / f"env_{e}.json").read_text()) if (out / f"env_{e}.json").exists() else {}
        res = json.loads((out / f"{e}.json").read_text()) if (out / f"{e}.json").exists() else {}
        blocked = host.get("blocked", {}).get(e)
        if res.get("dry_run") or env.get("status") == "dry-run":
            row = [e, "dry run"] + ["not run"] * (len(FEATURE_CASES) + 1)
            lines.append("| " + " | ".join(row) + " |")
            all_ok = False
            continue
        if blocked:
            env_cell = "host lacks " + ", ".join(blocked)
        else:
            env_cell = env.get("status", "not built")
        parity = res.get("parity", {})
        cells, ok = [], env.get("status") in ("built", "present") and bool(res.get("parity_ok"))
        for name in FEATURE_CASES:
            cell, good = _cells(parity, name)
            cells.append(cell)
            ok &= good
        bench = res.get("bench", {})
        qps = bench.get("saturation_qps")
        cells.append(f"{qps:.1f}" if isinstance(qps, (int, float)) else ("FAIL" if res else "-"))
        ok &= bool(bench.get("ok"))
        for dt, rep in parity.items():
            if rep.get("error"):
                env_cell += f" ({DTYPE_SHORT.get(dt, dt)} server: {rep['error'][:80]})"
        lines.append("| " + " | ".join([e, env_cell, *cells]) + " |")
        all_ok &= ok
    return "\n".join(lines), all_ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.load.gpu_validation")
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("host")
    h.add_argument("engines", nargs="*", default=list(ENGINES))
    h.add_argument("--out", type=Path, default=None)
    r = sub.add_parser("run")
    r.add_argument("engine", choices=ENGINES)
    r.add_argument("--checkpoint", required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--dtype", default=GPU_DTYPE, choices=["bfloat16", "float16", "float32"],
                   help="the load sweep's dtype (parity runs in float32 and bfloat16)")
    r.add_argument("--dry-run", action="store_true")
    t = sub.add_parser("table")
    t.add_argument("out", type=Path)
    t.add_argument("engines", nargs="*", default=list(ENGINES))
    a = p.parse_args(argv)
    if a.cmd == "host":
        return _host_cli(a.engines, a.out)
    if a.cmd == "run":
        res = run_engine(a.engine, a.checkpoint, a.out, a.dtype, a.dry_run)
        return 0 if a.dry_run or (res.get("parity_ok") and res.get("bench", {}).get("ok")) else 1
    md, ok = table(a.out, a.engines)
    print(md)
    (a.out / "table.md").write_text(md + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
