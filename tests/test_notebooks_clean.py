"""Every committed notebook starts with its parameters cell and carries no outputs (the tests execute them)."""

from __future__ import annotations

import nbformat
import pytest

from workbench.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
# the parameter each notebook's last cell writes its recorded values to (asserted by its own test)
RESULTS_PARAMETER = {"01": "stats_path", "02": "results_json", "03": "results_path", "04": "results_json", "05": "results_json"}


def test_all_five_notebooks_exist():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_is_clean(path):
    nb = nbformat.read(path, as_version=4)
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert "parameters" in first_code.metadata.get("tags", []), "the first code cell must be the parameters cell"
    assert RESULTS_PARAMETER[path.name[:2]] in first_code.source, "the parameters cell names where results go"
    for c in nb.cells:
        if c.cell_type == "code":
            assert not c.outputs and c.execution_count is None, "commit the notebook without outputs"
