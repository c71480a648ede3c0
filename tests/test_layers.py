"""The package layout is the data flow: `lint-imports` checks the contracts in pyproject.toml, and no import
circle exists anywhere in the package.

The contracts: every layer (cli > report > perf > load > study > engines > model > sids > data > frame) may
import only the layers below it, lazy imports inside functions included; nothing in the package imports
`workbench.testing`; inside engines/ the server and the parity suite sit above the engines (torch/, remote/,
hf_engine) and those above the registry, the workloads and the contract (base); inside torch/ the scheduler
is above the model, the model above its variants (fused, int8, onednn) and all of them above segments and
the layer pieces; inside remote/ the adapters are above their HTTP plumbing and that above the launcher;
nothing imports engines/in_trtllm/ (it runs in TensorRT-LLM's own environment); inside study/ the runner
calls the stages and the stages call the parts, no stage imports another, and the other layers read a study
only through `workbench.study.outputs`. A broken contract prints the offending import chain.

Contracts only constrain what they name, so two more checks cover the whole package: no module imports
itself back through any chain (`test_no_import_cycle`, with grimp, import-linter's own graph library), and
the in_trtllm contract lists every module outside in_trtllm as a source.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IN_TRTLLM = "workbench.engines.in_trtllm"


def test_import_contracts_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "lint-imports missing: pip install -e '.[test]' (import-linter)"
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_public_face_contract_names_every_study_module():
    """The contract that keeps the other layers on `workbench.study.outputs` forbids every other study module: a
    module added to study/ without joining the list would be open to them."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (face,) = [c for c in contracts if "workbench.study.outputs" in c["name"]]
    study = ROOT / "workbench" / "study"
    modules = {p.stem for p in study.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in study.glob("*/__init__.py")}
    assert {m.removeprefix("workbench.study.") for m in face["forbidden_modules"]} == modules - {"outputs"}


def _graph():
    import grimp

    # cache_dir=None: nothing written into the repo; lazy imports inside functions are edges too
    return grimp.build_graph("workbench", include_external_packages=False, cache_dir=None)


def _line(graph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    return f"{importer} -> {imported}" + (f" (l.{details[0]['line_number']})" if details else "")


def test_no_import_cycle():
    """For every direct import a -> b, no chain b -> ... -> a: a circle, even one held together by lazy imports,
    means the modules are one room drawn as several; the failure names every import of the circle."""
    graph = _graph()
    for a in sorted(graph.modules):
        for b in sorted(graph.find_modules_directly_imported_by(a)):
            back = graph.find_shortest_chain(importer=b, imported=a)
            if back:
                steps = [(a, b), *zip(back, back[1:])]
                circle = "\n  ".join(_line(graph, x, y) for x, y in steps)
                raise AssertionError(f"import cycle through {a}:\n  {circle}\nmove what both need into a module "
                                     "below them (as engines/torch/layers.py is below model.py and its variants)")


def test_in_trtllm_contract_names_every_other_module():
    """The forbidden contract's sources cover the whole package but in_trtllm (and the __init__ of the packages
    holding it, which import-linter cannot name apart from their children), so a new module is checked too."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [c for c in config["tool"]["importlinter"]["contracts"] if c.get("forbidden_modules") == [IN_TRTLLM]]
    sources = contract["source_modules"]
    holders = {IN_TRTLLM.rsplit(".", i)[0] for i in range(1, IN_TRTLLM.count(".") + 1)}  # workbench, .engines
    missing = sorted(m for m in _graph().modules if m not in holders and not m.startswith(IN_TRTLLM)
                     and not any(m == s or m.startswith(s + ".") for s in sources))
    assert not missing, f"add to the source_modules of {contract['name']!r} in pyproject.toml: {missing}"
