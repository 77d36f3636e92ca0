"""The one JSON reader of files a user hands us (manifests, histograms, indexes, config.json, metrics lines);
``load_path`` also opens the file, refusing a FIFO or a device (fsutil.open_regular).

``json.loads`` recurses once per level of nesting, so a small hostile file (``[[[[...]]]]``) meets the
interpreter's recursion limit inside json's C scanner, and what happens then depends on the Python: a
RecursionError on 3.11; on 3.8 a process whose output is redirected can abort outright (the Python 3.8
suite died with SIGABRT there). ``loads`` measures the nesting first, without recursion, and refuses more
than MAX_DEPTH levels as a ValueError before json sees the text; none of our files nests beyond 4.
"""

from __future__ import annotations

import json
from typing import Any, AnyStr, List, Tuple, Type, Union

from .errors import InputError

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects read (a manifest is 3 deep, a metrics line 2)."""


class TooDeep(json.JSONDecodeError):
    """The text nests arrays and objects deeper than MAX_DEPTH: a JSONDecodeError (so a ValueError), so that
    whatever reports json's own errors reports this one too, with the position where it went too deep."""


def too_deep_at(text: str, max_depth: int) -> int:
    """The index of the first [ or { nested deeper than ``max_depth`` in JSON ``text`` (brackets inside
    strings left out; one pass, no recursion), or -1."""
    level = 0
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            if level > max_depth:
                return i
        elif ch in "]}":
            level -= 1
    return -1


def loads(data: Union[str, bytes], max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)`` (bytes as UTF-8), refusing input nested deeper than ``max_depth`` with TooDeep:
    callers that catch json's JSONDecodeError (or ValueError) report it the same way."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    if text.count("[") + text.count("{") > max_depth:  # counting is C-fast; most files stop here
        at = too_deep_at(text, max_depth)
        if at >= 0:
            raise TooDeep("nested too deeply: more than %d levels of arrays and objects" % max_depth, text, at)
    return json.loads(text)


def jsonl_lines(text: AnyStr) -> List[Tuple[int, AnyStr]]:
    """(line number from 1, line) of each non-blank line of JSON Lines ``text``, the one way every JSON Lines
    file is cut into records: at ``\\n`` only. U+2028, U+2029, U+0085 and the other characters that
    ``str.splitlines`` also breaks at are characters of a record's strings (a context may hold them), and a
    ``\\r`` before the ``\\n`` is white space JSON ignores. ``text`` may be the file's bytes (lines are then
    bytes, for a reader that reports a line that is not UTF-8 by its number)."""
    newline = b"\n" if isinstance(text, bytes) else "\n"
    return [(number, line) for number, line in enumerate(text.split(newline), 1) if line.strip()]  # type: ignore


def jsonl_complete(text: AnyStr) -> bool:
    """Whether JSON Lines ``text`` ends its last record with ``\\n`` (else a writer was killed mid-line): nothing
    but white space after the last ``\\n``."""
    newline = b"\n" if isinstance(text, bytes) else "\n"
    return not text.rsplit(newline, 1)[-1].strip()  # type: ignore


def load(handle: Any, max_depth: int = MAX_DEPTH) -> Any:
    """``loads`` of an open file's whole content."""
    return loads(handle.read(), max_depth)


MAX_FILE_BYTES = 1 << 28
"""Largest JSON file read (256 MiB): a config.json, an index or a tokenizer.json is a few MB at most."""


def load_path(path: str, max_depth: int = MAX_DEPTH, error: Type[Exception] = InputError,
              max_bytes: int = MAX_FILE_BYTES) -> Any:
    """``loads`` of the file a user named at ``path``, opened through ``fsutil.open_regular``: a FIFO or a
    device is refused at once as ``error`` (one line) instead of blocking or reading without end, and a file
    larger than ``max_bytes`` is refused without reading it whole."""
    from .fsutil import open_regular

    with open_regular(path, "rb", error=error) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise error("%s: larger than %d bytes: not a JSON file this program reads" % (path, max_bytes))
    return loads(data, max_depth)
