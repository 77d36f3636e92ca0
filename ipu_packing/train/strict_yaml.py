"""The one strict YAML reader of config files and override values (train/loader.py calls it).

yaml.SafeLoader made strict: a duplicate key or section, an anchor or alias, a merge key, nesting beyond
MAX_DEPTH, an integer beyond MAX_INT_DIGITS or a text beyond MAX_CONFIG_BYTES is refused naming the line;
numbers read as people write them (1e-3 is a float, as in YAML 1.2).
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


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader made strict, and reading numbers as people write them.

    Strict: a key given twice in one mapping (a section twice in one file) is refused, naming the key and
    both lines; anchors, aliases and merge keys (``<<``) are refused outright, so what a file holds is
    what it says and a small file cannot expand into a large one ("billion laughs"); nesting is at most
    MAX_DEPTH, which also keeps PyYAML's recursive composer far from Python's recursion limit.

    Numbers: PyYAML follows YAML 1.1, whose float pattern needs a dot and a signed exponent, so ``1e-4``
    and ``1.0e30`` load as *strings* and ``optimizer.lr=1e-4`` would be refused as "not a number". YAML
    1.2 (the current spec) reads them as floats; this loader adds that rule for plain scalars.
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
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


class _Refused(Exception):
    """What the strict loader refuses, at a place in the text (turned into a ConfigError naming the file)."""

    def __init__(self, mark: Any, cause: str) -> None:
        super().__init__("line %d: %s" % (mark.line + 1, cause))


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


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
        return loader.get_single_data()
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
