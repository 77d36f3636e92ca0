"""The config loader: configs/NAME.yaml (+ `base:` + dotted overrides) -> PretrainingConfig.

YAML is a thin, strict layer over the dataclasses. A file has these top-level sections:

    base:       optional name (or path) of a config this one extends; sections merge key by key
    model:      transformers.BertConfig fields (BERT_CONFIG_FIELDS) and the model's own (MODEL_OPTION_FIELDS)
    execution:  ipu_packing.execution.ExecutionConfig fields only
    data, optimizer, schedule, training, checkpoint, logging: the dataclasses in sections.py

Every key is checked against its dataclass's fields and their types, so a field added to a dataclass is
a valid key with no change here; an unknown key or a wrong type is a `ConfigError` that names the
dotted key. Command-line overrides are dotted keys with YAML values (`training.steps=20`,
`execution.layers_per_ipu=[3,7,7,7]`), applied left to right (the last one given wins). Files and override
values go through one strict YAML reader (`_yaml_load`): a duplicate key or section, an anchor or alias, a
merge key, nesting beyond MAX_DEPTH, an integer beyond MAX_INT_DIGITS or a file beyond MAX_CONFIG_BYTES is
refused naming the line.
Nothing is rewritten while parsing: values that depend on the dataset's packing factor are derived later
(`PretrainingConfig.batch_accounting`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import typing
from typing import Any, Dict, List, Sequence, Tuple

import yaml

from ipu_packing.model.attention import ATTENTION_IMPLEMENTATIONS, missing_torch_support

from .config import PretrainingConfig
from .errors import ConfigError
from .sections import CheckpointConfig, DataConfig, LoggingConfig, OptimizerConfig, ScheduleConfig, TrainingConfig

def _config_dir() -> str:
    """configs/ of the checkout this package runs from; for an installed package (`pip install .`), the copy
    pyproject.toml installs under sys.prefix/share/ipu-packing/configs."""
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
    installed = os.path.join(sys.prefix, "share", "ipu-packing", "configs")
    return checkout if os.path.isdir(checkout) or not os.path.isdir(installed) else installed


CONFIG_DIR = _config_dir()
DEFAULT_CONFIG = "demo"

_SECTIONS = {
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "training": TrainingConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
}
_TOP_KEYS = ("base", "model", "execution") + tuple(_SECTIONS)


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


def _yaml_load(stream: Any, source: str = "value") -> Any:
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
        raise ConfigError("%s is not valid YAML: %s" % (source, _shown(" ".join(str(exc).split()), 300)))
    except (ValueError, OverflowError, RecursionError) as exc:  # a constructor: int() of 5,000 digits
        raise ConfigError("%s holds a value YAML cannot build: %s" % (source, _shown(str(exc), 300)))
    finally:
        loader.dispose()


def _shown(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for an error line (a hostile value may be a megabyte)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    if not os.path.isfile(path):
        raise ConfigError(
            "config %r not found (%s); shipped configs: %s" % (name_or_path, path, ", ".join(available_configs()))
        )
    return path


def load_config(name_or_path: str = DEFAULT_CONFIG, overrides: Sequence[str] = ()) -> PretrainingConfig:
    """Parse configs/NAME.yaml (or a path) plus dotted `key=value` overrides into a PretrainingConfig."""
    path = resolve_config_path(name_or_path)
    raw = _read_with_bases(path, seen=())
    for item in overrides:
        _apply_override(raw, item)
    name = os.path.splitext(os.path.basename(path))[0]
    return config_from_dict(raw, name=name)


def config_from_dict(raw: Dict[str, Any], name: str = "custom") -> PretrainingConfig:
    """Build a PretrainingConfig from an already merged dict (no `base`)."""
    from ipu_packing.execution import ExecutionConfig

    raw = dict(raw)
    raw.pop("base", None)
    for key in raw:
        if key not in _TOP_KEYS:
            raise ConfigError("unknown config section %r (expected one of: %s)" % (key, ", ".join(_TOP_KEYS)))
    model = _parse_model(raw.get("model") or {})
    execution_raw = raw.get("execution") or {}
    execution = _build("execution", ExecutionConfig, execution_raw)
    _check_attention(model, execution)
    sections = {key: _build(key, cls, raw.get(key) or {}) for key, cls in _SECTIONS.items()}
    try:
        return PretrainingConfig(
            name=name,
            model=model,
            execution_spec=execution,
            explicit_execution_keys=tuple(execution_raw),
            **sections
        )
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # a section's own __post_init__
        raise ConfigError(str(exc))


def _read_with_bases(path: str, seen: Tuple[str, ...]) -> Dict[str, Any]:
    real = os.path.realpath(path)
    if real in seen:
        raise ConfigError("config %s extends itself (base cycle)" % (path,))
    with open(path, "rb") as f:
        raw = _yaml_load(f, source="config %s" % (path,))
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
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError("base in %s must be a config name, got %r" % (path, base))
    if os.sep not in base and not base.endswith((".yaml", ".yml")):
        base_path = os.path.join(os.path.dirname(path), base + ".yaml")
    else:
        base_path = os.path.join(os.path.dirname(path), base)
    if not os.path.isfile(base_path):
        raise ConfigError("base config %r of %s not found (%s)" % (base, path, base_path))
    merged = _read_with_bases(base_path, seen + (real,))
    for key, value in raw.items():
        section = dict(merged.get(key) or {})
        section.update(value or {})
        merged[key] = section
    return merged


def _apply_override(raw: Dict[str, Any], item: str) -> None:
    if "=" not in item:
        raise ConfigError("override %r must look like section.key=value" % (_shown(item),))
    key, _, text = item.partition("=")
    parts = key.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError("override key %r must be section.key, e.g. training.steps=20" % (_shown(key),))
    section, name = parts
    if section not in _TOP_KEYS or section == "base":
        raise ConfigError("unknown config section %r in override %r" % (_shown(section), _shown(item)))
    value = _yaml_load(text, source="override %r" % (_shown(item),)) if text.strip() else None
    target = dict(raw.get(section) or {})
    target[name] = value
    raw[section] = target


# transformers.BertConfig's own constructor arguments and their defaults (transformers 4.x; kept
# here so that parsing a config does not import transformers; tests/test_configs.py checks the list
# against the installed transformers).
BERT_CONFIG_FIELDS = (
    ("vocab_size", 30522),
    ("hidden_size", 768),
    ("num_hidden_layers", 12),
    ("num_attention_heads", 12),
    ("intermediate_size", 3072),
    ("hidden_act", "gelu"),
    ("hidden_dropout_prob", 0.1),
    ("attention_probs_dropout_prob", 0.1),
    ("max_position_embeddings", 512),
    ("type_vocab_size", 2),
    ("initializer_range", 0.02),
    ("layer_norm_eps", 1e-12),
    ("pad_token_id", 0),
    ("position_embedding_type", "absolute"),
    ("use_cache", True),
    ("classifier_dropout", None),
)


# The packed model's own options, set on the BertConfig as attributes (saved in config.json, which
# transformers ignores): ipu_packing/model/self_attention.py FUSED_QKV_ATTRIBUTE, and
# ipu_packing/model/attention.py CONFIG_ATTRIBUTE (dense, sdpa, varlen or flex: the same function of the
# weights, so a run may resume with another one).
MODEL_OPTION_FIELDS = (
    ("fused_qkv", False),
    ("packed_attention", "dense"),
)


def _parse_model(raw: Dict[str, Any]) -> Dict[str, Any]:
    defaults = dict(BERT_CONFIG_FIELDS + MODEL_OPTION_FIELDS)
    allowed = [name for name, _ in BERT_CONFIG_FIELDS]
    own = [name for name, _ in MODEL_OPTION_FIELDS]
    out = {}
    for key, value in raw.items():
        if key not in defaults:
            raise ConfigError("unknown key model.%s (transformers.BertConfig fields: %s; the model's own: %s)"
                              % (key, ", ".join(allowed), ", ".join(own)))
        default = defaults[key]
        if default is None:  # classifier_dropout: a number or null
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError("model.%s must be a number or null, got %r" % (key, value))
            if value is not None:
                value = _finite("model." + key, value)
        elif value is None:
            raise ConfigError("model.%s must not be null" % (key,))
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError("model.%s must be true or false, got %r" % (key, value))
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError("model.%s must be an integer, got %r" % (key, value))
            if value < 0:
                raise ConfigError("model.%s must be >= 0, got %r" % (key, value))
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError("model.%s must be a number, got %r" % (key, value))
            value = _finite("model." + key, value)
        elif isinstance(default, str):
            if not isinstance(value, str):
                raise ConfigError("model.%s must be a string, got %r" % (key, value))
        out[key] = value
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if key in out and out[key] < 1:
            raise ConfigError("model.%s must be >= 1, got %r" % (key, out[key]))
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
        if out.get(key) is not None and not 0.0 <= out[key] <= 1.0:
            raise ConfigError("model.%s is a probability: it must be in [0, 1], got %r" % (key, out[key]))
    if "packed_attention" in out and out["packed_attention"] not in ATTENTION_IMPLEMENTATIONS:
        raise ConfigError("model.packed_attention must be one of %s, got %r"
                          % (", ".join(ATTENTION_IMPLEMENTATIONS), _shown(str(out["packed_attention"]))))
    if "layer_norm_eps" in out and not out["layer_norm_eps"] > 0:
        raise ConfigError("model.layer_norm_eps must be > 0, got %r" % (out["layer_norm_eps"],))
    if "initializer_range" in out and out["initializer_range"] < 0:
        raise ConfigError("model.initializer_range must be >= 0, got %r" % (out["initializer_range"],))
    return out


def _check_attention(model: Dict[str, Any], execution: Any) -> None:
    """Refuse, when the config is read, an attention its execution cannot train with (one line each):
    PopTorch traces the dense path only; FlexAttention has no backward on CPU, no attention dropout, and
    its BlockMask cannot be a pipeline stage's input; varlen's layout is data, which
    torch.compile(fullgraph=True) cannot capture; and the torch this runs on must have the kernel."""
    name = model.get("packed_attention", "dense")
    if name == "dense":
        return
    if execution.backend == "poptorch":
        raise ConfigError(
            "execution.backend 'poptorch' runs attention 'dense' only (PopTorch's supported operations include "
            "neither scaled_dot_product_attention nor FlexAttention), got %r: set model.packed_attention=dense "
            "(the default)" % (name,)
        )
    missing = missing_torch_support(name)
    if missing:
        instead = "varlen, sdpa or dense" if name == "flex" else "dense"
        raise ConfigError("model.packed_attention: %s; use %s" % (missing, instead))
    if name == "varlen" and execution.torch_compile:
        raise ConfigError("model.packed_attention 'varlen' builds its layout from the data, which "
                          "execution.torch_compile (fullgraph) cannot capture: use sdpa or dense with torch_compile")
    if name == "flex":
        where = []
        if execution.device != "cuda":
            where.append("execution.device=cuda (FlexAttention has no backward on CPU)")
        if execution.num_stages > 1:
            where.append("one stage (its BlockMask is not a tensor a pipeline stage can take; use varlen, sdpa "
                         "or dense with execution.layers_per_ipu)")
        if execution.torch_compile:
            where.append("execution.torch_compile=false")
        dropout = model.get("attention_probs_dropout_prob", dict(BERT_CONFIG_FIELDS)["attention_probs_dropout_prob"])
        if dropout:
            where.append("model.attention_probs_dropout_prob=0 (it has no attention dropout; got %r)" % (dropout,))
        if where:
            raise ConfigError("model.packed_attention 'flex' trains only with %s" % "; ".join(where))


def _finite(key: str, value: Any) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError("%s must be a finite number, got %r" % (key, value))
    return value


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
        return _finite(key, value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError("%s must be a string, got %r" % (key, value))
        return value
    return value


def _type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "")
