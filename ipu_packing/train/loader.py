"""The config loader: configs/NAME.yaml (+ `base:` + dotted overrides) -> RunConfig.

YAML is a thin, strict layer over the dataclasses. A file has these top-level sections:

    base:       optional name (or path) of a config this one extends; sections merge key by key (a name is
                the config of that name beside the file, else the shipped one: a copied config still extends it)
    model:      transformers.BertConfig fields and the model's own options (model_section.py)
    execution:  ipu_packing.execution.ExecutionConfig fields only
    data, optimizer, schedule, training, checkpoint, logging: the dataclasses in sections.py

Every key is checked against its dataclass's fields and their types, so a field added to a dataclass is
a valid key with no change here; an unknown key or a wrong type is a `ConfigError` that names the
dotted key. Command-line overrides are dotted keys with YAML values (`training.steps=20`,
`execution.layers_per_ipu=[3,7,7,7]`), applied left to right (the last one given wins). Files and override
values go through one strict YAML reader (`strict_yaml.yaml_load`): a duplicate key or section, an anchor or alias, a
merge key, nesting beyond MAX_DEPTH, an integer beyond MAX_INT_DIGITS or a file beyond MAX_CONFIG_BYTES is
refused naming the line.
Nothing is rewritten while parsing: values that depend on the dataset's packing factor are derived later
(`RunConfig.batch_accounting`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import typing
from typing import Any, Dict, List, Optional, Sequence, Tuple


from .run_config import RunConfig
from ..errors import ConfigError
from .model_section import check_attention, finite, parse_model, resolve_attention
from .sections import (CheckpointConfig, DataConfig, LoggingConfig, OptimizerConfig, ScheduleConfig, TaskConfig,
                       TrainingConfig)
from .strict_yaml import shown, yaml_load, yaml_load_file

def _config_dir() -> str:
    """configs/ of the checkout this package runs from, recognised as one: its pyproject.toml, beside configs/
    and the package, names the project ipu-packing. Else, for an installed package (`pip install .`), the copy
    pyproject.toml installs as data: share/ipu-packing/configs under sys.prefix, or under the user base of
    `pip install --user`. A site-packages/configs/ beside an installed package is another package's (any
    package may install a top-level configs/), never ours."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    checkout = os.path.join(root, "configs")
    if os.path.isdir(checkout) and _names_this_project(os.path.join(root, "pyproject.toml")):
        return checkout
    candidates = [os.path.join(sys.prefix, "share", "ipu-packing", "configs")]
    try:
        import site

        candidates.append(os.path.join(site.getuserbase(), "share", "ipu-packing", "configs"))
    except (ImportError, AttributeError):  # an embedded interpreter without site
        pass
    return next((c for c in candidates if os.path.isdir(c)), candidates[0])


def _names_this_project(pyproject: str) -> bool:
    """Whether `pyproject` is ipu-packing's own: its [project] section's name is "ipu-packing"."""
    try:
        with open(pyproject, "r", encoding="utf-8") as f:
            text = f.read(1 << 16)
    except (OSError, UnicodeDecodeError):
        return False
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            section = stripped
        elif section == "[project]" and re.match(r"""^name\s*=\s*["']ipu-packing["']\s*(#.*)?$""", stripped):
            return True
    return False


CONFIG_DIR = _config_dir()
DEFAULT_CONFIG = "demo"

_SECTIONS = {
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "training": TrainingConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
    "task": TaskConfig,
}
_TOP_KEYS = ("base", "model", "execution") + tuple(_SECTIONS)


def available_configs() -> List[str]:
    """Names of the configs shipped in configs/."""
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(f[: -len(".yaml")] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))


def resolve_config_path(name_or_path: str) -> str:
    if os.sep in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        path = name_or_path
    else:
        path = os.path.join(CONFIG_DIR, name_or_path + ".yaml")
    if not os.path.lexists(path):
        raise ConfigError(
            "config %r not found (%s); shipped configs: %s" % (name_or_path, path, ", ".join(available_configs()))
        )
    return path


def load_config(name_or_path: str = DEFAULT_CONFIG, overrides: Sequence[str] = ()) -> RunConfig:
    """Parse configs/NAME.yaml (or a path) plus dotted `key=value` overrides into a RunConfig."""
    path = resolve_config_path(name_or_path)
    raw, own_model = _read_with_bases(path, seen=())
    explicit = list(own_model)
    for item in overrides:
        key = _apply_override(raw, item)
        if key.startswith("model.") and key[len("model."):] not in explicit:
            explicit.append(key[len("model."):])
    name = os.path.splitext(os.path.basename(path))[0]
    return config_from_dict(raw, name=name, explicit_model_keys=tuple(explicit))


