"""Time-ordered leave-one-out split: per user, last item = test, second-to-last = valid, rest = train.

Order is by timestamp, and equal timestamps (about half the MovieLens rows share a (user,
timestamp) with another row) keep the source file's row order: a stable sort, so the split is
the same on every run and machine. `max_history` (None by default: keep everything) keeps only the
most recent train items per user; valid and test never change with it.

Invariants the tests hold: every user with >= 3 interactions has exactly one valid and one test
row; a user's train rows are strictly before their valid row, which is before their test row (in
the stable order); no train row equals that user's valid or test interaction (the same item may
appear again in train only if the user rated it twice, which MovieLens does not do).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import names

POSITION = "position"  # 0-based index of the row in the user's stable time order


@dataclass
class Split:
    """Train rows (time-ordered per user, truncated) and one valid and one test row per user."""

    train: pd.DataFrame  # user, item, timestamp, rating, position; sorted by (user, position)
    valid: pd.DataFrame  # one row per user
    test: pd.DataFrame  # one row per user
    n_users: int
    n_items: int
    max_history: int | None

    def train_sequences(self, column: str = names.ITEM) -> list[np.ndarray]:
        """Per user (index = user id), the train items in time order (already truncated); `column`: another
        column of the same rows (`train_times`)."""
        users = self.train[names.USER].to_numpy()
        values = self.train[column].to_numpy()
        bounds = np.searchsorted(users, np.arange(self.n_users + 1))
        return [values[bounds[u] : bounds[u + 1]] for u in range(self.n_users)]

    def train_times(self) -> list[np.ndarray]:
        """Per user, the timestamps (int seconds) of `train_sequences()`, element for element."""
        return [t.astype(np.int64) for t in self.train_sequences(names.TIMESTAMP)]

    def valid_items(self) -> np.ndarray:
        return self._per_user(self.valid)

    def test_items(self) -> np.ndarray:
        return self._per_user(self.test)

    def valid_times(self) -> np.ndarray:
        return self._per_user(self.valid, names.TIMESTAMP)

    def test_times(self) -> np.ndarray:
        return self._per_user(self.test, names.TIMESTAMP)

    def _per_user(self, df: pd.DataFrame, column: str = names.ITEM) -> np.ndarray:
        out = np.full(self.n_users, -1, dtype=np.int64)
        out[df[names.USER].to_numpy()] = df[column].to_numpy()
        return out

    def stats(self) -> dict[str, float]:
        per_user = self.train.groupby(names.USER).size()
        train_items = set(self.train[names.ITEM].unique())
        return {
            "split/n_users": self.n_users,
            "split/n_train": len(self.train),
            "split/n_valid": len(self.valid),
            "split/n_test": len(self.test),
            "split/train_per_user_mean": float(per_user.mean()),
            "split/train_per_user_median": float(per_user.median()),
            "split/train_per_user_max": int(per_user.max()),
            "split/users_truncated": 0 if self.max_history is None else int((per_user >= self.max_history).sum()),
            "split/max_history": -1 if self.max_history is None else self.max_history,
            "split/test_item_cold_share": float(np.mean([i not in train_items for i in self.test[names.ITEM]])),
            "split/train_items": len(train_items),
        }

    # ---- parquet --------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for part in ("train", "valid", "test"):
            getattr(self, part).to_parquet(folder / f"{part}.parquet", index=False)

    @classmethod
    def load(cls, folder: Path, n_users: int, n_items: int, max_history: int | None) -> "Split":
        folder = Path(folder)
        parts = {p: pd.read_parquet(folder / f"{p}.parquet") for p in ("train", "valid", "test")}
        return cls(**parts, n_users=n_users, n_items=n_items, max_history=max_history)


def time_order(interactions: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by (user, timestamp), equal timestamps kept in input row order, plus `position`."""
    df = interactions.reset_index(drop=True)
    order = np.lexsort((np.arange(len(df)), df[names.TIMESTAMP].to_numpy(), df[names.USER].to_numpy()))
    df = df.iloc[order].reset_index(drop=True)
    df[POSITION] = df.groupby(names.USER).cumcount().astype(np.int64)
    return df


def leave_one_out(interactions: pd.DataFrame, n_users: int, n_items: int, max_history: int | None = None) -> Split:
    """Split per user by time: last -> test, second-to-last -> valid, the `max_history` before -> train.

    Every user needs >= 3 interactions (the dataset filter guarantees it); a user with fewer is
    an error, not a silent drop, so user ids stay aligned with the rest of the pipeline.
    """
    if max_history is not None and max_history < 1:
        raise ValueError(f"split.max_history must be >= 1, got {max_history}")
    df = time_order(interactions)
    count = df.groupby(names.USER)[names.ITEM].transform("size").to_numpy()
    if (count < 3).any():
        bad = df.loc[count < 3, names.USER].unique()[:5]
        raise ValueError(
            f"users {list(bad)} have fewer than 3 interactions; leave-one-out needs train/valid/test "
            "(raise dataset.min_user_interactions to >= 3)"
        )
    pos = df[POSITION].to_numpy()
    from_end = count - 1 - pos  # 0 = last
    test = df[from_end == 0].reset_index(drop=True)
    valid = df[from_end == 1].reset_index(drop=True)
    keep = (from_end >= 2) if max_history is None else (from_end >= 2) & (from_end < 2 + max_history)
    train = df[keep].reset_index(drop=True)
    missing = np.setdiff1d(np.arange(n_users), test[names.USER].to_numpy())
    if len(missing):
        raise ValueError(f"users {missing[:5].tolist()} have no interactions; the dataset ids are not dense")
    return Split(train=train, valid=valid, test=test, n_users=n_users, n_items=n_items, max_history=max_history)
