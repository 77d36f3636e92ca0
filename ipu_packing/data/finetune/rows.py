"""A split's input -> its rows (`read_split`): every column as read, and where each row came from, so that every
refusal names the file, the line (or row) and the column.

Formats, by the name's ending (run_glue.py's conventions: a header of column names, one example a row):

    .csv            comma-separated with a header line, RFC 4180 quoting (Python's csv module, strict)
    .tsv            tab-separated with a header line and no quoting, as GLUE's own files are read (a quote is an
                    ordinary character: MNLI's sentences hold unbalanced ones)
    .jsonl, .json   JSON Lines: one object a line, its keys the columns
    .parquet        Parquet (pyarrow, installed by the `datasets` extra)
    a directory     a Hugging Face `datasets` Dataset saved with `save_to_disk` (the `datasets` extra); a
                    DatasetDict's directory holds one per split, so name the split's (DIR/train)

CSV and TSV cells are text (typed=False: data/finetune/labels.py reads numbers and JSON lists out of the label's text);
JSON Lines, Parquet and datasets values keep their types (typed=True). Files are read as bytes: bad UTF-8 is one
line naming the file, the line and the column; a blank line of CSV, TSV or JSON Lines is skipped (pandas and
datasets skip them too). Rows are numbered from 0 in the order read (a row's example id); messages name a line of a
text file (1-based, the header is line 1) and a row of Parquet or datasets (0-based, as `dataset[i]` indexes it).
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ... import jsonin
from ...errors import DataError, require_extra
from ...fsutil import open_regular, sha256_file

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
"""File ending -> format; a directory is "datasets"."""

ABSENT = None
"""The value of a column a JSON Lines row does not have (the same as JSON null: no value)."""


@dataclass
class SplitTable:
    """One split's rows as read."""

    path: str
    """The file or directory as the user named it."""
    format: str
    """"csv", "tsv", "jsonl", "parquet" or "datasets"."""
    columns: List[str]
    """Column names: the header's order (JSON Lines: keys in the order first seen)."""
    values: Dict[str, List[Any]]
    """Column -> its value in every row (text for CSV and TSV; JSON's or arrow's types otherwise; ABSENT where a
    JSON Lines row lacks the key)."""
    lines: Optional[List[int]]
    """The line each row starts on (1-based) for text formats; None for Parquet and datasets (rows by index)."""
    sha256: str
    """sha256 of the file's bytes (a datasets directory: of its files' names and sha256s, in sorted order)."""
    class_names: Dict[str, List[str]] = field(default_factory=dict)
    """A datasets column of ClassLabel values (a datasets directory, or a Parquet file datasets wrote) -> its class
    names by id (a Sequence of ClassLabel is read as lists of names, so it has none here)."""

    @property
    def rows(self) -> int:
        return len(self.lines) if self.lines is not None else len(next(iter(self.values.values()), []))

    @property
    def typed(self) -> bool:
        """Whether values keep their types (JSON Lines, Parquet, datasets) rather than being text (CSV, TSV)."""
        return self.format not in ("csv", "tsv")

    def where(self, row: int, column: Optional[str] = None) -> str:
        """"FILE:LINE: column 'x'" or "FILE row N: column 'x'", the start of a refusal about one row."""
        place = ("%s:%d" % (self.path, self.lines[row]) if self.lines is not None else "%s row %d" % (self.path, row))
        return place + (": column %r" % column if column is not None else "")

    def header_where(self) -> str:
        """Where a missing column is reported: the header line of a text file, else the file."""
        return "%s:1" % self.path if self.format in ("csv", "tsv") else self.path


def split_format(path: str) -> str:
    """The format of an input named `path` (a key of FORMATS' values, or "datasets" for a directory)."""
    if os.path.isdir(path):
        return "datasets"
    ending = os.path.splitext(path)[1].lower()
    if ending not in FORMATS:
        raise DataError("%s: unknown input format %r: name a .csv, .tsv, .jsonl (or .json: JSON Lines), .parquet "
                        "file, or a Hugging Face datasets directory (save_to_disk)" % (path, ending or path))
    return FORMATS[ending]