def config_from_dict(raw: Dict[str, Any], name: str = "custom",
                     explicit_model_keys: Optional[Tuple[str, ...]] = None) -> RunConfig:
    """Build a RunConfig from an already merged dict (no `base`). ``explicit_model_keys``: the `model:` keys the
    user set (load_config: the named file's own and the command line's; None: every key of the dict's)."""
    from ipu_packing.execution import ExecutionConfig

    raw = dict(raw)
    raw.pop("base", None)
    for key in raw:
        if key not in _TOP_KEYS:
            raise ConfigError("unknown config section %r (expected one of: %s)" % (key, ", ".join(_TOP_KEYS)))
    model = parse_model(raw.get("model") or {})
    execution_raw = raw.get("execution") or {}
    execution = _build("execution", ExecutionConfig, execution_raw)
    sections = {key: _build(key, cls, raw.get(key) or {}) for key, cls in _SECTIONS.items()}
    # "auto" (the default) becomes the attention this execution trains fastest with: the config records the choice
    model["packed_attention"] = resolve_attention(model, execution, sections["data"].max_seq_length)
    check_attention(model, execution)
    try:
        return RunConfig(
            name=name,
            model=model,
            execution_spec=execution,
            explicit_execution_keys=tuple(execution_raw),
            explicit_model_keys=tuple(model) if explicit_model_keys is None else tuple(explicit_model_keys),
            **sections
        )
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # a section's own __post_init__
        raise ConfigError(str(exc))


def _read_with_bases(path: str, seen: Tuple[str, ...]) -> Tuple[Dict[str, Any], Tuple[str, ...]]:
    """The file merged over its `base:` chain, and the `model:` keys the file itself sets (not its bases')."""
    real = os.path.realpath(path)
    if real in seen:
        raise ConfigError("config %s extends itself (base cycle)" % (path,))
    raw = yaml_load_file(path, source="config %s" % (path,))  # a FIFO or a device: one line, never a hang
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("config %s must be a mapping of sections, got %s" % (path, type(raw).__name__))
    for key, value in raw.items():
        if key not in _TOP_KEYS:
            raise ConfigError("unknown config section %r in %s (expected one of: %s)"
                              % (key, path, ", ".join(_TOP_KEYS)))
        if key != "base" and value is not None and not isinstance(value, dict):
            raise ConfigError("config section %r in %s must be a mapping" % (key, path))
    base = raw.pop("base", None)
    own_model = tuple(raw.get("model") or ())
    if base is None:
        return raw, own_model
    if not isinstance(base, str):
        raise ConfigError("base in %s must be a config name, got %r" % (path, base))
    if os.sep not in base and not base.endswith((".yaml", ".yml")):  # a name: beside the file, else a shipped one
        candidates = [os.path.join(os.path.dirname(path), base + ".yaml"), os.path.join(CONFIG_DIR, base + ".yaml")]
    else:
        candidates = [os.path.join(os.path.dirname(path), base)]
    base_path = next((c for c in candidates if os.path.lexists(c)), None)
    if base_path is None:
        raise ConfigError("base config %r of %s not found (%s)" % (base, path, " nor ".join(candidates)))
    merged, _ = _read_with_bases(base_path, seen + (real,))
    for key, value in raw.items():
        section = dict(merged.get(key) or {})
        section.update(value or {})
        merged[key] = section
    return merged, own_model


def _apply_override(raw: Dict[str, Any], item: str) -> str:
    """Apply one `section.key=value`; returns "section.key"."""
    if "=" not in item:
        raise ConfigError("override %r must look like section.key=value" % (shown(item),))
    key, _, text = item.partition("=")
    parts = key.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError("override key %r must be section.key, e.g. training.steps=20" % (shown(key),))
    section, name = parts
    if section not in _TOP_KEYS or section == "base":
        raise ConfigError("unknown config section %r in override %r" % (shown(section), shown(item)))
    value = yaml_load(text, source="override %r" % (shown(item),)) if text.strip() else None
    target = dict(raw.get(section) or {})
    target[name] = value
    raw[section] = target
    return "%s.%s" % (section, name)


def _build(section: str, cls: type, raw: Dict[str, Any]):
    """Instantiate dataclass `cls` from `raw`, checking keys and types; errors name section.key."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError("unknown key %s.%s (known: %s)" % (section, key, ", ".join(names)))
        kwargs[key] = _check_type("%s.%s" % (section, key), value, hints[key])
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        message = str(exc)
        if section + "." not in message:
            message = "%s: %s" % (section, message)
        raise ConfigError(message)


def _check_type(key: str, value: Any, hint: Any) -> Any:
    origin = getattr(hint, "__origin__", None)
    args = getattr(hint, "__args__", ()) or ()
    if hint is Any:
        return value
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        for option in args:
            if option is type(None):
                continue
            try:
                return _check_type(key, value, option)
            except ConfigError:
                pass
        raise ConfigError("%s has the wrong type: %r (expected %s)" % (key, value, _type_name(hint)))
    if origin in (list, List, tuple, Tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError("%s must be a list, got %r" % (key, value))
        inner = args[0] if args else Any
        return [_check_type("%s[%d]" % (key, i), v, inner) for i, v in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError("%s must be true or false, got %r" % (key, value))
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError("%s must be an integer, got %r" % (key, value))
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError("%s must be a number, got %r" % (key, value))
        return finite(key, value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError("%s must be a string, got %r" % (key, value))
        return value
    return value


def _type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "")
