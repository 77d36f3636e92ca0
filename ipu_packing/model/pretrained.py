"""transformers-format checkpoints: read what transformers' BERT classes save, write what they load.

One machinery for the three packed models, each the counterpart of one transformers class (its
``HF_ARCHITECTURE``): ``PackedBertForPreTraining`` (BertForPreTraining), ``PackedBertForSequenceClassification``
(BertForSequenceClassification) and ``PackedBertForQuestionAnswering`` (BertForQuestionAnswering). Their
parameters carry transformers' names, so a state dict moves between them unchanged; what differs is which
weights a directory may lack (``FRESH_HEAD``: a task head loaded from a pretraining or encoder-only
directory starts from transformers' initialisation, reported) and what ``config.json`` names.

A directory holds ``config.json`` (a ``transformers.BertConfig``) and the weights in one of
``model.safetensors``, ``model.safetensors.index.json`` (shards), ``pytorch_model.bin`` or
``pytorch_model.bin.index.json``, looked for in that order. Nothing is ever downloaded.

Reading accepts the key spellings found in the wild: a ``module.`` prefix (DDP), TF-era ``gamma``/``beta``
LayerNorm names, and a bare ``BertModel`` checkpoint (no ``bert.`` prefix; with ``strict=False`` only,
since the heads are then missing). Tied aliases (``cls.predictions.decoder.weight`` and
``cls.predictions.decoder.bias``) are dropped: the tie supplies them. Writing drops them the same way.
A model with ``config.fused_qkv`` reads and writes transformers' separate query/key/value tensors: its
fused projection concatenates them when loading and ``export_state_dict`` splits it (self_attention.py);
``config.json`` records ``fused_qkv``, which transformers ignores.
"""

from __future__ import annotations

import copy
import os
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch

from .. import jsonin
from .self_attention import FUSED_QKV_ATTRIBUTE, hf_layout

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX_NAME = "model.safetensors.index.json"
BIN_NAME = "pytorch_model.bin"
BIN_INDEX_NAME = "pytorch_model.bin.index.json"
WEIGHT_NAMES = (SAFETENSORS_NAME, BIN_NAME, SAFETENSORS_INDEX_NAME, BIN_INDEX_NAME)
"""The files that hold a directory's weights, any one of which (beside config.json) makes it a model directory."""


def is_hf_dir(path: str) -> bool:
    """Whether ``path`` is a Hugging Face model directory: config.json and weights, by their names (a FIFO or a
    device under one of them is refused in one line when it is read, not taken for another kind of source)."""
    if not os.path.isdir(path) or not os.path.lexists(os.path.join(path, CONFIG_NAME)):
        return False
    return any(os.path.lexists(os.path.join(path, name)) for name in WEIGHT_NAMES)

# Buffers old transformers versions saved; they carry nothing this model needs.
_IGNORED_KEYS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")
_DECODER_WEIGHT = "cls.predictions.decoder.weight"
_DECODER_BIAS = "cls.predictions.decoder.bias"
_BIAS = "cls.predictions.bias"


def _read_weight_file(path: str) -> Dict[str, torch.Tensor]:
    from ..errors import InputError
    from ..fsutil import check_regular

    check_regular(path, InputError)  # a FIFO would block the reader, a device never end
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    return load_tensors(path)


