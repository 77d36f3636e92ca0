"""The one strict YAML reader of config files and override values (train/loader.py calls it).

yaml.SafeLoader made strict: a duplicate key or section, an anchor or alias, a merge key, nesting beyond
MAX_DEPTH, an integer beyond MAX_INT_DIGITS or a text beyond MAX_CONFIG_BYTES is refused naming the line;
numbers read as YAML 1.2 reads them, never as YAML 1.1 alone would:

    10, -3, +7, 1_000          decimal integers
    0x1F, 0o17, 0b101          hexadecimal, octal (YAML 1.2's 0o), binary
    1e-3, 1E3, .5, -.5, 2.     floats (YAML 1.1 read 1e-3 and -.5 as strings)
    1:5, 1:30:00               strings, never base 60 (YAML 1.1 read 1:5 as 65): a number key refuses them
    010, -07, 00               refused, naming the key: YAML 1.1 reads 010 as octal 8, YAML 1.2 as decimal
                               10, and the tools a config passes through disagree, so the only reading no
                               tool contradicts is none. Write 10, or 0o10 for eight.

So a config that loads gives the number its author wrote, or is refused in one line; never exit 0 with
another number.
"""

from __future__ import annotations

import re
from typing import Any, Dict

import yaml

from ..errors import one_line
from ..errors import ConfigError
from ..fsutil import open_regular


MAX_CONFIG_BYTES = 1 << 20
"""Largest config file (or override value) read: shipped configs are ~2 KB."""
MAX_DEPTH = 20
"""Deepest nesting of mappings and lists (a section is 1 deep, its keys' values 2, a list in them 3)."""
MAX_INT_DIGITS = 100
"""Longest integer literal (a seed is below 2**63: 19 digits)."""


_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_AMBIGUOUS = "tag:ipu-packing,2024:leading-zero-integer"
"""The tag this loader gives a plain scalar such as 010 (refused before anything is built)."""


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader made strict, and reading numbers as people write them.

    Strict: a key given twice in one mapping (a section twice in one file) is refused, naming the key and
    both lines; anchors, aliases and merge keys (``<<``) are refused outright, so what a file holds is
    what it says and a small file cannot expand into a large one ("billion laughs"); nesting is at most
    MAX_DEPTH, which also keeps PyYAML's recursive composer far from Python's recursion limit.

    Numbers: PyYAML follows YAML 1.1, whose float pattern needs a dot and a signed exponent, so ``1e-4``
    and ``1.0e30`` load as *strings* and ``optimizer.lr=1e-4`` would be refused as "not a number"; whose
    integers include base 60 (``1:5`` is 65) and octal by a leading zero (``010`` is 8). This loader's
    resolvers are YAML 1.2's for plain scalars instead (the module notes), and a leading-zero integer is
    refused (`_refuse_ambiguous`).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(event.start_mark, "anchors and aliases are not supported (%s%s); write the value out"
                           % ("*" if isinstance(event, yaml.AliasEvent) else "&", event.anchor))
        if self._depth >= MAX_DEPTH:
            raise _Refused(event.start_mark, "nested deeper than %d levels" % MAX_DEPTH)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        if isinstance(node, yaml.MappingNode):
            first: Dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise _Refused(key_node.start_mark, "merge keys (<<) are not supported; write the keys out")
                key = self.construct_object(key_node, deep=True)
                try:
                    line = first.get(key)
                except TypeError:  # an unhashable key: PyYAML's own message follows
                    continue
                if line is not None:
                    raise _Refused(key_node.start_mark, "duplicate key %r (first at line %d)" % (key, line))
                first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


    def construct_yaml_int(self, node):  # type: ignore[override]
        digits = len(str(node.value))
        if digits > MAX_INT_DIGITS:  # Python 3.11 refuses > 4,300 digits with a ValueError; 3.8 would parse it
            raise _Refused(node.start_mark, "an integer of %d digits (at most %d)" % (digits, MAX_INT_DIGITS))
        text = str(self.construct_scalar(node)).replace("_", "")
        sign = -1 if text.startswith("-") else 1
        text = text.lstrip("+-")
        for prefix, base in (("0b", 2), ("0x", 16), ("0o", 8)):
            if text.startswith(prefix):
                return sign * int(text[2:], base)
        return sign * int(text, 10)  # decimal, also for an explicit !!int 010 (YAML 1.2)


