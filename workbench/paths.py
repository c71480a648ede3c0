"""Where things live on disk: the repo root, `data/` caches and the MLflow store.

`WORKBENCH_DATA_DIR` moves the data/cache folder (tests point it at a temporary folder).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    d = Path(os.environ.get("WORKBENCH_DATA_DIR", REPO_ROOT / "data"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def cache_dir(stage: str, key: str) -> Path:
    """`data/cache/<stage>/<key>/`: one folder per config hash of a stage."""
    d = data_dir() / "cache" / stage / key
    d.mkdir(parents=True, exist_ok=True)
    return d


def mlruns_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_MLRUNS_DIR", REPO_ROOT / "mlruns"))
