"""Reading one table file a researcher hands in (parquet, CSV, TSV, JSON Lines; gzip or not), and what is wrong with it.

- Only the columns a config maps are read: parquet in record batches, CSV/TSV and JSON Lines in chunks, so a
  multi-GB file never needs its whole width in memory. Gzip is recognised by its magic bytes, not its name.
- Ids are read as strings (a 20-digit id stays exact); every other column as the file types it (CSV: strings).
- Every problem is a `DataError` that names the file and what to change: a column that is not there (with the
  columns found and the config key that maps it), an empty file, a file that is not the format it is declared
  as, text that is not UTF-8 (with the line), a timestamp that parses as nothing (with the row and the value).
  Rows are counted from 1, the header not counted.
- `parse_timestamps` turns epoch seconds, epoch milliseconds or ISO 8601 strings into int seconds and says
  which it found ("auto"), or reads the unit the config names.
"""

from __future__ import annotations

import ast
import csv
import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from workbench.errors import UsageError

CHUNK_ROWS = 1 << 18  # rows per CSV / JSON Lines chunk
SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "tsv", ".tab": "tsv",
            ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}  # fmt: skip
UNITS = {"s": "epoch seconds", "ms": "epoch milliseconds", "iso": "ISO 8601 times (naive ones read as UTC)"}


class DataError(UsageError, ValueError):
    """A dataset file that cannot become the normalized tables; the message says which file, where and what to do."""


@dataclass(frozen=True)
class Column:
    """A column to read: its name in the file and the config key that names it (for the messages)."""

    name: str
    key: str  # e.g. "dataset.interactions.user"
    is_id: bool = False  # read as strings, exactly


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def open_text(path: Path) -> io.TextIOBase:
    """The file as UTF-8 text, gunzipped when it is gzip (strict: bad bytes raise)."""
    raw = gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8", newline="")


def table_format(path: Path, declared: str, key: str) -> str:
    """`declared` unless "auto": then the format its name says (`.gz` stripped)."""
    if declared != "auto":
        return declared
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    fmt = SUFFIXES.get(Path(name).suffix.lower())
    if fmt is None:
        raise DataError(f"{path}: cannot tell the format from the name; set {key}.format to one of "
                        f"parquet, csv, tsv, jsonl")
    return fmt


def existing(path: str | Path, key: str) -> Path:
    """The file at `path` (`~` expanded), or a DataError naming the config key."""
    p = Path(path).expanduser()
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise DataError(f"{key}.path: {p} {what}; give the path of a file (relative to the directory you run in)")
    if p.stat().st_size == 0:
        raise DataError(f"{p} is empty (0 bytes); {key}.path must name a file with a header and rows")
    return p


