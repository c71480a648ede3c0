"""The package layout is the data flow: `lint-imports` checks the contracts in pyproject.toml.

Every layer (cli > report > perf > load > study > engines > model > sids > data > frame) may import
only the layers below it, lazy imports inside functions included; nothing in the package imports
`workbench.testing`; inside study/ the runner calls the stages and the stages call the parts, no stage
imports another, and the other layers read a study only through `workbench.study.outputs`. A broken
contract prints the offending import chain.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "lint-imports missing: pip install -e '.[test]' (import-linter)"
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_public_face_contract_names_every_study_module():
    """The contract that keeps the other layers on `workbench.study.outputs` forbids every other study module: a
    module added to study/ without joining the list would be open to them."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (face,) = [c for c in contracts if "workbench.study.outputs" in c["name"]]
    study = ROOT / "workbench" / "study"
    modules = {p.stem for p in study.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in study.glob("*/__init__.py")}
    assert {m.removeprefix("workbench.study.") for m in face["forbidden_modules"]} == modules - {"outputs"}
