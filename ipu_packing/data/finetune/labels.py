"""Columns and labels of a classification task, as transformers' run_glue.py decides them, checked row by row.

Columns (`text_columns`): --sentence1-key (default "sentence1") and, where the input has it, --sentence2-key
(default "sentence2"). Where the default sentence1 is absent and no key was given: the columns of a GLUE task as
run_glue.py's task_to_keys names them (GLUE_TASK_KEYS: premise and hypothesis, question1 and question2, question
and sentence, or sentence alone), else run_glue's rule: the first two columns other than the label column (one, if
there is only one). An `id` or `idx` column (ID_COLUMNS) is never taken for a text: it numbers the rows. The
validation and test splits use the train split's columns; `describe_columns` says in one line which were read.

Labels (`infer_labels` on the train split, `encode_labels` on every split with the train split's LabelMap):

    class names       single-label; the classes are the names sorted (run_glue sorts its label_list), ids by
                      that order, the names in the manifest
    integers          single-label; the classes are the distinct integers sorted (run_glue's label_list): 0 .. L - 1
                      are kept as they are (names: a datasets ClassLabel's, else none); any other set (1 .. 5,
                      0 and 2) is mapped to ids by that order, the integers the names
    numbers           regression (a float anywhere in the column, as run_glue reads a float column), num_labels 1
    lists of numbers  regression with num_labels = their length (all of one length)
    lists of names    multi-label: multi-hot over the sorted union of the train split's names

A CSV or TSV cell is text: it is an integer, a number or (starting with "[") a JSON list where it reads as one; a
column of names with a few numbers among them is names, but a column of numbers with a few names among them is
refused at the first name (a regression column with "n/a" in it would otherwise become a classifier of hundreds
of classes). JSON Lines, Parquet and datasets values keep their types, and one column holds one kind.

--problem-type forces the kind: single_label_classification (integers or names), multi_label_classification
(lists of names, a single name as a list of one, or 0/1 lists taken as multi-hot), regression (numbers or lists of
numbers). A test split may have no labels (no label column, or every label missing: an empty cell, null, or -1 as
run_glue and datasets' GLUE write them); a train or validation split may not, and a test split is labelled on
every row or on none. A validation or test label the train split does not have (a name, a class id past its
classes, a list of another length) is refused in one line naming the file, line (or row) and column.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ... import jsonin
from ...errors import DataError
from ..format import IGNORE_INDEX, PROBLEM_TYPES
from ..limits import MAX_NUM_LABELS
from .rows import ABSENT, SplitTable

SINGLE, MULTI, REGRESSION = PROBLEM_TYPES

_INTEGER = re.compile(r"[+-]?[0-9]+\Z")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")


# ---------------------------------------------------------------------------------------------------
# columns


GLUE_TASK_KEYS = {"cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
                  "qqp": ("question1", "question2"), "stsb": ("sentence1", "sentence2"),
                  "mnli": ("premise", "hypothesis"), "qnli": ("question", "sentence"),
                  "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2")}
"""run_glue.py's task_to_keys: each GLUE task's text column and pair column (None: single sentences)."""

ID_COLUMNS = ("id", "idx")
"""Columns that number the rows (GLUE's idx, a file's id): never a text, whatever their position."""


def _glue_columns(columns: Sequence[str]) -> Optional[List[str]]:
    """The text columns of the GLUE task whose keys the columns hold (pairs before single sentences), or None."""
    keys = sorted(set(GLUE_TASK_KEYS.values()), key=lambda k: (k[1] is None, k))
    for first, second in keys:
        if first in columns and (second is None or second in columns):
            return [first] if second is None else [first, second]
    return None


def text_columns(table: SplitTable, sentence1_key: Optional[str], sentence2_key: Optional[str],
                 label_key: str) -> List[str]:
    """The train split's text column(s) (run_glue's rule, see the module notes); DataError naming a missing one."""
    columns = table.columns
    if sentence1_key is None and "sentence1" not in columns:
        if sentence2_key is not None:
            raise DataError("%s: --sentence2-key %s needs --sentence1-key (no column 'sentence1'; columns: %s)"
                            % (table.header_where(), sentence2_key, ", ".join(columns)))
        others = [c for c in columns if c != label_key and c.lower() not in ID_COLUMNS]
        glue = _glue_columns(others)
        if glue is not None:
            return glue
        if not others:
            raise DataError("%s: no text column (columns: %s; the label column is %r, and %s columns number the "
                            "rows)" % (table.header_where(), ", ".join(columns), label_key, "/".join(ID_COLUMNS)))
        return others[:2]
    first = sentence1_key or "sentence1"
    second = sentence2_key or "sentence2"
    for name, given in ((first, True), (second, sentence2_key is not None)):
        if given and name not in columns:
            raise DataError("%s: no column %r (columns: %s)" % (table.header_where(), name, ", ".join(columns)))
    return [first, second] if second in columns and second != first else [first]


def describe_columns(columns: Sequence[str], label: Optional[str], what: str = "") -> str:
    """The line that says which columns were read: "columns: text 'sentence1', pair 'sentence2', label 'label'"
    (pair none for single texts; label none where there is none; ``what`` follows "label" where given, e.g.
    "(not read)")."""
    return "columns: text %r, pair %s, label %s%s" % (
        columns[0], repr(columns[1]) if len(columns) > 1 else "none", repr(label) if label else "none",
        " " + what if what and label else "")


def check_columns(table: SplitTable, names: Sequence[str]) -> None:
    """Every column of `names` in the split (the train split's text columns, in validation or test)."""
    for name in names:
        if name not in table.columns:
            raise DataError("%s: no column %r (columns: %s; the train split's text columns are %s)"
                            % (table.header_where(), name, ", ".join(table.columns), ", ".join(names)))


def texts(table: SplitTable, column: str) -> List[str]:
    """The column's texts, each non-blank text (JSON: a string), else DataError naming the row."""
    values = table.values[column]
    for row, value in enumerate(values):
        if value is ABSENT:
            raise DataError("%s: missing (absent or null): no text" % table.where(row, column))
        if not isinstance(value, str):
            raise DataError("%s: %s is not text" % (table.where(row, column), _shown(value)))
        if not value.strip():
            raise DataError("%s: empty text" % table.where(row, column))
    return values


# ---------------------------------------------------------------------------------------------------
# labels


@dataclass
class LabelMap:
    """How labels become the packs' `labels`: decided on the train split, used for every split."""

    problem_type: str
    """One of format.PROBLEM_TYPES."""
    num_labels: int
    """L."""
    names: Optional[List[str]]
    """Single-label: the class names by id (None: integer classes without names). Multi-label: the names of the
    multi-hot columns (None: 0/1 lists taken as they are). Regression: None."""
    by_name: bool
    """Single-label: the labels are names (True) or class ids (False). Multi-label: lists of names (True) or 0/1
    lists (False)."""
    class_values: Optional[List[int]] = None
    """Single-label integer classes that are not 0 .. L - 1: the integers by id (run_glue's sorted label_list);
    None where each integer is its own id."""

    @property
    def shape(self) -> Tuple[int, ...]:
        """The labels of one example: () for a class or one target, (L,) for several."""
        return () if self.problem_type == SINGLE or (self.problem_type == REGRESSION and self.num_labels == 1) \
            else (self.num_labels,)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int32 if self.problem_type == SINGLE else np.float32)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: Any, typed: bool) -> Tuple[str, Any]:
    """(kind, value) of one label: kind "missing", "int", "float", "name", "names" (a list of names), "numbers" (a
    list of numbers) or "bad" (anything else: a bool, a non-finite number, a list of mixed things)."""
    if value is ABSENT or (isinstance(value, str) and not value.strip()):
        return "missing", None
    if not typed:
        text = value.strip()
        if text.startswith("["):
            try:
                parsed = jsonin.loads(text)
            except ValueError:
                return "name", value
            return _kind(parsed, True)
        if _INTEGER.match(text):
            return "int", int(text)
        if _NUMBER.match(text):
            return "float", float(text)
        return "name", value
    if isinstance(value, bool):
        return "bad", value
    if isinstance(value, int):
        return "int", value
    if isinstance(value, float):
        return ("float", value) if math.isfinite(value) else ("bad", value)
    if isinstance(value, str):
        return "name", value
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return "names", list(value)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
            return "numbers", [float(v) for v in value]
    return "bad", value


