"""Reading histograms from files (.npy, .txt, .json) for the command line and benchmarks."""

from __future__ import annotations

import json
import os
from typing import Optional, Tuple

import numpy as np

from .. import jsonin
from ..errors import InputError, one_line
from ..fsutil import open_regular


def load_histogram(path: str) -> Tuple[np.ndarray, Optional[int]]:
    """Returns (counts, max_seq_length or None). Raises InputError (a ValueError) on unreadable input.

    - .npy: a one-dimensional array of counts.
    - .txt: one count per line (blank lines and lines starting with # are skipped).
    - .json: a list of counts, or an object with a "histogram" list and an optional
      "max_sequence_length" (the key of the published histogram files; "max_seq_length" is read too).
    Bin i counts sequences of length i + 1.
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".npy", ".txt", ".json"):
        raise InputError("histogram file must end in .npy, .txt or .json: %s" % path)
    try:
        if ext == ".npy":
            try:
                with open_regular(path, "rb") as f:  # a FIFO or a device is refused, never read
                    data = np.load(f, allow_pickle=False)
            except (ValueError, EOFError) as exc:  # pickled, truncated or not a .npy at all
                if isinstance(exc, InputError):
                    raise
                raise InputError("%s is not a readable .npy array of counts: %s" % (path, one_line(exc)))
            max_length = None
        elif ext == ".txt":
            with open_regular(path, "r", encoding="utf-8") as f:
                lines = [line.strip() for line in f]
            data = [_number(line, path, i + 1) for i, line in enumerate(lines) if line and not line.startswith("#")]
            max_length = None
        else:
            with open_regular(path, "r", encoding="utf-8") as f:
                obj = jsonin.load(f)
            if isinstance(obj, dict):
                if "histogram" not in obj:
                    raise InputError("%s: JSON object has no \"histogram\" key" % path)
                data = obj["histogram"]
                max_length = obj.get("max_seq_length", obj.get("max_sequence_length"))
                if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)):
                    raise InputError("%s: \"max_sequence_length\" must be an integer" % path)
            else:
                data = obj
                max_length = None
    except OSError as exc:
        raise InputError("cannot read %s: %s" % (path, exc.strerror or exc))
    except UnicodeDecodeError as exc:
        raise InputError("%s is not UTF-8 text (byte 0x%02x at offset %d)" % (path, exc.object[exc.start], exc.start))
    except json.JSONDecodeError as exc:
        raise InputError("%s is not valid JSON: %s" % (path, exc))
    if isinstance(data, list) and not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in data):
        raise InputError("%s: histogram must be a list of numbers" % path)
    try:
        counts = np.asarray(data)
    except (ValueError, TypeError) as exc:  # pragma: no cover - ragged input
        raise InputError("%s: histogram is not an array of counts: %s" % (path, exc))
    return counts, max_length


def _number(text: str, path: str, line: int):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise InputError("%s line %d: not a count: %r" % (path, line, text[:40]))