def check_split_path(path: str) -> None:
    """Refuse a missing input before anything is written."""
    if not os.path.exists(path):
        raise DataError("%s: no such file or directory" % path)
    split_format(path)


def read_split(path: str) -> SplitTable:
    """Every row of the split input at `path`; DataError naming the file and line for anything unreadable."""
    kind = split_format(path)
    if kind == "datasets":
        return _read_datasets(path)
    if kind == "parquet":
        return _read_parquet(path)
    data = _read_bytes(path)
    text = _decode(path, data)
    if kind == "jsonl":
        return _read_json_lines(path, text, hashlib.sha256(data).hexdigest())
    return _read_delimited(path, kind, text, hashlib.sha256(data).hexdigest())


def read_text(path: str) -> Tuple[str, str]:
    """(the file's text, the sha256 of its bytes): read as every split file is (a FIFO or a device refused, bad
    UTF-8 one line naming the line and column, a leading BOM dropped)."""
    data = _read_bytes(path)
    return _decode(path, data), hashlib.sha256(data).hexdigest()


def _read_bytes(path: str) -> bytes:
    try:
        f = open_regular(path, "rb", error=DataError)  # a FIFO or a device: one line, never a hang
    except OSError as error:
        raise DataError("%s: cannot read (%s)" % (path, error.strerror))
    with f:
        return f.read()


