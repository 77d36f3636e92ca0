"""Phase 2 from phase 1: `checkpoint.init_from`, its architecture, its vocabulary and its weights.

A Hugging Face BertForPreTraining directory states the model it holds in config.json. Its architecture
(sections.INIT_ARCHITECTURE_KEYS: activation, LayerNorm eps, sizes, vocabulary, token types, positions), and its
dropout rates and initializer range where the user sets none (INIT_SETTING_KEYS), are taken from there when a
run is planned (`with_init_architecture`: planning reads the file, the config object does not), so that a phase 2
started from bert-large-uncased keeps its `layer_norm_eps` 1e-12 and `hidden_act` instead of those a `base:`
config gives. A `model:` architecture value the user sets (the named config file's own, or the command line's)
that disagrees is refused, naming the key and both values, unless `checkpoint.init_override` lists it.

Before the weights load, the source's vocabulary must be the dataset's (`check_init_from`): the directory's
vocab.txt, or the vocab_sha256 one of our checkpoints records; `checkpoint.init_override=[vocab]` starts
from it anyway. Loading (`load_init_from`) keeps the fresh initialisation of the weights the source lacks
(a bare BertModel has no pretraining heads) and prints one line: what was loaded, from where, and which
weights were initialised fresh.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..model.pretrained import check_config_values, is_hf_dir
from .. import jsonin, tasks
from ..errors import one_line
from ..data.vocab import vocab_path_difference
from ..errors import ConfigError, UserError
from .fingerprint import check_init_matches
from .model_section import MODEL_DEFAULTS
from .run_dir import RunDirectory
from .sections import INIT_ARCHITECTURE_KEYS, INIT_OVERRIDE_VOCAB, INIT_SETTING_KEYS
from .state import TrainingState


def _hf_config(directory: str) -> Dict[str, Any]:
    """config.json of a Hugging Face directory, each architecture key with transformers' default where it
    is absent (as transformers itself would build the model)."""
    path = os.path.join(directory, "config.json")
    try:
        raw = jsonin.load_path(path, error=ConfigError)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError("checkpoint.init_from %s: cannot read config.json (%s)" % (directory, " ".join(
            str(exc).split())))
    if not isinstance(raw, dict):
        raise ConfigError("checkpoint.init_from %s: config.json is not a JSON object" % (path,))
    check_config_values(path, raw)  # every value in range before the architecture is taken from it
    return {key: raw.get(key, MODEL_DEFAULTS[key]) for key in INIT_ARCHITECTURE_KEYS + INIT_SETTING_KEYS}


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def with_init_architecture(config):
    """``config`` with the architecture of checkpoint.init_from when it is a Hugging Face directory (a new config
    object, checked again): config.json's values replace those a `base:` config gives (a model from scratch's),
    so no `model.*` key need be typed; a key the user sets (the config file's own or the command line's,
    ``RunConfig.explicit_model_keys``) to another value is a ConfigError unless checkpoint.init_override lists it
    (then the config's value stays). The dropout rates and initializer range (INIT_SETTING_KEYS) come from
    config.json too, as transformers' from_pretrained takes them, unless the user sets them. A config.json that
    is no regular file is refused when it is read (a FIFO would block). Anything else as it was (a step checkpoint
    states no architecture apart from its tensors' shapes, which loading checks)."""
    import dataclasses

    model, checkpoint = config.model, config.checkpoint
    source = checkpoint.init_from
    if not source or config.architecture_taken:
        return config
    if not is_hf_dir(source):  # a step checkpoint or a run: its tensors' shapes are checked when it loads
        return dataclasses.replace(config, architecture_taken=True)
    stated = _hf_config(source)
    out = dict(model)
    disagree = []
    for key in INIT_ARCHITECTURE_KEYS:
        if "model." + key in checkpoint.init_override:
            continue
        if key in config.explicit_model_keys and key in model and model[key] != stated[key]:
            disagree.append("model.%s is %s in the config but %s in its config.json"
                            % (key, _show(model[key]), _show(stated[key])))
        out[key] = stated[key]
    for key in INIT_SETTING_KEYS:  # dropout and initializer range: the user's value, where set, wins
        if key not in config.explicit_model_keys:
            out[key] = stated[key]
    if disagree:
        raise ConfigError(
            "checkpoint.init_from %s: %s; the architecture comes from the %s model: drop the value or set it "
            "to the checkpoint's, or train with the config's by checkpoint.init_override=[%s]"
            % (source, "; ".join(disagree), source_name(config), ",".join(item.split(" ")[0] for item in disagree)))
    return dataclasses.replace(config, model=out, architecture_taken=True)


def check_init_exists(config) -> None:
    """checkpoint.init_from, where set, exists: checked once the dataset is found and before it is compared with
    the architecture (an absent source gives none, so the `base:` config's would be compared and refused as
    'another vocabulary'), on a resume too (the architecture still comes from it)."""
    source = config.checkpoint.init_from
    if source and not os.path.exists(source):
        raise UserError("checkpoint.init_from %s does not exist" % (source,))


def check_init_from(config, data) -> None:
    """Before the dataset is opened: the source exists, and a Hugging Face directory's vocab.txt is the
    dataset's (a step checkpoint's vocabulary is checked when it is read, in `load_init_from`)."""
    source = config.checkpoint.init_from
    check_init_exists(config)
    if not is_hf_dir(source) or data.vocab_path is None or INIT_OVERRIDE_VOCAB in config.checkpoint.init_override:
        return
    if not os.path.lexists(os.path.join(source, "vocab.txt")):
        raise UserError("checkpoint.init_from %s has no vocab.txt: its vocabulary cannot be checked against the "
                        "dataset's (%s); copy the %s model's vocab.txt beside its config.json, or start from it "
                        "anyway with checkpoint.init_override=[vocab]" % (source, data.vocab_path, source_name(config)))
    difference = vocab_path_difference(source, data.vocab_path)  # by content: the tokens, id by id
    if difference:
        raise UserError("dataset %s was built with another vocabulary than the model: %s; prepare the data with the "
                        "%s model's vocab.txt (prepare --vocab), or start from it anyway with "
                        "checkpoint.init_override=[vocab]" % (data.path, difference, source_name(config)))


def _check_vocab(config, data, sha256: Optional[str], what: str) -> None:
    if sha256 is None or data.vocab_sha256 is None or sha256 == data.vocab_sha256:
        return
    if INIT_OVERRIDE_VOCAB in config.checkpoint.init_override:
        return
    raise UserError(
        "dataset %s was built with another vocabulary than the model: %s differs from %s (vocab_sha256 %s vs "
        "%s); prepare the data with the %s model's vocab.txt (prepare --vocab), or start from it anyway with "
        "checkpoint.init_override=[vocab]" % (data.path, what, data.vocab_path, sha256[:12], data.vocab_sha256[:12],
                                              source_name(config)))


def source_name(config) -> str:
    """What checkpoint.init_from is to this run, as its messages name it: the phase-1 model of a pretraining run
    (phase 2), the pretrained model a fine-tuning run starts from."""
    return "pretrained" if config.task.fine_tuning else "phase-1"


def _names(keys: List[str]) -> str:
    return ", ".join(keys) if keys else "none"


def _first_process() -> bool:
    """Rank 0 of a torchrun launch, or a single process: the one that prints."""
    return os.environ.get("RANK", "0") == "0"


def load_init_from(config, data, model: torch.nn.Module, model_cls) -> str:
    """Load checkpoint.init_from's weights into `model` (built from `config`); prints the one line it
    returns (on the first process only)."""
    source = config.checkpoint.init_from
    if is_hf_dir(source):
        from ipu_packing.model.pretrained import load_weights

        rows, fresh, mapped = classifier_rows(config, model, source)
        try:
            loaded, missing, unexpected = load_weights(model, source, rows, fresh)
        except ValueError as exc:
            overridden = [item for item in config.checkpoint.init_override if item.startswith("model.")]
            raise UserError("checkpoint.init_from does not fit the model config: %s%s"
                            % (exc, " (checkpoint.init_override=[%s] keeps the config's values)"
                               % ",".join(overridden) if overridden else ""))
        except Exception as exc:  # a broken weight file: safetensors, torch and json raise their own types
            raise UserError("cannot load %s weights from %s (%s: %s)"
                            % (source_name(config), source, type(exc).__name__, one_line(exc)[:300]))
        bert = config.bert_config()
        line = ("%s weights: %d tensors from the Hugging Face directory %s (%d layers, hidden %d, %d heads, "
                "intermediate %d, vocabulary %d, hidden_act %s, layer_norm_eps %g); initialised fresh: %s; "
                "not used: %s" % (source_name(config), len(loaded), source,
                                  bert.num_hidden_layers, bert.hidden_size, bert.num_attention_heads,
                                  bert.intermediate_size, bert.vocab_size, bert.hidden_act, bert.layer_norm_eps,
                                  _names(missing), _names(unexpected))) + mapped
        if data.vocab_size < bert.vocab_size:
            from ..data.vocab import tokenizer_fit

            line += "; dataset %s" % (tokenizer_fit(data.vocab_size, bert.vocab_size, data.path),)
    else:
        path = source
        if os.path.isdir(source):
            path = RunDirectory(source).latest()
            if path is None:
                raise UserError("checkpoint.init_from %s holds neither a Hugging Face BERT (config.json + "
                                "weights) nor checkpoints" % (source,))
        state = TrainingState.load(path)
        _check_vocab(config, data, (state.dataset or {}).get("vocab_sha256"), path)
        check_init_matches(config, state, path, MODEL_DEFAULTS)  # its recorded architecture: activation, eps, sizes
        check_state_shapes(model, state.model, path)
        model.load_state_dict(state.model)
        line = "%s weights: %d tensors from step %d of %s; initialised fresh: none" % (
            source_name(config), len(state.model), int(state.step), path)
    if _first_process():
        print(line, flush=True)
    return line


def classifier_rows(config, model: torch.nn.Module, source: str) -> Tuple[Dict[str, List[int]], Tuple[str, ...], str]:
    """How a Hugging Face directory's classifier goes into a fine-tuning model, as run_glue.py takes it: through the
    directory's label2id. (rows to take by tensor, prefixes left fresh, what the load line adds). The same label
    names in another order: the classifier's rows are taken in the dataset's order (a dataset of integer classes
    without names: the names "0", "1", ...); a head saved without names (transformers' LABEL_i) with as many labels:
    as it is; anything else (other names, another number of labels) is refused in one line unless
    task.replace_head starts a new classifier."""
    from ipu_packing.model.pretrained import head_labels, id2label_fault, label2id_mismatch

    raw = jsonin.load_path(os.path.join(source, "config.json"), error=ConfigError)
    architectures = raw.get("architectures") if isinstance(raw, dict) else None
    task = tasks.get(config.task.name)
    if not task.dataset_decides_model or not isinstance(architectures, list) \
            or task.export not in architectures:
        return {}, (), ""
    if config.task.replace_head:
        return {}, ("classifier.",), "; classifier replaced (task.replace_head)"
    fault = id2label_fault(raw)  # else taken for a head without names, its rows kept by index
    mismatch = label2id_mismatch(raw) if fault is None else None  # run_glue.py maps through label2id
    if fault is not None or mismatch is not None:
        raise UserError("checkpoint.init_from %s: %s: correct it, or set task.replace_head=true to start a new "
                        "classifier" % (os.path.join(source, "config.json"),
                                        "its id2label is not {id: name} over the ids 0 .. N - 1 (%s)" % fault
                                        if fault is not None else "its label2id and id2label disagree (%s)" % mismatch))
    theirs = head_labels(raw)
    ours_count = int(model.config.num_labels)
    ours = head_labels({"id2label": model.config.id2label}) or [str(i) for i in range(ours_count)]  # class ids
    their_count = len(theirs) if theirs is not None else len(raw.get("id2label") or {}) or 2
    if theirs is None and their_count == ours_count:  # a head saved without names: its ids are the dataset's
        return {}, (), ""
    if theirs is not None and sorted(theirs) != sorted(ours):
        lowered = [name.lower() for name in theirs]  # run_glue.py compares the model's names lower-cased
        if sorted(lowered) == sorted(ours) and len(set(lowered)) == len(lowered):
            theirs = lowered
    if theirs is not None and sorted(theirs) == sorted(ours):
        if theirs == ours:
            return {}, (), ""
        order = [theirs.index(name) for name in ours]
        return ({"classifier.weight": order, "classifier.bias": order}, (),
                "; classifier rows mapped to the dataset's labels through its label2id (%s)"
                % ", ".join("%s: %d -> %d" % (name, order[i], i) for i, name in enumerate(ours)))

    raise UserError("checkpoint.init_from %s: its classifier's labels (%s) are not the dataset's (%s); set "
                    "task.replace_head=true to start a new classifier (transformers' ignore_mismatched_sizes)"
                    % (source, ", ".join(theirs) if theirs is not None else "%d without names" % their_count,
                       ", ".join(ours)))


def check_state_shapes(model: torch.nn.Module, state: Dict[str, torch.Tensor], source: str) -> None:
    """Refuse (one line) weights whose names or shapes are not the model's, compared in transformers' layout (the
    model loads query/key/value or a fused qkv alike: model.fused_qkv)."""
    from ..model.self_attention import hf_layout

    own, state = hf_layout(model.state_dict()), hf_layout(state)
    missing = [k for k in own if k not in state]
    if missing:
        raise UserError("weights in %s do not match the model: missing %s" % (source, missing[0]))
    for key, value in own.items():
        if tuple(state[key].shape) != tuple(value.shape):
            raise UserError(
                "weights in %s do not match the model config: %s has shape %s, the model wants %s"
                % (source, key, tuple(state[key].shape), tuple(value.shape))
            )