_GROUPS = {"int": "a number", "float": "a number", "name": "a name", "names": "a list of names",
           "numbers": "a list of numbers"}


def infer_labels(table: SplitTable, column: str, problem_type: Optional[str] = None) -> LabelMap:
    """The LabelMap of the train split's label column (the module notes); DataError naming the first row that
    does not fit."""
    if problem_type is not None and problem_type not in PROBLEM_TYPES:
        raise DataError("--problem-type must be one of %s, got %r" % ("/".join(PROBLEM_TYPES), problem_type))
    kinds = [_kind(v, table.typed) for v in table.values[column]]
    names = table.class_names.get(column)
    for row, (kind, value) in enumerate(kinds):
        if kind == "missing" or (names is not None and kind == "int" and value == -1):
            raise DataError("%s: no label (the train split must have a label on every row)"
                            % table.where(row, column))
        if kind == "bad":
            raise DataError("%s: %s is not a label: a class name, an integer, a number, or a list of names or of "
                            "numbers" % (table.where(row, column), _shown(table.values[column][row])))
    present = set(kind for kind, _ in kinds)
    if not table.typed and present & {"int", "float"} and "name" in present:
        numbers = sum(1 for kind, _ in kinds if kind in ("int", "float"))
        if 2 * numbers > len(kinds):  # a column of numbers with names among them: refuse the first name
            row = next(i for i, (kind, _) in enumerate(kinds) if kind == "name")
            raise DataError("%s: %s is not a number, but most of this column's labels are numbers (a label of the "
                            "wrong kind)" % (table.where(row, column), _shown(table.values[column][row])))
        kinds = [("name", v) for v in table.values[column]]  # names, as written
        present = {"name"}
    group = _GROUPS[kinds[0][0]]
    for row, (kind, value) in enumerate(kinds):
        if _GROUPS[kind] != group:
            raise DataError("%s: %s is %s, but the first row's label is %s (one column holds one kind of label)"
                            % (table.where(row, column), _shown(table.values[column][row]), _GROUPS[kind], group))
    if problem_type is None:
        problem_type = {"a number": REGRESSION if "float" in present else SINGLE, "a name": SINGLE,
                        "a list of names": MULTI, "a list of numbers": REGRESSION}[group]
    values = [value for _, value in kinds]
    if problem_type == SINGLE:
        return _single_label(table, column, kinds, names)
    if problem_type == MULTI:
        if group == "a name":
            values = [[v] for v in values]
            group = "a list of names"
        if group == "a list of names":
            union = sorted(set(name for row in values for name in row))
            if not union:
                raise DataError("%s: every label list is empty: no label names" % table.where(0, column))
            _check_num_labels(table, column, len(union), "label names")
            return LabelMap(MULTI, len(union), union, True)
        if group == "a list of numbers":
            width = _width(table, column, values)
            for row, value in enumerate(values):
                if any(v not in (0.0, 1.0) for v in value):
                    raise DataError("%s: %s is not a multi-hot list of 0 and 1 (--problem-type %s)"
                                    % (table.where(row, column), _shown(table.values[column][row]), MULTI))
            return LabelMap(MULTI, width, None, False)
        raise DataError("%s: %s is %s, not a list of names or of 0/1 (--problem-type %s)"
                        % (table.where(0, column), _shown(table.values[column][0]), group, MULTI))
    if group == "a number":
        return LabelMap(REGRESSION, 1, None, False)
    if group == "a list of numbers":
        return LabelMap(REGRESSION, _width(table, column, values), None, False)
    row = next(i for i, (kind, _) in enumerate(kinds) if kind in ("name", "names"))
    raise DataError("%s: %s is not a number (--problem-type %s)"
                    % (table.where(row, column), _shown(table.values[column][row]), REGRESSION))