_Loader.add_constructor(_INT, _Loader.construct_yaml_int)


class _Refused(Exception):
    """What the strict loader refuses, at a place in the text (turned into a ConfigError naming the file)."""

    def __init__(self, mark: Any, cause: str) -> None:
        super().__init__("line %d: %s" % (mark.line + 1, cause))


# YAML 1.2's numbers for plain scalars in place of YAML 1.1's (underscores kept, as PyYAML reads them): the
# int and float resolvers SafeLoader inherits are dropped, these three added, the leading-zero one first
_Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_AMBIGUOUS, re.compile(r"^[-+]?0[0-9_]+$"), list("-+0"))
_Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|[-+]?0b[01_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?0o[0-7_]+)$"),
    list("-+0123456789"))
_Loader.add_implicit_resolver(
    _FLOAT, re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?
                           |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                           |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _refuse_ambiguous(node: Any, path: str = "") -> None:
    """Refuse the first leading-zero integer in a composed document, naming its dotted key and both readings.
    Iterative over the node tree (the composer has already bounded its depth)."""
    stack = [(node, path)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
                stack.append((value, "%s.%s" % (path, name) if path else name))
        elif isinstance(node, yaml.SequenceNode):
            for i in reversed(range(len(node.value))):
                stack.append((node.value[i], "%s[%d]" % (path, i)))
        elif isinstance(node, yaml.ScalarNode) and node.tag == _AMBIGUOUS:
            text = node.value
            digits = text.lstrip("+-").replace("_", "")
            sign = -1 if text.startswith("-") else 1
            is_octal = set(digits) <= set("01234567")
            octal = "octal %d" % (sign * int(digits, 8)) if is_octal else "a string"
            decimal = sign * int(digits, 10)
            raise _Refused(node.start_mark, "%s%s is a leading-zero integer: YAML 1.1 reads it as %s, YAML 1.2 "
                           "as decimal %d; write %d%s" % ("%s: " % path if path else "", text, octal, decimal, decimal,
                                                         " (or %s0o%s for octal)" % ("-" if sign < 0 else "",
                                                                                     digits.lstrip("0") or "0")
                                                         if is_octal else ""))


def yaml_load(stream: Any, source: str = "value") -> Any:
    """The one YAML reader of configs and overrides: text or a binary/text file, at most MAX_CONFIG_BYTES,
    through the strict loader above. Every refusal is a ConfigError that starts with ``source``."""
    text = stream.read(MAX_CONFIG_BYTES + 1) if hasattr(stream, "read") else stream
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError("%s is not UTF-8: %s" % (source, exc))
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError("%s is larger than %d bytes (a config is a few KB)" % (source, MAX_CONFIG_BYTES))
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_ambiguous(node)
        return loader.construct_document(node)
    except _Refused as exc:
        raise ConfigError("%s %s" % (source, exc))
    except yaml.YAMLError as exc:
        raise ConfigError("%s is not valid YAML: %s" % (source, shown(one_line(exc), 300)))
    except (ValueError, OverflowError, RecursionError) as exc:  # a constructor: int() of 5,000 digits
        raise ConfigError("%s holds a value YAML cannot build: %s" % (source, shown(str(exc), 300)))
    finally:
        loader.dispose()


def yaml_load_file(path: str, source: str) -> Any:
    """``yaml_load`` of the config file at ``path``, opened through ``fsutil.open_regular``: a FIFO, a device
    or a directory is refused at once as a ConfigError naming it, instead of blocking or reading without end."""
    with open_regular(path, "rb", error=ConfigError) as f:
        return yaml_load(f, source=source)


def shown(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for an error line (a hostile value may be a megabyte)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
