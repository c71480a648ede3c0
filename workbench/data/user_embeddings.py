"""User embeddings a researcher brings (user id -> vector, optionally `as_of`), validated, and the as-of rule.

The vectors a production recommender already has are what a soft token projects. Reading them:
- one dimension for every vector, every value finite: otherwise a DataError with the counts and the first row;
- vectors of users the dataset does not have are dropped (counted); users without a vector get the
  documented default, a zero vector (counted: `coverage` in the report);
- without `as_of`, one row per user, and the vector may have been computed from interactions after the ones a
  model predicts: accepted, the run is marked "may include the test period" (`LEAKAGE_TAG`) and one warning
  is printed;
- with `as_of` (a timestamp per row, like the interactions'), a prompt uses the latest vector strictly
  before the prompt's last interaction (`UserEmbeddings.before`); none that early: the zero vector.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import names
from workbench.data.files import Column, DataError, existing, parse_timestamps, read_table, table_format

MAY_INCLUDE_TEST = "may include the test period"  # the run's mark without as_of
AS_OF_RULE = "as_of: the latest vector strictly before the prompt's last interaction"
KEY = "dataset.user_embeddings"
_NUMBER_SEP = re.compile(r"[\s,;]+")


def read_user_embeddings(section, users: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The normalized `user_embeddings` table (`user`, `vector`[, `as_of`]) for `users` (the id map), and a report."""
    path = existing(section.path, KEY)
    ucol, vcol = Column(section.user, f"{KEY}.user", is_id=True), Column(section.vector, f"{KEY}.vector")
    tcol = Column(section.as_of, f"{KEY}.as_of") if section.as_of else None
    df = read_table(path, table_format(path, section.format, KEY), [ucol, vcol, *([tcol] if tcol else [])],
                    "user embeddings")
    ids = df[ucol.name].astype(str).str.strip()
    vectors = [_vector(v, path, r) for r, v in enumerate(df[vcol.name])]
    dims = pd.Series([len(v) for v in vectors])
    if dims.nunique() > 1:
        counts = dims.value_counts()
        odd = int(np.flatnonzero(dims.to_numpy() != counts.index[0])[0])
        shown = ", ".join(f"{d} in {n} rows" for d, n in counts.items())
        raise DataError(f"{path}: user embeddings of mixed dimension ({shown}; first odd one: row {odd + 1}, user "
                        f"{ids[odd]!r}); every vector must have the same length")
    mat = np.asarray(vectors, dtype=np.float64)
    if mat.ndim != 2 or mat.shape[1] == 0:
        raise DataError(f"{path}: the user embeddings are empty vectors; {KEY}.vector must name a list of numbers")
    bad = ~np.isfinite(mat).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path}: {int(bad.sum())} user embeddings hold NaN or infinite values (first: row {row + 1}, "
                        f"user {ids[row]!r}); fix or leave out those rows")
    out = pd.DataFrame({"raw": ids, names.VECTOR: list(mat.astype(np.float32))})
    if tcol is not None:
        out[names.AS_OF] = parse_timestamps(df[tcol.name], section.timestamp_unit, path, tcol)[0]
    dup = out.duplicated(["raw"] + ([names.AS_OF] if tcol else []))
    if dup.any():
        row = int(np.flatnonzero(dup.to_numpy())[0])
        what = "the same user and as_of" if tcol else "the same user and no as_of column to tell them apart"
        raise DataError(f"{path}: {int(dup.sum())} rows repeat {what} (first: row {row + 1}, user {ids[row]!r}); "
                        f"keep one vector per user{' and as_of' if tcol else ', or name the as_of column'}")
    index = pd.Series(users[names.USER].to_numpy(), index=users[names.RAW_USER].astype(str).to_numpy())
    known = out["raw"].isin(index.index)
    out = out[known.to_numpy()].reset_index(drop=True)
    out.insert(0, names.USER, index.loc[out.pop("raw").to_numpy()].to_numpy(np.int64))
    out = out.sort_values([names.USER] + ([names.AS_OF] if tcol else []), kind="stable").reset_index(drop=True)
    covered = out[names.USER].nunique()
    report = {"dim": int(mat.shape[1]), "rows": len(df), "unknown_users_dropped": int((~known).sum()),
              "users_with": int(covered), "users_without": int(len(users) - covered),
              "as_of": bool(tcol), "mark": AS_OF_RULE if tcol else MAY_INCLUDE_TEST, "default": "zero vector"}
    return out, report


def _vector(value, path: Path, row: int) -> list[float]:
    """A list (parquet, JSON) or a string of numbers separated by commas or spaces, maybe bracketed (CSV)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        try:
            return [float(x) for x in value]
        except (TypeError, ValueError):
            pass
    elif isinstance(value, str):
        parts = [p for p in _NUMBER_SEP.split(value.strip().strip("[]()")) if p]
        try:
            return [float(p) for p in parts]
        except ValueError:
            pass
    raise DataError(f"{path}: row {row + 1}: the user embedding {str(value)[:60]!r} is not a list of numbers "
                    f"({KEY}.vector)")


@dataclass
class UserEmbeddings:
    """The table as arrays, for lookups: rows sorted by (user, as_of)."""

    users: np.ndarray  # [rows] int
    vectors: np.ndarray  # [rows, dim] float32
    as_of: np.ndarray | None  # [rows] int seconds, None: one row per user
    n_users: int

    @classmethod
    def from_table(cls, table: pd.DataFrame, n_users: int) -> "UserEmbeddings":
        vec = np.stack(table[names.VECTOR].to_numpy()).astype(np.float32) if len(table) else np.zeros((0, 0))
        as_of = table[names.AS_OF].to_numpy(np.int64) if names.AS_OF in table else None
        return cls(table[names.USER].to_numpy(np.int64), vec, as_of, n_users)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def mark(self) -> str:
        return AS_OF_RULE if self.as_of is not None else MAY_INCLUDE_TEST

    def before(self, users: np.ndarray, last_ts: np.ndarray) -> np.ndarray:
        """[n, dim]: per prompt, the vector of `users[k]` whose `as_of` is the latest strictly before `last_ts[k]`
        (the prompt's last interaction); without as_of, the user's one vector; none: the zero vector."""
        users = np.asarray(users, dtype=np.int64)
        out = np.zeros((len(users), self.dim), dtype=np.float32)
        lo = np.searchsorted(self.users, users, side="left")
        hi = np.searchsorted(self.users, users, side="right")
        if self.as_of is None:
            has = hi > lo
            out[has] = self.vectors[lo[has]]
            return out
        for k, (a, b) in enumerate(zip(lo, hi)):
            j = a + int(np.searchsorted(self.as_of[a:b], last_ts[k], side="left")) - 1  # last as_of < last_ts
            if j >= a:
                out[k] = self.vectors[j]
        return out