def _single_label(table: SplitTable, column: str, kinds: List[Tuple[str, Any]],
                  class_names: Optional[List[str]]) -> LabelMap:
    for row, (kind, value) in enumerate(kinds):
        if kind not in ("int", "name"):
            raise DataError("%s: %s is not a class: an integer or a name (%s)"
                            % (table.where(row, column), _shown(table.values[column][row]), SINGLE))
    if kinds[0][0] == "name":
        names = sorted(set(value for _, value in kinds))
        if len(names) < 2:
            raise DataError("%s: the train split has one class (%s): a classifier needs two or more (or "
                            "--problem-type regression)" % (table.where(0, column), _shown(names[0])))
        _check_num_labels(table, column, len(names), "classes")
        return LabelMap(SINGLE, len(names), names, True)
    for row, (_, value) in enumerate(kinds):
        if value < 0:
            raise DataError("%s: class %d is negative (integer classes are 0 .. L - 1)" % (table.where(row, column),
                                                                                          value))
    top = max(value for _, value in kinds)
    if class_names is not None:
        if top >= len(class_names):
            row = next(i for i, (_, value) in enumerate(kinds) if value >= len(class_names))
            raise DataError("%s: class %d is past the column's %d class names" % (table.where(row, column), top,
                                                                                  len(class_names)))
        return LabelMap(SINGLE, len(class_names), list(class_names), False)
    present = sorted(set(value for _, value in kinds))
    if len(present) < 2:
        raise DataError("%s: the train split has one class (%d): a classifier needs two or more (or "
                        "--problem-type regression)" % (table.where(0, column), present[0]))
    _check_num_labels(table, column, len(present), "classes")
    if present == list(range(len(present))):
        return LabelMap(SINGLE, len(present), None, False)
    return LabelMap(SINGLE, len(present), [str(v) for v in present], False, present)