def load_tensors(path: str) -> Any:
    """torch.load(path) without running code (weights_only) and without torch's warnings: a file that
    is refused is reported by the caller in one line, and a warning about its pickle protocol above
    that line would make it two (the one reader of torch files, for weights and step checkpoints)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.load(path, map_location="cpu", weights_only=True)


def read_state_dict(directory: str) -> Dict[str, torch.Tensor]:
    """The raw state dict stored in a transformers-format directory."""
    for single, index in ((SAFETENSORS_NAME, SAFETENSORS_INDEX_NAME), (BIN_NAME, BIN_INDEX_NAME)):
        path = os.path.join(directory, single)
        if os.path.lexists(path):  # _read_weight_file refuses a FIFO or a device under the name
            return _read_weight_file(path)
        path = os.path.join(directory, index)
        if os.path.lexists(path):
            state: Dict[str, torch.Tensor] = {}
            for shard in _index_shards(directory, path):
                state.update(_read_weight_file(shard))
            return state
    raise FileNotFoundError(
        "no weights in %s: expected one of %s"
        % (directory, ", ".join((SAFETENSORS_NAME, SAFETENSORS_INDEX_NAME, BIN_NAME, BIN_INDEX_NAME)))
    )


def _index_shards(directory: str, path: str) -> List[str]:
    """The shard files an index names, each refused unless it is a file name inside ``directory``
    (fsutil.contained_path): an index is a file, and a file does not choose what else is read."""
    from ..errors import InputError, one_line
    from ..fsutil import contained_path

    try:
        index = jsonin.load_path(path)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, nesting, not a regular file
        raise InputError("%s is not a JSON index: %s" % (path, one_line(exc)[:200]))
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError("%s has no weight_map (a mapping of tensor names to shard files)" % (path,))
    shards: Dict[str, str] = {}
    for name in weight_map.values():
        if not isinstance(name, str) or name not in shards:
            shards[name] = contained_path(directory, name, "shard %r in %s" % (name, path))
    return [shards[name] for name in sorted(shards)]


def normalize_keys(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Map the key spellings transformers-era checkpoints use onto this model's names."""
    out: Dict[str, torch.Tensor] = {}
    bare = not any(key.startswith(("bert.", "cls.", "module.")) for key in state)
    for key, value in state.items():
        if key.startswith("module."):
            key = key[len("module.") :]
        if bare:
            key = "bert." + key
        if key.endswith(".gamma"):
            key = key[: -len(".gamma")] + ".weight"
        elif key.endswith(".beta"):
            key = key[: -len(".beta")] + ".bias"
        if key in _IGNORED_KEYS:
            continue
        out[key] = value
    if _BIAS not in out and _DECODER_BIAS in out:
        out[_BIAS] = out[_DECODER_BIAS]
    out.pop(_DECODER_BIAS, None)
    return out


def _aliases(model: Any) -> List[str]:
    """State-dict keys that are another key's tensor under a second name: the MLM decoder's, in a model with
    the pretraining heads (``cls``); none in the task models."""
    if getattr(model, "cls", None) is None:
        return []
    names = [_DECODER_BIAS]
    if model.tied:
        names.append(_DECODER_WEIGHT)
    return names


# transformers.BertConfig's own constructor arguments and their defaults (transformers 4.x; kept here so that
# neither parsing a config (train/model_section.py) nor checking a config.json imports transformers;
# tests/test_configs.py checks the list against the installed transformers).
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


BERT_DEFAULTS = dict(BERT_CONFIG_FIELDS)

MAX_PARAMETERS = 1 << 34
"""The most weights a config.json may describe (bert-large has 3.4e8): a larger one is refused before the model
is built, not left to allocate for minutes and fail with MemoryError."""

# config.json key -> (kind, low, high): ints and floats in [low, high); None: no bound. Absent keys keep
# transformers' defaults.
_CONFIG_VALUES = {
    "vocab_size": (int, 1, 1 << 31), "hidden_size": (int, 1, 1 << 20), "num_hidden_layers": (int, 1, 1 << 12),
    "num_attention_heads": (int, 1, 1 << 12), "intermediate_size": (int, 1, 1 << 22),
    "max_position_embeddings": (int, 1, 1 << 24), "type_vocab_size": (int, 1, 1 << 16),
    "hidden_dropout_prob": (float, 0.0, 1.0), "attention_probs_dropout_prob": (float, 0.0, 1.0),
    "layer_norm_eps": (float, 1e-300, 1.0), "initializer_range": (float, 0.0, 1e3),
    "classifier_dropout": (float, 0.0, 1.0),  # or null: hidden_dropout_prob (transformers)
}
_NULLABLE = ("classifier_dropout",)


