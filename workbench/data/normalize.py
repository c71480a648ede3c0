"""From a format's rows to the normalized tables (`tables.Dataset`): one path for every reader of files.

A format (`Format`, one per layout, registered in `readers.py`) says which column each role has by default and
how to read a file of that layout; `normalize` then does what is the same for all of them, in this order:
1. interactions: ids as strings, timestamps to int seconds (`files.parse_timestamps`), rating or 1.0; rows
   with sub-second times are put in time order first (stable), so equal seconds keep their true order;
2. duplicate (user, item, timestamp) rows are dropped (the first kept) and counted;
3. items: the first row of each id; interactions naming an item the items file lacks fail, or are dropped
   (`dataset.missing_items`), counted with the first examples; items nobody interacted with are left out;
4. the item's text: `title` (+ `year`) and the `text` columns' values, lists flattened, "|"-joined into
   `genres`; an item with none is counted and refused later when a text method needs it, or its text becomes
   its raw id (`dataset.items_without_text: fallback`);
5. users in natural order of their raw id (numeric suffix, then the id), items in the items file's order;
6. user features aligned to the users (numeric columns float, the others strings; unknown users None).
`report` holds every count, for `workbench data check` and the data stage's log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from workbench import names
from workbench.data.files import Column, DataError, parse_timestamps
from workbench.data.tables import Dataset, user_sort_key

ROLES = ("interactions", "items", "users")
EXAMPLES = 5  # ids shown in a message


@dataclass(frozen=True)
class Format:
    """One layout of dataset files: the default column of each config key, and how to read one of its files.

    `read(role, path, declared_format, columns, optional, what)` returns the file's columns as a frame,
    `names(role, path, declared_format, key)` the columns it has, and `kinds(path)` the feature kinds the file
    itself declares (RecBole's `name:type` header)."""

    name: str
    defaults: dict[str, dict[str, Any]]  # role -> config key -> column (None: no such column)
    read: Callable[..., pd.DataFrame]
    names: Callable[..., list[str]]
    kinds: Callable[[Path], dict[str, str]] | None = None
    about: str = ""


@dataclass
class Raw:
    """A dataset's files read by its format: frames named as in the files, and the columns of each role."""

    interactions: pd.DataFrame
    items: pd.DataFrame
    users: pd.DataFrame | None
    cols: dict[str, dict[str, Any]]  # role -> key -> Column (text: a tuple of Columns)
    paths: dict[str, Path]
    feature_kinds: dict[str, str] = field(default_factory=dict)  # feature -> numeric | categorical


def text_tokens(value) -> list[str]:
    """The words of one text cell: lists (of lists) flattened, "a|b" split (the join of `genres`), blanks dropped."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return []
    if isinstance(value, (list, tuple, np.ndarray)):
        return [t for v in value for t in text_tokens(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in text_tokens(v)]
    parts = (" ".join(p.split()) for p in str(value).split("|"))
    return [p for p in parts if p]


def _unique(tokens: list[str]) -> list[str]:
    return list(dict.fromkeys(tokens))


def normalize(name: str, raw: Raw, cfg) -> tuple[Dataset, dict]:
    """The normalized tables of `raw` under `cfg` (a `config.DatasetConfig`), and what was counted on the way."""
    ic, tc = raw.cols["interactions"], raw.cols["items"]
    path = raw.paths["interactions"]
    df = raw.interactions
    report: dict[str, Any] = {"format": cfg.format, "files": {k: str(v) for k, v in raw.paths.items()},
                              "rows_read": len(df)}
    users_raw = _ids(df[ic["user"].name], path, ic["user"], "user id")
    items_raw = _ids(df[ic["item"].name], path, ic["item"], "item id")
    sec, ns, unit = parse_timestamps(df[ic["timestamp"].name], cfg.interactions.timestamp_unit, path, ic["timestamp"])
    report["timestamp_unit"] = unit
    rating = _ratings(df, ic.get("rating"), path)
    inter = pd.DataFrame({"u": users_raw, "i": items_raw, "t": sec, "ns": ns, "r": rating})
    if (ns % 1_000_000_000 != 0).any():  # sub-second times: true order first, the split's ties are then right
        inter = inter.iloc[np.argsort(ns, kind="stable")].reset_index(drop=True)
    dup = inter.duplicated(["u", "i", "ns"])
    report["duplicates_dropped"] = int(dup.sum())
    inter = inter[~dup].reset_index(drop=True)

    items_df = raw.items
    ipath = raw.paths["items"]
    item_ids = _ids(items_df[tc["item"].name], ipath, tc["item"], "item id")
    first = ~item_ids.duplicated()
    report["items_file_rows"] = len(items_df)
    report["items_duplicate_rows"] = int((~first).sum())
    items_df, item_ids = items_df[first.to_numpy()].reset_index(drop=True), item_ids[first].reset_index(drop=True)
    known = pd.Index(item_ids)
    absent = ~inter["i"].isin(known)
    report["missing_items"] = {"interactions": int(absent.sum()), "items": int(inter.loc[absent, "i"].nunique()),
                               "action": cfg.missing_items}
    if absent.any():
        ex = list(dict.fromkeys(inter.loc[absent, "i"]))[:EXAMPLES]
        n_ids = inter.loc[absent, "i"].nunique()
        if cfg.missing_items == "fail":
            raise DataError(f"{path}: {int(absent.sum())} interactions name {n_ids} items that {ipath} does not "
                            f"list (first: {', '.join(map(repr, ex))}); add them to the items file, or set "
                            f"dataset.missing_items: drop to drop those interactions")
        inter = inter[~absent].reset_index(drop=True)
    if inter.empty:
        raise DataError(f"{path}: no interactions left once those naming unlisted items were dropped")
    used = item_ids.isin(set(inter["i"])).to_numpy()
    report["items_unused"] = int((~used).sum())
    items_df, item_ids = items_df[used].reset_index(drop=True), item_ids[used].reset_index(drop=True)
    items = _items(items_df, item_ids, tc, cfg, report)

    order = pd.DataFrame({"raw": pd.Series(inter["u"].unique(), dtype=object)})
    order["key"] = user_sort_key(order["raw"].astype(str))
    order = order.sort_values(["key", "raw"], kind="stable")
    users = pd.DataFrame({names.USER: np.arange(len(order), dtype=np.int64), names.RAW_USER: order["raw"].to_numpy()})
    uidx = pd.Series(users[names.USER].to_numpy(), index=users[names.RAW_USER].to_numpy())
    iidx = pd.Series(items[names.ITEM].to_numpy(), index=items[names.RAW_ITEM].to_numpy())
    interactions = pd.DataFrame({
        names.USER: uidx.loc[inter["u"].to_numpy()].to_numpy(np.int64),
        names.ITEM: iidx.loc[inter["i"].to_numpy()].to_numpy(np.int64),
        names.TIMESTAMP: inter["t"].to_numpy(np.int64),
        names.RATING: inter["r"].to_numpy(np.float32),
    })
    feats = None
    if raw.users is not None:
        kinds = {**raw.feature_kinds, **dict.fromkeys(cfg.users.categorical, "categorical")}
        feats = user_features(raw.users, raw.cols["users"], raw.paths["users"], users, kinds, report)
    return Dataset(name=name, interactions=interactions, items=items, users=users, user_features=feats), report


def _ids(s: pd.Series, path: Path, col: Column, what: str) -> pd.Series:
    bad = s.isna().to_numpy() | s.astype(str).str.strip().eq("").to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path}: row {row + 1} has no {what} ({bad.sum()} rows without one; column {col.name!r}, "
                        f"{col.key})")
    return s.astype(str).str.strip().reset_index(drop=True)


def _ratings(df: pd.DataFrame, col: Column | None, path: Path) -> np.ndarray:
    if col is None:
        return np.ones(len(df), dtype=np.float32)
    num = pd.to_numeric(df[col.name], errors="coerce")
    bad = num.isna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path}: row {row + 1}: rating {df[col.name].iloc[row]!r} is not a number (column "
                        f"{col.name!r}, {col.key}; leave the key out when the file has no rating)")
    return num.to_numpy(np.float32)


def _items(df: pd.DataFrame, ids: pd.Series, tc: dict, cfg, report: dict) -> pd.DataFrame:
    n = len(df)
    title = [" ".join(text_tokens(v)) for v in df[tc["title"].name]] if tc.get("title") else [""] * n
    year = pd.Series([pd.NA] * n, dtype="Int64")
    if tc.get("year"):
        year = pd.to_numeric(df[tc["year"].name], errors="coerce").round().astype("Int64")
    genres = ["|".join(_unique([t for c in tc["text"] for t in text_tokens(row)]))
              for row in zip(*(df[c.name] for c in tc["text"]))] if tc["text"] else [""] * n
    no_text = np.array([not t and not g for t, g in zip(title, genres)], dtype=bool)
    report["items_without_text"] = {"count": int(no_text.sum()), "examples": ids[no_text].head(EXAMPLES).tolist(),
                                    "action": cfg.items_without_text}
    if cfg.items_without_text == "fallback":
        title = [ids.iloc[k] if no_text[k] else t for k, t in enumerate(title)]
    return pd.DataFrame({names.ITEM: np.arange(n, dtype=np.int64), names.RAW_ITEM: ids.to_numpy(dtype=object),
                         names.TITLE: title, names.YEAR: year.to_numpy(), names.GENRES: genres}).astype(
        {names.YEAR: "Int64"})


def user_features(df: pd.DataFrame, uc: dict, path: Path, users: pd.DataFrame, kinds: dict[str, str],
                  report: dict) -> pd.DataFrame:
    """One row per user of `users` (row u is user u): numeric features as float, the others as strings (None where
    the user is not in the file). `kinds`: feature -> numeric | categorical where known (the file's declared
    types, `dataset.users.categorical`); any other feature is numeric when every value is a number."""
    ids = _ids(df[uc["user"].name], path, uc["user"], "user id")
    keep = ~ids.duplicated()
    df, ids = df[keep.to_numpy()].reset_index(drop=True), ids[keep].reset_index(drop=True)
    at = pd.Series(np.arange(len(ids)), index=ids.to_numpy())
    rows = at.reindex(users[names.RAW_USER].to_numpy())
    have = rows.notna().to_numpy()
    take = rows.fillna(0).to_numpy(np.int64)
    out = {names.USER: users[names.USER].to_numpy()}
    categorical = {f for f, k in kinds.items() if k == "categorical"}
    numeric, cats = [], []
    for c in uc["features"]:
        col = df[c.name].reset_index(drop=True)
        num = pd.to_numeric(col, errors="coerce")
        blank = col.isna() | col.astype(str).str.strip().eq("")
        is_num = c.name not in categorical and (kinds.get(c.name) == "numeric" or bool((num.notna() | blank).all()))
        if is_num:
            vals = num.to_numpy(np.float64)[take]
            vals[~have] = np.nan
            numeric.append(c.name)
        else:
            vals = np.array([None if b else str(v).strip() for v, b in zip(col, blank)], dtype=object)[take]
            vals[~have] = None
            cats.append(c.name)
        out[c.name] = vals
    report["user_features"] = {"numeric": numeric, "categorical": cats, "users_with": int(have.sum()),
                               "users_without": int((~have).sum()), "file_users_unused": int(len(ids) - have.sum())}
    return pd.DataFrame(out)
