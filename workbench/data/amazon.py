"""The Amazon reviews dumps P5, TIGER and GRID train on, in the three layouts they were published in.

- 2014 (`reviews_<Cat>_5.json.gz` + `meta_<Cat>.json.gz`): reviews are JSON lines (`reviewerID`, `asin`,
  `unixReviewTime` in seconds, `overall`); the meta lines are Python dict literals (single quotes), read with
  `ast.literal_eval`, never `eval`: `asin`, `title`, `brand`, `categories` (a list of lists), `description`.
- 2018 (`<Cat>_5.json.gz` + `meta_<Cat>.json.gz`): JSON lines both; reviews as in 2014; meta `asin`, `title`,
  `brand`, `category` (a list), `description` and `feature` (lists), `main_cat`.
- 2023 (`<Cat>.jsonl(.gz)` + `meta_<Cat>.jsonl(.gz)`): reviews `user_id`, `parent_asin`, `timestamp` in
  milliseconds, `rating`; meta `parent_asin`, `title`, `features`, `categories`, `store`, `description`.
The item's text is its title plus, by default, the brand / store and categories (`dataset.items.text` picks
others, e.g. `[store, categories, features, description]`). The dumps hold no user features. The papers train
on the 5-core (`dataset.k_core: 5`; the `_5` review files already are one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from workbench.data.files import Column, column_names, python_literal, read_table
from workbench.data.normalize import Format


def _parser(year: int, role: str):
    if year == 2014 and role == "items":
        return python_literal, "Python dict literal"
    return json.loads, "JSON"


def _reader(year: int):
    def read(role: str, path: Path, declared: str, columns: list[Column], optional: tuple[Column, ...],
             what: str) -> pd.DataFrame:
        parser, kind = _parser(year, role)
        return read_table(path, "jsonl", columns, what, optional=optional, line_parser=parser, line_format=kind)

    def names_of(role: str, path: Path, declared: str, key: str) -> list[str]:
        parser, kind = _parser(year, role)
        return column_names(path, "jsonl", key, parser, kind)

    return read, names_of


def _format(year: int, inter: dict, items: dict) -> Format:
    read, names_of = _reader(year)
    return Format(name=f"amazon-{year}", defaults={"interactions": inter, "items": items, "users": {"user": "user_id"}},
                  read=read, names=names_of, about=f"Amazon reviews {year}: JSON-lines reviews + meta")


_REVIEWS_2014_2018 = {"user": "reviewerID", "item": "asin", "timestamp": "unixReviewTime", "rating": "overall"}
FORMATS = {
    "amazon-2014": _format(2014, _REVIEWS_2014_2018,
                           {"item": "asin", "title": "title", "year": None, "text": ("brand", "categories")}),
    "amazon-2018": _format(2018, _REVIEWS_2014_2018,
                           {"item": "asin", "title": "title", "year": None, "text": ("brand", "category")}),
    "amazon-2023": _format(2023, {"user": "user_id", "item": "parent_asin", "timestamp": "timestamp",
                                  "rating": "rating"},
                           {"item": "parent_asin", "title": "title", "year": None, "text": ("store", "categories")}),
}