def check_config_values(path: str, config: Any) -> Dict[str, Any]:
    """A transformers BERT config.json's values (the parsed object), before a model is built from it: a JSON
    object; sizes integers in range, rates and eps finite in range, hidden_size a multiple of the heads,
    pad_token_id inside the vocabulary, hidden_act a string, model_type bert and position_embedding_type absolute
    where stated, and at most MAX_PARAMETERS weights. Returns it; a bad value is an InputError naming the file and
    the key."""
    from ..errors import InputError

    if not isinstance(config, dict):
        raise InputError("%s: not a JSON object (a transformers BertConfig)" % (path,))
    for key, (kind, low, high) in _CONFIG_VALUES.items():
        if key not in config:
            continue
        value = config[key]
        if value is None and key in _NULLABLE:
            continue
        number = isinstance(value, int) if kind is int else isinstance(value, (int, float))
        if isinstance(value, bool) or not number or not low <= value < high:  # also refuses nan
            raise InputError("%s: %s is %r, expected %s in [%s, %s)" % (path, key, value, kind.__name__, low, high))
    size = lambda key: config.get(key, BERT_DEFAULTS[key])  # noqa: E731  (transformers' defaults)
    hidden, heads = size("hidden_size"), size("num_attention_heads")
    if hidden % heads:
        raise InputError("%s: hidden_size %d is not a multiple of num_attention_heads %d" % (path, hidden, heads))
    vocab = size("vocab_size")
    pad = config.get("pad_token_id", BERT_DEFAULTS["pad_token_id"])
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < vocab):
        raise InputError("%s: pad_token_id is %r, not an id below vocab_size %d" % (path, pad, vocab))
    if "hidden_act" in config and not isinstance(config["hidden_act"], str):
        raise InputError("%s: hidden_act is %r, not the name of an activation" % (path, config["hidden_act"]))
    if config.get("model_type", "bert") != "bert":  # transformers would only warn, and build BERT around its weights
        raise InputError("%s: model_type is %r: a BERT model (model_type 'bert') is expected"
                         % (path, config["model_type"]))
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise InputError("%s: position_embedding_type is %r: the packed model has absolute positions only (each "
                         "sequence's restart at 0)" % (path, config["position_embedding_type"]))
    weights = (hidden * (vocab + size("max_position_embeddings") + size("type_vocab_size"))
               + size("num_hidden_layers") * (4 * hidden * hidden + 2 * hidden * size("intermediate_size")))
    if weights > MAX_PARAMETERS:
        raise InputError("%s: describes about %d weights, over the limit of 2**34 (model/pretrained.py "
                         "MAX_PARAMETERS)" % (path, weights))
    return config


def read_config(directory: str, fused_qkv: Any = None) -> Any:
    """The ``transformers.BertConfig`` of a directory, its values checked first (check_config_values);
    ``fused_qkv`` (when not None) replaces config.json's."""
    from transformers import BertConfig

    config_path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(config_path):
        raise FileNotFoundError("no %s in %s (a transformers BERT directory is expected)" % (CONFIG_NAME, directory))
    check_config_values(config_path, jsonin.load_path(config_path))
    config = BertConfig.from_json_file(config_path)
    if fused_qkv is not None:
        setattr(config, FUSED_QKV_ATTRIBUTE, fused_qkv)
    return config


