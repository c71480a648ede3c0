"""RecBole atomic files (`.inter`, `.item`, `.user`): tab-separated, a `name:type` header, no quoting."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd


def read_atomic(path: Path) -> pd.DataFrame:
    """A RecBole atomic file: tab-separated, header `name:type`, no quoting, maybe CRLF."""
    df = pd.read_csv(
        path, sep="\t", dtype=str, quoting=csv.QUOTE_NONE, keep_default_na=False, encoding="utf-8", engine="c"
    )
    df.columns = [c.split(":", 1)[0].strip() for c in df.columns]
    for c in df.columns:
        df[c] = df[c].str.strip()  # CRLF leaves '\r' on the last column
    return df
