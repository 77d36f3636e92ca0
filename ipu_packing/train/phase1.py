"""Phase 2 from phase 1: `checkpoint.init_from`, its architecture, its vocabulary and its weights.

A Hugging Face BertForPreTraining directory states the model it holds in config.json. Its architecture
(sections.INIT_ARCHITECTURE_KEYS: activation, LayerNorm eps, sizes, vocabulary, token types, positions) is
taken from there when the config is parsed (`apply_init_architecture`), so that a phase 2 started from
bert-large-uncased keeps its `layer_norm_eps` 1e-12 and `hidden_act` instead of the YAML's. A `model:` value
that disagrees is refused, naming the key and both values, unless `checkpoint.init_override` lists it.

Before the weights load, the source's vocabulary must be the dataset's (`check_init_from`): the directory's
vocab.txt, or the vocab_sha256 one of our checkpoints records; `checkpoint.init_override=[vocab]` starts
from it anyway. Loading (`load_init_from`) keeps the fresh initialisation of the weights the source lacks
(a bare BertModel has no pretraining heads) and prints one line: what was loaded, from where, and which
weights were initialised fresh.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import torch

from ..model.pretrained import check_config_values
from . import checkpoint as ckpt
from .. import jsonin
from ..errors import one_line
from ..fsutil import sha256_file
from ..errors import ConfigError, UserError
from .fingerprints import check_init_matches
from .sections import INIT_ARCHITECTURE_KEYS, INIT_OVERRIDE_VOCAB, CheckpointConfig


def _hf_config(directory: str) -> Dict[str, Any]:
    """config.json of a Hugging Face directory, each architecture key with transformers' default where it
    is absent (as transformers itself would build the model)."""
    from .model_section import BERT_CONFIG_FIELDS

    path = os.path.join(directory, "config.json")
    try:
        with open(path, "r", encoding="utf-8") as f:
            raw = jsonin.load(f)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError("checkpoint.init_from %s: cannot read config.json (%s)" % (directory, " ".join(
            str(exc).split())))
    if not isinstance(raw, dict):
        raise ConfigError("checkpoint.init_from %s: config.json is not a JSON object" % (path,))
    check_config_values(path, raw)  # every value in range before the architecture is taken from it
    defaults = dict(BERT_CONFIG_FIELDS)
    return {key: raw.get(key, defaults[key]) for key in INIT_ARCHITECTURE_KEYS}


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def apply_init_architecture(model: Dict[str, Any], checkpoint: CheckpointConfig) -> Dict[str, Any]:
    """The `model:` section with the architecture of checkpoint.init_from when it is a Hugging Face
    directory; a key the config sets to another value is a ConfigError unless checkpoint.init_override
    lists it (then the config's value stays). Anything else as it was (a step checkpoint states no
    architecture apart from its tensors' shapes, which loading checks)."""
    source = checkpoint.init_from
    if not source or not ckpt.is_hf_dir(source):
        return model
    stated = _hf_config(source)
    out = dict(model)
    disagree = []
    for key in INIT_ARCHITECTURE_KEYS:
        if "model." + key in checkpoint.init_override:
            continue
        if key in model and model[key] != stated[key]:
            disagree.append("model.%s is %s in the config but %s in its config.json"
                            % (key, _show(model[key]), _show(stated[key])))
        out[key] = stated[key]
    if disagree:
        raise ConfigError(
            "checkpoint.init_from %s: %s; the architecture comes from the phase-1 model: drop the value or set it "
            "to the checkpoint's, or train with the config's by checkpoint.init_override=[%s]"
            % (source, "; ".join(disagree), ",".join(item.split(" ")[0] for item in disagree)))
    return out


def check_init_from(config, data) -> None:
    """Before the dataset is opened: the source exists, and a Hugging Face directory's vocab.txt is the
    dataset's (a step checkpoint's vocabulary is checked when it is read, in `load_init_from`)."""
    source = config.checkpoint.init_from
    if not os.path.exists(source):
        raise UserError("checkpoint.init_from %s does not exist" % (source,))
    vocab = os.path.join(source, "vocab.txt")
    if ckpt.is_hf_dir(source) and os.path.isfile(vocab) and data.vocab_sha256 is not None:
        _check_vocab(config, data, sha256_file(vocab), vocab)


def _check_vocab(config, data, sha256: Optional[str], what: str) -> None:
    if sha256 is None or data.vocab_sha256 is None or sha256 == data.vocab_sha256:
        return
    if INIT_OVERRIDE_VOCAB in config.checkpoint.init_override:
        return
    raise UserError(
        "dataset %s was built with another vocabulary than the model: %s differs from %s (vocab_sha256 %s vs "
        "%s); prepare the data with the phase-1 vocab.txt (prepare --vocab), or start from it anyway with "
        "checkpoint.init_override=[vocab]" % (data.path, what, data.vocab_path, sha256[:12], data.vocab_sha256[:12]))


def _names(keys: List[str]) -> str:
    return ", ".join(keys) if keys else "none"


def _first_process() -> bool:
    """Rank 0 of a torchrun launch, or a single process: the one that prints."""
    return os.environ.get("RANK", "0") == "0"


def load_init_from(config, data, model: torch.nn.Module, model_cls) -> str:
    """Load checkpoint.init_from's weights into `model` (built from `config`); prints the one line it
    returns (on the first process only)."""
    source = config.checkpoint.init_from
    if ckpt.is_hf_dir(source):
        from ipu_packing.model.pretrained import load_weights

        try:
            loaded, missing, unexpected = load_weights(model, source)
        except ValueError as exc:
            overridden = [item for item in config.checkpoint.init_override if item.startswith("model.")]
            raise UserError("checkpoint.init_from does not fit the model config: %s%s"
                            % (exc, " (checkpoint.init_override=[%s] keeps the config's values)"
                               % ",".join(overridden) if overridden else ""))
        except Exception as exc:  # a broken weight file: safetensors, torch and json raise their own types
            raise UserError("cannot load phase-1 weights from %s (%s: %s)"
                            % (source, type(exc).__name__, one_line(exc)[:300]))
        bert = config.bert_config()
        line = ("phase-1 weights: %d tensors from the Hugging Face directory %s (%d layers, hidden %d, %d heads, "
                "intermediate %d, vocabulary %d, hidden_act %s, layer_norm_eps %g); initialised fresh: %s; "
                "not used: %s" % (len(loaded), source,
                                  bert.num_hidden_layers, bert.hidden_size, bert.num_attention_heads,
                                  bert.intermediate_size, bert.vocab_size, bert.hidden_act, bert.layer_norm_eps,
                                  _names(missing), _names(unexpected)))
    else:
        path = source
        if os.path.isdir(source):
            path = ckpt.latest_checkpoint(source)
            if path is None:
                raise UserError("checkpoint.init_from %s holds neither a Hugging Face BERT (config.json + "
                                "weights) nor checkpoints" % (source,))
        state = ckpt.load_checkpoint(path)
        _check_vocab(config, data, (state.dataset or {}).get("vocab_sha256"), path)
        from .model_section import BERT_CONFIG_FIELDS, MODEL_OPTION_FIELDS

        # its recorded architecture: activation, eps, sizes (fingerprints.py)
        check_init_matches(config, state, path, dict(BERT_CONFIG_FIELDS + MODEL_OPTION_FIELDS))
        ckpt.check_state_shapes(model, state.model, path)
        model.load_state_dict(state.model)
        line = "phase-1 weights: %d tensors from step %d of %s; initialised fresh: none" % (
            len(state.model), int(state.step), path)
    if _first_process():
        print(line, flush=True)
    return line