def _decode(path: str, data: bytes) -> str:
    """UTF-8 text (a leading BOM dropped), or DataError naming the line and column of the first bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise DataError("%s:%d: not UTF-8 (byte 0x%02x at column %d)" % (path, line, data[error.start], column))
    return text[1:] if text.startswith("\ufeff") else text


def _read_delimited(path: str, kind: str, text: str, digest: str) -> SplitTable:
    delimiter = "\t" if kind == "tsv" else ","
    quoting = csv.QUOTE_NONE if kind == "tsv" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    header: Optional[List[str]] = None
    header_line = 0
    lines: List[int] = []
    rows: List[List[str]] = []
    start = 1
    try:
        for record in reader:
            line, start = start, reader.line_num + 1
            if not record:  # a blank line
                continue
            if header is None:
                header, header_line = record, line
                continue
            if len(record) != len(header):
                hint = " (TSV is read without quoting: is there a tab inside a text?)" if kind == "tsv" else ""
                raise DataError("%s:%d: %d fields, but the header (line %d) has %d%s"
                                % (path, line, len(record), header_line, len(header), hint))
            lines.append(line)
            rows.append(record)
    except csv.Error as error:
        raise DataError("%s:%d: not valid %s (%s)" % (path, start, kind.upper(), error))
    if header is None:
        raise DataError("%s: empty file (no header line of column names)" % path)
    names = [name if name else "Unnamed: %d" % i for i, name in enumerate(header)]  # pandas' name of an empty one
    seen: Dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise DataError("%s:%d: column %r appears twice in the header (fields %d and %d)"
                            % (path, header_line, name, seen[name] + 1, i + 1))
        seen[name] = i
    values = {name: [row[i] for row in rows] for i, name in enumerate(names)}
    return SplitTable(path, kind, names, values, lines, digest)


def _read_json_lines(path: str, text: str, digest: str) -> SplitTable:
    columns: List[str] = []
    known = set()
    objects: List[Dict[str, Any]] = []
    lines: List[int] = []
    for number, line in jsonin.jsonl_lines(text):
        try:
            value = jsonin.loads(line)
        except ValueError as error:  # JSONDecodeError, TooDeep
            where = " at column %d" % error.colno if hasattr(error, "colno") else ""
            raise DataError("%s:%d: not valid JSON%s (%s)" % (path, number, where, getattr(error, "msg", error)))
        if not isinstance(value, dict):
            raise DataError("%s:%d: a JSON Lines row is an object of columns ({\"sentence1\": ..., \"label\": ...}), "
                            "got %s" % (path, number, type(value).__name__))
        for key in value:
            if key not in known:
                known.add(key)
                columns.append(key)
        objects.append(value)
        lines.append(number)
    if not objects:
        raise DataError("%s: empty file (no JSON Lines rows)" % path)
    values = {name: [o.get(name, ABSENT) for o in objects] for name in columns}
    return SplitTable(path, "jsonl", columns, values, lines, digest)


def _read_parquet(path: str) -> SplitTable:
    parquet = require_extra("pyarrow.parquet", "reading the Parquet file %s" % path)
    try:
        table = parquet.read_table(path)
    except Exception as error:  # pyarrow's own exception types for a file that is not Parquet
        raise DataError("%s: not a readable Parquet file (%s)" % (path, (str(error).splitlines() or ["?"])[0][:200]))
    values = table.to_pydict()
    class_names = _class_names(path, (table.schema.metadata or {}).get(b"huggingface"), values)
    return SplitTable(path, "parquet", list(table.column_names), values, None, sha256_file(path), class_names)


def _class_names(path: str, metadata: Optional[bytes], values: Dict[str, List[Any]]) -> Dict[str, List[str]]:
    """The ClassLabel names that datasets' `to_parquet` records in a Parquet file's "huggingface" metadata (a
    column of ClassLabel lists is turned into lists of names in `values`, as for a datasets directory)."""
    if not metadata:
        return {}
    try:
        features = jsonin.loads(metadata).get("info", {}).get("features", {})
    except (ValueError, AttributeError):
        return {}
    found = {}
    for name, feature in (features.items() if isinstance(features, dict) else ()):
        if not isinstance(feature, dict) or name not in values:
            continue
        inner = feature.get("feature")
        if feature.get("_type") == "ClassLabel" and isinstance(feature.get("names"), list):
            found[name] = [str(n) for n in feature["names"]]
        elif isinstance(inner, dict) and inner.get("_type") == "ClassLabel" and isinstance(inner.get("names"), list):
            values[name] = _names_of(values[name], [str(n) for n in inner["names"]])
    return found


def _names_of(rows: List[Any], names: List[str]) -> List[Any]:
    """Lists of ClassLabel ids -> lists of their names (an id outside the names stays, and is refused later)."""
    return [None if row is None else [names[i] if isinstance(i, int) and 0 <= i < len(names) else i for i in row]
            for row in rows]


def _read_datasets(path: str) -> SplitTable:
    splits_file = os.path.join(path, "dataset_dict.json")
    if os.path.isfile(splits_file):
        try:
            splits = jsonin.load_path(splits_file, error=DataError).get("splits", [])
        except (ValueError, AttributeError):
            splits = []
        raise DataError("%s: a datasets DatasetDict (splits %s): name one split's directory, e.g. %s"
                        % (path, ", ".join(map(str, splits)) or "?",
                           os.path.join(path, str(splits[0]) if splits else "train")))
    datasets = require_extra("datasets", "reading the Hugging Face datasets directory %s" % path)
    try:
        dataset = datasets.load_from_disk(path)
    except Exception as error:  # datasets raises FileNotFoundError and others for what is not its directory
        raise DataError("%s: not a Hugging Face datasets directory written by save_to_disk (%s)"
                        % (path, (str(error).splitlines() or [type(error).__name__])[0][:200]))
    if not isinstance(dataset, datasets.Dataset):
        raise DataError("%s: holds a %s, not one split's Dataset" % (path, type(dataset).__name__))
    values = dataset.to_dict()
    class_names = {}
    for name, feature in dataset.features.items():
        names = getattr(feature, "names", None)
        inner = getattr(getattr(feature, "feature", None), "names", None)
        if names is not None:  # ClassLabel: the ids stay, their names are the label map
            class_names[name] = list(names)
        elif inner is not None:  # a Sequence of ClassLabel: multi-label, read as lists of names
            values[name] = _names_of(values[name], list(inner))
    return SplitTable(path, "datasets", list(dataset.column_names), values, None, _directory_sha256(path),
                      class_names)


def _directory_sha256(path: str) -> str:
    """sha256 of a directory's files: their relative names and sha256s, in sorted order."""
    digest = hashlib.sha256()
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            digest.update(("%s\0%s\n" % (os.path.relpath(full, path), sha256_file(full))).encode("utf-8"))
    return digest.hexdigest()
