"""The PopTorch and PopART names the stand-in knows (tests/assets/*.txt name their repository, commit and file),
and ``Error``."""

from __future__ import annotations

import os
from typing import List, Tuple


_ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "assets")


def _read_list(name: str) -> List[str]:
    with open(os.path.join(_ASSETS, name), encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def _read_table(name: str) -> List[List[str]]:
    return [line.split() for line in _read_list(name)]


API = {}  # type: Dict[str, frozenset]
"""kind -> names, from tests/assets/poptorch_api_names.txt: "top" (module-level names), "method"
("CLASS.NAME" of python/options.py), "enum" ("ENUM.MEMBER"), "optim" / "param" ("CLASS.KWARG")."""
for _kind, _name in _read_table("poptorch_api_names.txt"):
    API[_kind] = API.get(_kind, frozenset()) | {_name}
SUPPORTED_OPS = tuple(_read_list("poptorch_supported_ops.txt"))
POPART_OPTIONS = dict(_read_table("popart_session_options.txt"))  # type: Dict[str, str]
"""key -> value kind (bool, uint64, double, string, container) of every key _Popart.set forwards to PopART."""
POPART_PATTERNS = frozenset(n for (n,) in _read_table("popart_patterns.txt"))
POPART_ENUMS = {n: int(v) for n, v in _read_table("popart_enums.txt")}  # "Enum.Member" -> integer value


def _kwargs_of(kind: str, cls: str) -> Tuple[str, ...]:
    return tuple(sorted(n.split(".", 1)[1] for n in API[kind] if n.split(".", 1)[0] == cls))


class Error(RuntimeError):
    """What PopTorch / PopART raise at compile time (poptorch.Error)."""