def load_pretrained(cls: Any, directory: str, attention: Any = None, strict: bool = True, fused_qkv: Any = None,
                    config_overrides: Any = None, output_loading_info: bool = False) -> Any:
    """``cls`` built from a transformers-format directory and its weights copied in.

    ``strict``: every weight of the model in the directory and nothing else (a ValueError naming both
    lists otherwise). Not strict: the model's weights the directory lacks keep their fresh initialisation and
    the directory's weights the model has no place for are not used, both named in one UserWarning; but only
    weights under ``cls.FRESH_HEAD`` may be fresh (a pretraining model: any; a task model: its head, and the
    pooler where it has one), so a directory without the encoder is refused. A tensor of another shape is a
    ValueError naming it. ``config_overrides`` (name -> value) is applied to the config before the model is
    built (a task head's num_labels, id2label, problem_type). ``output_loading_info``: return
    ``(model, {"missing_keys": [...], "unexpected_keys": [...]})`` (transformers' names: the fresh and the
    unused weights) instead of the model."""
    config = read_config(directory, fused_qkv)
    for key, value in (config_overrides or {}).items():
        setattr(config, key, value)
    model = cls(config, attention=attention)
    state = normalize_keys(read_state_dict(directory))
    _, missing, unexpected = _copy_weights(model, state, directory)
    if strict and (missing or unexpected):
        raise ValueError(
            "checkpoint %s does not match %s: missing %s, unexpected %s"
            % (directory, cls.__name__, missing or "none", unexpected or "none")
        )
    allowed = tuple(getattr(cls, "FRESH_HEAD", ("",)))
    absent = [key for key in missing if not key.startswith(allowed)]
    if absent:
        raise ValueError("checkpoint %s lacks weights %s needs besides its head (%s): %s"
                         % (directory, cls.__name__, ", ".join(allowed), ", ".join(absent)))
    if missing or unexpected:  # strict=False: say what was freshly initialised or dropped
        warnings.warn(
            "%s: %d weights not in the checkpoint were initialised at random (%s); %d checkpoint weights "
            "were not used (%s)" % (directory, len(missing), ", ".join(missing) or "none", len(unexpected),
                                    ", ".join(unexpected) or "none"),
            UserWarning,
            stacklevel=3,
        )
    if output_loading_info:
        return model, {"missing_keys": missing, "unexpected_keys": unexpected}
    return model


def load_hf_state_dict(model: Any, state: Dict[str, torch.Tensor], source: str = "the state dict"
                       ) -> Tuple[List[str], List[str], List[str]]:
    """``load_weights`` from a state dict in memory, e.g. a live ``transformers.BertForPreTraining``'s
    ``state_dict()`` (the benches give both models the same weights this way); ``source`` names it in errors."""
    return _copy_weights(model, normalize_keys(state), source)


def _copy_weights(model: Any, state: Dict[str, torch.Tensor], source: str):
    """Copy ``state`` (normalized keys) into ``model`` where names match: (loaded, missing, unexpected), in
    transformers' layout and without tied aliases. A tensor of another shape is a ValueError naming it."""
    aliases = _aliases(model)
    for name in aliases:
        state.pop(name, None)
    own = {key: value for key, value in hf_layout(model.state_dict()).items() if key not in aliases}
    for key, value in state.items():
        if key in own and tuple(value.shape) != tuple(own[key].shape):
            raise ValueError("%s in %s has shape %s, the model wants %s"
                             % (key, source, tuple(value.shape), tuple(own[key].shape)))
    model.load_state_dict({key: value for key, value in state.items() if key in own}, strict=False)
    model.tie_weights()
    return ([key for key in own if key in state], [key for key in own if key not in state],
            [key for key in state if key not in own])


def load_weights(model: Any, directory: str, rows: Any = None,
                 fresh: Tuple[str, ...] = ()) -> Tuple[List[str], List[str], List[str]]:
    """Copy the weights of a transformers-format directory into an existing ``model``, not strictly:
    returns (loaded, missing, unexpected) tensor names, in transformers' layout and without tied aliases:
    those copied, the model's tensors the directory lacks (left as they were: their fresh initialisation)
    and the directory's tensors the model has no place for (not used). A tensor of another shape is a
    ValueError naming it. ``rows`` ({tensor name: row indices}): those tensors' rows taken in that order (a
    classifier's rows mapped to the dataset's label ids); ``fresh``: name prefixes whose tensors are not taken
    (a head the user replaces: they keep their initialisation and count as missing)."""
    state = normalize_keys(read_state_dict(directory))
    for key in [key for key in state if key.startswith(tuple(fresh))] if fresh else ():
        del state[key]
    for key, order in (rows or {}).items():
        if key in state:
            state[key] = state[key][torch.as_tensor(list(order), dtype=torch.long)]
    return _copy_weights(model, state, directory)


