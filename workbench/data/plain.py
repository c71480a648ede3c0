"""The `files` format: plain tables (parquet, CSV, TSV, JSON Lines; gzip or not) and a column map in the config.

Default columns (each a config key of its section, e.g. `dataset.interactions.user`): interactions `user_id`,
`item_id`, `timestamp` (no rating: every row weighs 1 unless `rating` names one); items `item_id`, `title` (no
further text unless `text` names columns); users `user_id` (features: every other column).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from workbench.data.files import Column, column_names, read_table, table_format
from workbench.data.normalize import Format


def _key(columns: list[Column]) -> str:
    return columns[0].key.rsplit(".", 1)[0]


def read(role: str, path: Path, declared: str, columns: list[Column], optional: tuple[Column, ...],
         what: str) -> pd.DataFrame:
    return read_table(path, table_format(path, declared, _key(columns)), columns, what, optional=optional)


def names_of(role: str, path: Path, declared: str, key: str) -> list[str]:
    return column_names(path, table_format(path, declared, key), key)


FORMAT = Format(
    name="files",
    defaults={"interactions": {"user": "user_id", "item": "item_id", "timestamp": "timestamp", "rating": None},
              "items": {"item": "item_id", "title": "title", "year": None, "text": ()},
              "users": {"user": "user_id"}},
    read=read,
    names=names_of,
    about="plain tables: parquet, CSV, TSV or JSON Lines (gzip or not), columns mapped in the config",
)
