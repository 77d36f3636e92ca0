"""The `model:` section of a config: transformers.BertConfig's fields and the packed model's own options,
checked without importing transformers (train/loader.py builds the config with it; train/phase1.py reads a
phase-1 config.json's architecture against the same defaults).
"""

from __future__ import annotations

import math
from typing import Any, Dict

from ipu_packing.model.attention import ATTENTION_IMPLEMENTATIONS, missing_torch_support
from ipu_packing.model.pretrained import BERT_CONFIG_FIELDS

from ..errors import ConfigError
from .strict_yaml import shown


# The packed model's own options, set on the BertConfig as attributes (saved in config.json, which
# transformers ignores): ipu_packing/model/self_attention.py FUSED_QKV_ATTRIBUTE, and
# ipu_packing/model/attention.py CONFIG_ATTRIBUTE (dense, sdpa, varlen or flex: the same function of the
# weights, so a run may resume with another one; "auto", the default, is the fastest the execution allows,
# `resolve_attention`, and the config records the one it chose).
AUTO_ATTENTION = "auto"
MODEL_OPTION_FIELDS = (
    ("fused_qkv", False),
    ("packed_attention", AUTO_ATTENTION),
)
MODEL_DEFAULTS = dict(BERT_CONFIG_FIELDS + MODEL_OPTION_FIELDS)
"""Every ``model.*`` key's default: a key a config leaves out has this value."""


def parse_model(raw: Dict[str, Any]) -> Dict[str, Any]:
    defaults = MODEL_DEFAULTS
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
                value = finite("model." + key, value)
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
            value = finite("model." + key, value)
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
    choices = (AUTO_ATTENTION,) + ATTENTION_IMPLEMENTATIONS
    if "packed_attention" in out and out["packed_attention"] not in choices:
        raise ConfigError("model.packed_attention must be one of %s, got %r"
                          % (", ".join(choices), shown(str(out["packed_attention"]))))
    if "layer_norm_eps" in out and not out["layer_norm_eps"] > 0:
        raise ConfigError("model.layer_norm_eps must be > 0, got %r" % (out["layer_norm_eps"],))
    if "initializer_range" in out and out["initializer_range"] < 0:
        raise ConfigError("model.initializer_range must be >= 0, got %r" % (out["initializer_range"],))
    return out


LONG_SEQUENCES = 256
"""From this S on, ``auto`` trains with varlen on CPU (below it, sdpa): docs/results.md, the default attention."""


def resolve_attention(model: Dict[str, Any], execution: Any, max_seq_length: int) -> str:
    """The attention a config trains with: ``model.packed_attention`` as written, or, for ``auto``, the fastest
    exact one this execution allows, by measurement (docs/results.md, "The default attention"):

    - poptorch: dense (PopTorch traces no other);
    - torch with torch_compile: sdpa (varlen's layout is data, which fullgraph cannot capture);
    - torch on CUDA: sdpa (the fused kernels with the block-diagonal mask; on an H200 at S=512 under bf16 they
      trained demo_512 3.2x as fast as varlen's jagged kernels and ran the BERT-Base peers step 4.6x as fast:
      make gpu-check);
    - torch on CPU from S = LONG_SEQUENCES: varlen (each sequence attends within itself: sum(l_i^2) scores, not
      S^2);
    - torch on CPU below that: sdpa (the one fused kernel; varlen's one call per distinct length does not pay
      at short S);

    each falling back to the next (sdpa, then dense) where this torch lacks the kernel."""
    name = model.get("packed_attention", AUTO_ATTENTION)
    if name != AUTO_ATTENTION:
        return name
    if execution.backend == "poptorch":
        return "dense"
    if execution.torch_compile:
        candidates = ("sdpa", "dense")
    elif execution.device == "cpu" and max_seq_length >= LONG_SEQUENCES:
        candidates = ("varlen", "sdpa", "dense")
    else:
        candidates = ("sdpa", "dense")
    return next(c for c in candidates if c == "dense" or not missing_torch_support(c))


def check_attention(model: Dict[str, Any], execution: Any) -> None:
    """Refuse, when the config is read, an attention its execution cannot train with (one line each):
    PopTorch traces the dense path only; FlexAttention has no backward on CPU, no attention dropout, and
    its BlockMask cannot be a pipeline stage's input; varlen's layout is data, which
    torch.compile(fullgraph=True) cannot capture; and the torch this runs on must have the kernel."""
    name = model.get("packed_attention", AUTO_ATTENTION)
    if name in ("dense", AUTO_ATTENTION):
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
        dropout = model.get("attention_probs_dropout_prob", MODEL_DEFAULTS["attention_probs_dropout_prob"])
        if dropout:
            where.append("model.attention_probs_dropout_prob=0 (it has no attention dropout; got %r)" % (dropout,))
        if where:
            raise ConfigError("model.packed_attention 'flex' trains only with %s" % "; ".join(where))


def finite(key: str, value: Any) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError("%s must be a finite number, got %r" % (key, value))
    return value