def fingerprint(path: Path) -> dict:
    """What ties a cache entry to a file: its resolved path, size and modification time."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def missing_column(path: Path, what: str, col: Column, found) -> DataError:
    shown = ", ".join(map(str, list(found)[:30])) + (" ..." if len(found) > 30 else "")
    return DataError(f"{path}: the {what} file has no column {col.name!r} (columns found: {shown}); "
                     f"map it with {col.key}")


def not_utf8(path: Path, err: UnicodeDecodeError) -> DataError:
    """The line of the first bad byte (found by a second pass: this is the error path)."""
    line = 0
    raw = gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")
    with raw:
        for line, b in enumerate(raw, 1):
            try:
                b.decode("utf-8")
            except UnicodeDecodeError as e:
                return DataError(f"{path}: line {line} is not UTF-8 text (byte 0x{b[e.start]:02x} at column "
                                 f"{e.start + 1}); re-save the file as UTF-8")
    return DataError(f"{path} is not UTF-8 text ({err.reason}); re-save the file as UTF-8")


def read_table(path: Path, fmt: str, columns: list[Column], what: str, *,
               optional: tuple[Column, ...] = (), line_parser: Callable[[str], object] = json.loads,
               line_format: str = "JSON") -> pd.DataFrame:
    """The `columns` (required) and `optional` columns of one file, named as in the file, rows in file order."""
    fmt = _check_magic(path, fmt, columns[0].key.rsplit(".", 1)[0])
    reader = {"parquet": _read_parquet, "csv": _read_delimited, "tsv": _read_delimited, "jsonl": _read_jsonl}[fmt]
    kwargs = {"sep": "," if fmt == "csv" else "\t"} if fmt in ("csv", "tsv") else {}
    if fmt == "jsonl":
        kwargs = {"line_parser": line_parser, "line_format": line_format}
    df = reader(path, columns, optional, what, **kwargs)
    if df.empty:
        raise DataError(f"{path}: the {what} file has a header but no rows")
    for col in (*columns, *optional):
        if col.is_id and col.name in df:
            df[col.name] = _id_strings(df[col.name])
    return df.reset_index(drop=True)


def column_names(path: Path, fmt: str, key: str, line_parser: Callable[[str], object] = json.loads,
                 line_format: str = "JSON") -> list[str]:
    """The columns a file has (JSON Lines: the keys of its first 1,000 records)."""
    fmt = _check_magic(path, fmt, key)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.ParquetFile(path).schema_arrow.names)
        except Exception as err:  # pyarrow raises ArrowInvalid / OSError for a damaged file
            raise DataError(f"{path} is not a readable parquet file ({err})") from None
    if fmt == "jsonl":
        seen: dict[str, None] = {}
        for n, rec in enumerate(iter_records(path, line_parser, line_format)):
            seen.update(dict.fromkeys(rec))
            if n >= 1000:
                break
        return list(seen)
    try:
        with open_text(path) as f:
            first = f.readline()
    except UnicodeDecodeError as err:
        raise not_utf8(path, err) from None
    return [h.strip() for h in next(csv.reader([first], delimiter="," if fmt == "csv" else "\t"))] if first else []


def _check_magic(path: Path, fmt: str, key: str) -> str:
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"PAR1" and fmt != "parquet":
        raise DataError(f"{path} is a parquet file, not {fmt}; set {key}.format: parquet")
    if fmt == "parquet" and head != b"PAR1":
        looks = "gzip" if head[:2] == b"\x1f\x8b" else "text" if head.isascii() else "something else"
        raise DataError(f"{path} is not a parquet file (it starts like {looks}); set {key}.format to what it is "
                        "(csv, tsv, jsonl)")
    return fmt


def _id_strings(s: pd.Series) -> pd.Series:
    """Ids as strings: integers without a ".0", missing ids as None."""
    if pd.api.types.is_float_dtype(s) and s.dropna().mod(1).eq(0).all():
        s = s.astype("Int64")
    out = s.astype(object).where(s.notna(), None)
    return out.map(lambda v: v if v is None or isinstance(v, str) else str(v))


def _read_parquet(path, columns, optional, what) -> pd.DataFrame:
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for a damaged file
        raise DataError(f"{path} is not a readable parquet file ({err})") from None
    found = f.schema_arrow.names
    for col in columns:
        if col.name not in found:
            raise missing_column(path, what, col, found)
    names_ = [c.name for c in columns] + [c.name for c in optional if c.name in found]
    parts = [b.to_pandas() for b in f.iter_batches(columns=names_, batch_size=CHUNK_ROWS)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=names_)


def _read_delimited(path, columns, optional, what, sep: str) -> pd.DataFrame:
    try:
        with open_text(path) as f:
            first = f.readline()
            if first.lstrip().startswith("{"):
                kind = "CSV" if sep == "," else "TSV"
                raise DataError(f"{path} looks like JSON Lines, not {kind}; set "
                                f"{columns[0].key.rsplit('.', 1)[0]}.format: jsonl")
            header = next(csv.reader([first], delimiter=sep)) if first else []
            found = [h.strip() for h in header]
            for col in columns:
                if col.name not in found:
                    raise missing_column(path, what, col, found)
            names_ = [c.name for c in columns] + [c.name for c in optional if c.name in found]
            f.seek(0)
            chunks = pd.read_csv(f, sep=sep, usecols=names_, dtype=str, keep_default_na=False, na_values=[""],
                                 chunksize=CHUNK_ROWS, engine="c")
            parts = list(chunks)
    except UnicodeDecodeError as err:
        raise not_utf8(path, err) from None
    except pd.errors.ParserError as err:
        raise DataError(f"{path} is not {'CSV' if sep == ',' else 'TSV'} as declared ({err})") from None
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=names_)


def iter_records(path: Path, line_parser: Callable[[str], object] = json.loads,
                 line_format: str = "JSON") -> Iterator[dict]:
    """One dict per non-blank line; a line that is not a `line_format` object is a DataError with its number."""
    line = 0
    try:
        with open_text(path) as f:
            for line, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    rec = line_parser(text)
                except (ValueError, SyntaxError, MemoryError, RecursionError) as err:
                    raise DataError(f"{path}: line {line} is not a {line_format} object ({type(err).__name__}: "
                                    f"{str(err)[:80]}); is the file JSON Lines, one record per line?") from None
                if not isinstance(rec, dict):
                    raise DataError(f"{path}: line {line} is a {type(rec).__name__}, not a {line_format} object; "
                                    "JSON Lines holds one object per line")
                yield rec
    except UnicodeDecodeError as err:
        raise not_utf8(path, err) from None
    except (EOFError, gzip.BadGzipFile) as err:
        raise DataError(f"{path}: the gzip stream is damaged after line {line} ({err})") from None


def python_literal(text: str) -> object:
    """A line of the Amazon 2014 meta files: a Python dict literal (single quotes), not JSON."""
    return ast.literal_eval(text)


def _read_jsonl(path, columns, optional, what, line_parser, line_format) -> pd.DataFrame:
    wanted = [c.name for c in columns] + [c.name for c in optional]
    seen: dict[str, None] = {}
    data: dict[str, list] = {n: [] for n in wanted}
    for n, rec in enumerate(iter_records(path, line_parser, line_format)):
        if n < 1000:
            seen.update(dict.fromkeys(rec))
        for name in wanted:
            data[name].append(rec.get(name))
    def present(c: Column) -> bool:
        return c.name in seen or any(v is not None for v in data[c.name])

    for col in columns:
        if not present(col):
            raise missing_column(path, what, col, seen)
    return pd.DataFrame({c.name: pd.Series(data[c.name], dtype=object) for c in (*columns, *optional) if present(c)})


# ---- timestamps -----------------------------------------------------------------------------------------------
def parse_timestamps(values: pd.Series, unit: str, path: Path, col: Column) -> tuple[np.ndarray, np.ndarray, str]:
    """`(seconds, nanoseconds, unit)`: int64 epoch seconds and nanoseconds per row, and the unit read ("s", "ms"
    or "iso"; detected when `unit` is "auto"). A value that is none of them is a DataError with its row."""
    values = values.reset_index(drop=True)
    hint = (f"(column {col.name!r}, {col.key}; set {col.key.rsplit('.', 1)[0]}.timestamp_unit to s, ms or iso "
            "if the guess is wrong)")
    missing = values.isna() | values.astype(str).str.strip().eq("")
    if missing.any():
        row = int(np.flatnonzero(missing.to_numpy())[0])
        raise DataError(f"{path}: row {row + 1} has no timestamp {hint}")
    num = pd.to_numeric(values, errors="coerce")
    if unit == "auto":
        unit = "iso" if num.isna().all() else _numeric_unit(num, values, path, hint)
    if unit == "iso":
        when = pd.to_datetime(values.astype(str), format="ISO8601", utc=True, errors="coerce")
        bad = when.isna().to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataError(f"{path}: row {row + 1}: timestamp {values[row]!r} is not an ISO 8601 time {hint}")
        ns = when.dt.as_unit("ns").astype("int64").to_numpy()  # pandas may pick another resolution
    else:
        bad = num.isna().to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataError(f"{path}: row {row + 1}: timestamp {values[row]!r} is not a number of "
                            f"{UNITS[unit]} {hint}")
        scale = 1_000_000_000 if unit == "s" else 1_000_000
        ns = np.round(num.to_numpy(np.float64) * scale).astype(np.int64) if num.dtype.kind == "f" else \
            num.to_numpy(np.int64) * scale
    return np.floor_divide(ns, 1_000_000_000), ns, unit


def _numeric_unit(num: pd.Series, values: pd.Series, path: Path, hint: str) -> str:
    """Seconds below 1e11 (the year 5138), milliseconds below 1e14 (also 5138); beyond that, ask."""
    bad = num.isna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path}: row {row + 1}: timestamp {values[row]!r} is not a number, while other rows hold "
                        f"epoch times {hint}")
    top = float(num.abs().max())
    if top < 1e11:
        return "s"
    if top < 1e14:
        return "ms"
    raise DataError(f"{path}: timestamps up to {top:.0f} look like micro- or nanoseconds; give epoch seconds, "
                    f"milliseconds or ISO 8601 times {hint}")