def _check_num_labels(table: SplitTable, column: str, count: int, what: str) -> None:
    if count > MAX_NUM_LABELS:
        raise DataError("%s: %d %s, over the limit of %d (data/limits.py)" % (table.where(0, column), count, what,
                                                                              MAX_NUM_LABELS))


def _width(table: SplitTable, column: str, values: List[List[float]]) -> int:
    """The one length of every list (regression targets or multi-hot), else DataError at the first other."""
    width = len(values[0])
    if width == 0:
        raise DataError("%s: an empty list of numbers" % table.where(0, column))
    for row, value in enumerate(values):
        if len(value) != width:
            raise DataError("%s: %d value%s, but the first row's label has %d (ragged lists)"
                            % (table.where(row, column), len(value), "" if len(value) == 1 else "s", width))
    _check_num_labels(table, column, width, "values per label")
    return width


@dataclass
class SplitLabels:
    """One split's labels as the packs hold them."""

    labels: np.ndarray
    """(N,) int32 classes (IGNORE_INDEX without labels), (N,) float32 targets, or (N, L) float32."""
    has_labels: bool
    counts: Optional[List[int]]
    """Examples of each class (single-label) or with each label (multi-label); None for regression or without
    labels."""


def encode_labels(table: SplitTable, column: Optional[str], labels: LabelMap, split: str) -> SplitLabels:
    """The split's labels under the train split's LabelMap; DataError naming the row of the first that does not
    fit. `column` None, or absent from the split: no labels (only a test split may have none)."""
    n = table.rows
    empty = np.full((n,) + labels.shape, IGNORE_INDEX if labels.problem_type == SINGLE else 0, dtype=labels.dtype)
    if column is None or column not in table.columns:
        if split != "test":
            raise DataError("%s: no column %r (columns: %s): the %s split needs labels"
                            % (table.header_where(), column, ", ".join(table.columns), split))
        return SplitLabels(empty, False, None)
    kinds = [_kind(v, table.typed) for v in table.values[column]]
    integer_ids = labels.problem_type == SINGLE and not labels.by_name
    missing = [kind == "missing" or (integer_ids and kind == "int" and value == -1) for kind, value in kinds]
    if any(missing):
        row = missing.index(True)
        if split != "test":
            raise DataError("%s: no label (the %s split must have a label on every row)"
                            % (table.where(row, column), split))
        if not all(missing):
            other = missing.index(False)
            raise DataError("%s: no label, but %s has one: a test split has labels on every row or on none"
                            % (table.where(row, column), table.where(other).split(": ")[0]))
        return SplitLabels(empty, False, None)
    out = empty
    index = {name: i for i, name in enumerate(labels.names or ())}  # looked up only, never iterated
    for row, (kind, value) in enumerate(kinds):
        out[row] = _encode_one(table, column, row, kind, value, labels, index)
    counts = None
    if labels.problem_type == SINGLE:
        counts = np.bincount(out, minlength=labels.num_labels).tolist()
    elif labels.problem_type == MULTI:
        counts = out.sum(axis=0).astype(np.int64).tolist()
    return SplitLabels(out, True, counts)