def id2label_fault(config: Any) -> Optional[str]:
    """Why a config.json's id2label names no label by id (not an object of integer ids 0 .. N - 1, each a name),
    or None where it does or is absent: transformers refuses a list or a key that is not an integer."""
    id2label = config.get("id2label") if isinstance(config, dict) else None
    if id2label is None:
        return None
    if not isinstance(id2label, dict):
        return "it is a JSON %s" % (type(id2label).__name__,)
    try:
        ids = sorted(int(key) for key in id2label)
    except (TypeError, ValueError):
        return "its keys %s are not all integers" % (", ".join(repr(key) for key in id2label),)
    if ids != list(range(len(ids))):
        return "its ids %s are not 0 .. %d" % (", ".join(map(str, ids)), len(ids) - 1)
    return None


def label2id_mismatch(config: Any) -> Optional[str]:
    """Where a config.json's label2id is not the inverse of its id2label: the first label on which they differ, in
    words ("bad: label2id 0, id2label 1"); None where they agree, or either is absent or without names (run_glue.py
    maps a dataset's labels through label2id, the classifier's rows are id2label's: a model whose two disagree
    holds no one mapping)."""
    names = head_labels(config)
    label2id = config.get("label2id") if isinstance(config, dict) else None
    if names is None or label2id is None:
        return None
    if not isinstance(label2id, dict):
        return "label2id is a JSON %s" % (type(label2id).__name__,)
    inverse = {name: i for i, name in enumerate(names)}
    for name in sorted(set(inverse) | set(label2id), key=str):
        if name not in label2id or name not in inverse or label2id[name] != inverse[name]:
            return "%s: label2id %s, id2label %s" % (name, label2id.get(name, "none"), inverse.get(name, "none"))
    return None


def head_labels(config: Any) -> Any:
    """The label names of a config.json's classifier by id (its id2label), or None where they are transformers'
    defaults (LABEL_0, LABEL_1, ...: no names, as a model saved without labels has)."""
    id2label = config.get("id2label") if isinstance(config, dict) else None
    if not isinstance(id2label, dict) or not id2label:
        return None
    try:
        by_id = {int(key): str(value) for key, value in id2label.items()}
    except (TypeError, ValueError):
        return None
    names = [by_id.get(i) for i in range(len(by_id))]
    if None in names or names == ["LABEL_%d" % i for i in range(len(names))]:
        return None
    return names


def export_state_dict(model: Any) -> Dict[str, torch.Tensor]:
    """transformers' layout: no tied aliases, and a fused ``attention.self.qkv`` split into query, key and
    value (self_attention.hf_layout); loading concatenates them again (BertFusedSelfAttention)."""
    aliases = _aliases(model)
    return hf_layout({
        key: value.detach().cpu().contiguous()
        for key, value in model.state_dict().items()
        if key not in aliases
    })


def save_pretrained(model: Any, directory: str, safe_serialization: bool = True) -> None:
    """config.json (``architectures``: the model's HF_ARCHITECTURE; a task head's num_labels, id2label,
    label2id and problem_type are the config's own fields) + model.safetensors (pytorch_model.bin when
    ``safe_serialization`` is False or safetensors is missing); an existing directory is written into, files
    of the same names replaced."""
    os.makedirs(directory, exist_ok=True)
    config = copy.deepcopy(model.config)
    config.architectures = [getattr(model, "HF_ARCHITECTURE", "BertForPreTraining")]
    config.to_json_file(os.path.join(directory, CONFIG_NAME))
    state = export_state_dict(model)
    if safe_serialization:
        try:
            from safetensors.torch import save_file
        except ImportError:  # e.g. an old Poplar SDK environment: transformers 4.x reads the .bin as well
            warnings.warn("safetensors is not installed; writing %s instead" % BIN_NAME)
            safe_serialization = False
    if safe_serialization:
        save_file(state, os.path.join(directory, SAFETENSORS_NAME), metadata={"format": "pt"})
    else:
        torch.save(state, os.path.join(directory, BIN_NAME))
