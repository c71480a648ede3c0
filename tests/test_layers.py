"""The package layout is the data flow: `lint-imports` checks the contracts in pyproject.toml.

Every layer (cli > report > perf > load > study > engines > model > sids > data > frame) may import
only the layers below it, lazy imports inside functions included; nothing in the package imports
`workbench.testing`; inside study/ the runner calls the stages and the stages call the parts. A
broken contract prints the offending import chain.
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