def _encode_one(table: SplitTable, column: str, row: int, kind: str, value: Any, labels: LabelMap,
                index: Dict[str, int]) -> Any:
    """One label as the packs hold it under `labels`, or DataError naming its row."""
    raw = table.values[column][row]
    where = table.where(row, column)
    if kind == "bad":
        raise DataError("%s: %s is not a label" % (where, _shown(raw)))
    problem = labels.problem_type
    if problem == SINGLE and labels.by_name:
        if not table.typed:
            kind, value = "name", raw
        if kind != "name":
            raise DataError("%s: %s is not a class name, as the train split's labels are (a label of the wrong kind)"
                            % (where, _shown(raw)))
        if value not in index:
            raise DataError("%s: label %s is not one of the train split's %d labels (%s)"
                            % (where, _shown(value), labels.num_labels, _listed(labels.names)))
        return index[value]
    if problem == SINGLE:
        if kind != "int":
            raise DataError("%s: %s is not a class id (an integer, as the train split's labels are)"
                            % (where, _shown(raw)))
        if labels.class_values is not None:
            if str(value) not in index:
                raise DataError("%s: class %d is not one of the train split's classes (%s)"
                                % (where, value, _listed(labels.names or [])))
            return index[str(value)]
        if not 0 <= value < labels.num_labels:
            raise DataError("%s: class %d is outside the train split's classes 0 .. %d"
                            % (where, value, labels.num_labels - 1))
        return value
    if problem == MULTI and labels.by_name:
        if kind == "name":
            kind, value = "names", [value]
        if kind != "names":
            raise DataError("%s: %s is not a list of label names, as the train split's labels are"
                            % (where, _shown(raw)))
        hot = np.zeros(labels.num_labels, dtype=np.float32)
        for name in value:
            if name not in index:
                raise DataError("%s: label %s is not one of the train split's %d label names (%s)"
                                % (where, _shown(name), labels.num_labels, _listed(labels.names)))
            hot[index[name]] = 1
        return hot
    if labels.shape == ():  # regression, one target
        if kind not in ("int", "float"):
            raise DataError("%s: %s is not a number, as the train split's labels are" % (where, _shown(raw)))
        _check_float32(where, raw, [value])
        return float(value)
    if kind != "numbers":
        raise DataError("%s: %s is not a list of %d numbers, as the train split's labels are"
                        % (where, _shown(raw), labels.num_labels))
    if len(value) != labels.num_labels:
        raise DataError("%s: %d value%s, but the train split's labels have %d (ragged lists)"
                        % (where, len(value), "" if len(value) == 1 else "s", labels.num_labels))
    if problem == MULTI and any(v not in (0.0, 1.0) for v in value):
        raise DataError("%s: %s is not a multi-hot list of 0 and 1" % (where, _shown(raw)))
    _check_float32(where, raw, value)
    return np.asarray(value, dtype=np.float32)


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_float32(where: str, raw: Any, values: Sequence[float]) -> None:
    """A regression target the packs' float32 holds: beyond about 3.4e38 it would become infinite."""
    if any(abs(float(v)) > _FLOAT32_MAX for v in values):
        raise DataError("%s: %s is beyond float32's range (the labels are float32: at most %.4g in magnitude)"
                        % (where, _shown(raw), _FLOAT32_MAX))


def _listed(names: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(_shown(n) for n in names[:most])
    return shown + (", ..." if len(names) > most else "")
