"""RecBole atomic files (`.inter`, `.item`, `.user`): tab-separated, a `name:type` header, no quoting.

The format of RecBole's 40+ prepared datasets (and of the MovieLens files in the `recbole` wheels, which
`movielens.py` reads with `read_atomic`). Types: `token` / `token_seq` (strings), `float` / `float_seq`
(numbers); a user feature declared `float` is numeric, any other is categorical. Default columns: `user_id`,
`item_id`, `timestamp` (seconds), `rating`; items `item_id`, `title` (MovieLens calls it `movie_title`: map it
with `dataset.items.title`).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd

from workbench.data.files import CHUNK_ROWS, Column, DataError, missing_column, not_utf8, open_text
from workbench.data.normalize import Format


def read_atomic(path: Path) -> pd.DataFrame:
    """A RecBole atomic file: tab-separated, header `name:type`, no quoting, maybe CRLF."""
    df = pd.read_csv(
        path, sep="\t", dtype=str, quoting=csv.QUOTE_NONE, keep_default_na=False, encoding="utf-8", engine="c"
    )
    df.columns = [c.split(":", 1)[0].strip() for c in df.columns]
    for c in df.columns:
        df[c] = df[c].str.strip()  # CRLF leaves '\r' on the last column
    return df


def header(path: Path) -> dict[str, str]:
    """Column name -> RecBole type, from the `name:type` header; a header without types is not an atomic file."""
    try:
        with open_text(path) as f:
            first = f.readline().rstrip("\r\n")
    except UnicodeDecodeError as err:
        raise not_utf8(path, err) from None
    cols = first.split("\t")
    if not first or any(":" not in c for c in cols):
        raise DataError(f"{path} is not a RecBole atomic file: its header {first[:80]!r} is not tab-separated "
                        "`name:type` fields (e.g. `user_id:token\\titem_id:token`); use format: files for plain tables")
    return {c.split(":", 1)[0].strip(): c.split(":", 1)[1].strip() for c in cols}


def read(role: str, path: Path, declared: str, columns: list[Column], optional: tuple[Column, ...],
         what: str) -> pd.DataFrame:
    types = header(path)
    for col in columns:
        if col.name not in types:
            raise missing_column(path, what, col, list(types))
    wanted = [c.name for c in columns] + [c.name for c in optional if c.name in types]
    try:
        with open_text(path) as f:
            f.readline()
            chunks = pd.read_csv(f, sep="\t", header=None, names=list(types), usecols=wanted, dtype=str,
                                 quoting=csv.QUOTE_NONE, keep_default_na=False, chunksize=CHUNK_ROWS, engine="c")
            df = pd.concat(list(chunks), ignore_index=True)
    except UnicodeDecodeError as err:
        raise not_utf8(path, err) from None
    except pd.errors.ParserError as err:
        raise DataError(f"{path} is not a RecBole atomic file as declared ({err})") from None
    except ValueError as err:  # no rows: nothing to concatenate
        if "No objects to concatenate" not in str(err):
            raise
        df = pd.DataFrame(columns=wanted)
    if df.empty:
        raise DataError(f"{path}: the {what} file has a header but no rows")
    for c in df.columns:
        df[c] = df[c].str.strip()  # CRLF leaves '\r' on the last column
        if role == "items" and types[c] == "token_seq":  # space-separated tokens: genres become "A|B|C"
            df[c] = df[c].str.split()
    return df


def names_of(role: str, path: Path, declared: str, key: str) -> list[str]:
    return list(header(path))


def kinds(path: Path) -> dict[str, str]:
    return {c: "numeric" if t == "float" else "categorical" for c, t in header(path).items()}


FORMAT = Format(
    name="recbole",
    defaults={"interactions": {"user": "user_id", "item": "item_id", "timestamp": "timestamp", "rating": "rating"},
              "items": {"item": "item_id", "title": "title", "year": None, "text": ()},
              "users": {"user": "user_id"}},
    read=read,
    names=names_of,
    kinds=kinds,
    about="RecBole atomic files: .inter / .item / .user with name:type headers",
)
