"""Strict machine-readable output: the one writer of every ``--json`` object (and of JSON result files).

Python's ``json.dumps`` writes ``NaN``, ``Infinity`` and ``-Infinity`` by default, which is not JSON:
``jq``, JavaScript and most other readers refuse the whole object. ``dumps`` writes ``null`` in their
place, adds to the object's ``warnings`` list one line per value it replaced, naming its dotted path
(``a.final_mlm_loss``, ``rows[3].seconds``), and serialises with ``allow_nan=False``, so a non-finite
value that got past it would be an error here rather than invalid output downstream. numpy scalars and
arrays become plain numbers and lists. The walk is iterative: a deeply nested value (read from a user's
file) cannot exhaust the recursion limit here.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Iterable, List, Optional, Tuple

WARNINGS = "warnings"


def finite(value: Any) -> Tuple[Any, List[str]]:
    """(a copy of ``value`` with every non-finite float replaced by None, the dotted paths replaced)."""
    replaced: List[str] = []
    box: List[Any] = [None]
    stack: List[Tuple[Any, Any, Any, str]] = [(value, box, 0, "")]  # (value, parent, key in parent, path)
    while stack:
        item, parent, key, path = stack.pop()
        item = _plain(item)
        if isinstance(item, float) and not math.isfinite(item):
            replaced.append("%s is %s" % (path or "the value", _spelling(item)))
            item = None
        elif isinstance(item, dict):
            copy: Any = {}
            for k, v in item.items():
                copy[k] = None
                stack.append((v, copy, k, "%s.%s" % (path, k) if path else str(k)))
            item = copy
        elif isinstance(item, (list, tuple)):
            copy = [None] * len(item)
            for i, v in enumerate(item):
                stack.append((v, copy, i, "%s[%d]" % (path, i)))
            item = copy
        parent[key] = item
    return box[0], sorted(replaced)


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps(value, **kwargs)`` that never writes NaN or Infinity: each becomes null, and an object
    gets a ``warnings`` list naming them (kept with its own warnings, if it has any)."""
    clean, replaced = finite(value)
    if replaced and isinstance(clean, dict):
        own = clean.get(WARNINGS)
        own = list(own) if isinstance(own, list) else ([] if own is None else [own])
        clean[WARNINGS] = own + ["%s, not a finite number: written as null" % r for r in replaced]
    return json.dumps(clean, allow_nan=False, **kwargs)


def jsonl_text(records: Iterable[Any], ensure_ascii: bool = True, default: Optional[Callable[[Any], Any]] = None
               ) -> str:
    """JSON Lines: each record by ``dumps`` (keys sorted, never NaN), one a line, each line ended by ``\\n``:
    the one writer of every JSON Lines file (jsonin.jsonl_lines reads them back). ``default``: json's, for a
    value JSON has no type for (e.g. ``str``)."""
    return "".join(dumps(record, sort_keys=True, ensure_ascii=ensure_ascii, default=default) + "\n"
                   for record in records)


def _plain(item: Any) -> Any:
    """numpy scalars and arrays as Python numbers and lists (json cannot write them), else ``item``."""
    kind = type(item).__module__
    if kind == "numpy":
        if hasattr(item, "tolist"):
            return item.tolist()
    return item


def _spelling(x: float) -> str:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


__all__ = ["WARNINGS", "dumps", "finite", "jsonl_text"]
