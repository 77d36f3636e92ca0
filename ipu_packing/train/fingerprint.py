"""What a run records about itself, and the one comparison a resume or a phase-1 init makes against it.

Every checkpoint's ``dataset`` field (TrainingState.dataset) holds the recorded fingerprint
(`recorded_fingerprint`): the dataset's facts (S, K, vocabulary size and sha256, packs, sequences), its identity
(``content_sha256``: a digest of what the manifest says the data is, its shards' sha256 and counts in order, the
vocabulary, S, K, M and dtypes; no path or corpus location, so a copy of the dataset is the same dataset and
another one with the same S, K and vocabulary is not) and the batch as run (``batch``: packs per optimizer step
and the gradient accumulation derived from the packing factor). Its ``config`` field holds the whole config.

A resume compares all of it with this run (`resume_differences`): every setting that changes what is computed,
namely the dataset's identity and counts, every ``model.*`` key (absent ones at the loader's defaults;
``model.packed_attention`` chooses how attention is computed, not what, and may change), the seed, the
optimizer, the schedule, the step count, the batch (global batch, micro batch, replicas, accounting and the
accumulation as run), the precision and loss scaling, and where the weights started (``checkpoint.init_from``,
``checkpoint.init_override``). Some differences can never be resumed across (`FIXED`: S, K, the vocabulary,
the qkv layout, a checkpoint beyond the step count): those are refused whatever ``checkpoint.resume`` says.
The others are refused in one line naming each key, old -> new, unless ``checkpoint.resume=force``, whose
changes the run directory records (run_dir.py).

A phase-1 init from one of our checkpoints or runs (`init_differences`) compares the architecture
(sections.INIT_ARCHITECTURE_KEYS: activation, LayerNorm eps, sizes, vocabulary, token types, positions) as
a Hugging Face directory's config.json is compared, and its vocabulary (phase1.py). The dataset, seed and
batch are a new run's own: phase 2 trains on other data by design.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ..errors import UserError
from .sections import INIT_ARCHITECTURE_KEYS

Difference = Tuple[str, Any, Any]
"""(dotted key, the checkpoint's value, this run's value)."""

_CONFIG_KEYS = ("optimizer.", "schedule.", "training.steps", "training.global_batch_sequences",
                "training.batch_accounting", "training.seed", "execution.micro_batch_size",
                "execution.replication_factor", "execution.precision", "execution.loss_scaling",
                "checkpoint.init_from", "checkpoint.init_override")
"""Config keys (prefixes) a resume may not change silently, beyond every model.* key."""
RESUMABLE_MODEL_KEYS = ("packed_attention",)
"""model.* keys a resume may change: the attention kernel gives the same function (docs/usage.md)."""
_DATASET_KEYS = ("content_sha256", "num_packs", "num_sequences")
FIXED_DATASET_KEYS = ("max_seq_length", "max_sequences_per_pack", "vocab_size", "vocab_sha256")
"""What the model's shapes and the meaning of its ids depend on: never resumed across, even forced."""


def recorded_fingerprint(data, accounting) -> Dict[str, Any]:
    """The ``dataset`` field every checkpoint of this run holds (``content_sha256``: data/format.py's
    dataset_identity of its manifest)."""
    from ..data.format import dataset_identity

    out = dict(data.fingerprint())
    out["content_sha256"] = dataset_identity(data.manifest)
    out["num_sequences"] = int(data.num_sequences)
    out["batch"] = {"global_batch_packs": int(accounting.global_batch_packs),
                    "gradient_accumulation": int(accounting.gradient_accumulation)}
    return out


def _flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out = {}  # type: Dict[str, Any]
    for key, value in d.items():
        name = prefix + str(key)
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def config_differences(old: Dict[str, Any], new: Dict[str, Any], defaults: Dict[str, Any]) -> List[Difference]:
    """Keys of _CONFIG_KEYS the checkpoint's config records with another value, and every model.* key that
    differs (a key one side leaves out counts at its default: ``defaults``, the loader's model defaults)."""
    a, b = _flatten(old), _flatten(new)
    out = [(k, a[k], b.get(k)) for k in sorted(a) if k.startswith(_CONFIG_KEYS) and a[k] != b.get(k)]
    old_model, new_model = old.get("model") or {}, new.get("model") or {}
    for key in sorted(set(old_model) | set(new_model)):
        if key in RESUMABLE_MODEL_KEYS:
            continue
        was, now = old_model.get(key, defaults.get(key)), new_model.get(key, defaults.get(key))
        if was != now:
            out.append(("model." + key, was, now))
    return out


def resume_differences(state, config_dict: Dict[str, Any], fingerprint: Dict[str, Any],
                       defaults: Dict[str, Any]) -> List[Difference]:
    """Everything the checkpoint ``state`` records that this run (its config as a dict, its
    recorded_fingerprint) would change: config keys, the dataset's identity and counts, the batch as run.
    What an older checkpoint does not record is not compared."""
    out = config_differences(state.config or {}, config_dict, defaults)
    old = state.dataset or {}
    for key in _DATASET_KEYS:
        if key in old and old[key] != fingerprint.get(key):
            out.append(("dataset." + key, old[key], fingerprint.get(key)))
    old_batch = old.get("batch") if isinstance(old.get("batch"), dict) else {}
    for key in sorted(old_batch):
        if old_batch[key] != fingerprint["batch"].get(key):
            out.append(("batch." + key, old_batch[key], fingerprint["batch"].get(key)))
    return out


def _show(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a sha256
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(differences: List[Difference]) -> str:
    """"model.hidden_act 'gelu' -> 'relu', training.seed 42 -> 7"."""
    return ", ".join("%s %s -> %s" % (key, _show(old), _show(new)) for key, old, new in differences)


def check_fixed(config, fingerprint: Dict[str, Any], state, path: str) -> None:
    """Refuse (UserError, one line), whatever checkpoint.resume says, what no resume can cross: another S, K or
    vocabulary, another qkv layout (the optimizer's moments are per tensor), a checkpoint beyond the step count."""
    old = state.dataset or {}
    for key in FIXED_DATASET_KEYS:
        if key in old and old[key] != fingerprint.get(key):
            raise UserError("checkpoint %s was trained on a dataset with %s=%r, this dataset has %r"
                            % (path, key, old[key], fingerprint.get(key)))
    fused = bool(((state.config or {}).get("model") or {}).get("fused_qkv", False))
    if fused != bool(config.model.get("fused_qkv", False)):
        raise UserError(
            "checkpoint %s was trained with model.fused_qkv=%s, this config has %s: the optimizer state does not "
            "carry over; start a new run with checkpoint.init_from=%s (its weights load in either layout)"
            % (path, str(fused).lower(), str(not fused).lower(), path))
    if int(state.step) > config.training.steps:
        raise UserError("checkpoint %s is at step %d, beyond training.steps=%d: it is an earlier, longer run's "
                        "(%s); set checkpoint.output_dir to train this one in a directory of its own"
                        % (path, state.step, config.training.steps, config.run_dir))


def refuse_or_force(differences: List[Difference], path: str, force: bool, record: str) -> None:
    """Refuse a resume that would change what the checkpoint records, unless checkpoint.resume=force (whose
    changes go to ``record``)."""
    if differences and not force:
        raise UserError(
            "checkpoint %s was trained with other values: %s; resuming would mix two runs; use another "
            "checkpoint.output_dir, or checkpoint.resume=force to continue with the new values (recorded in "
            "%s)" % (path, describe(differences), record))


def init_differences(config, state, defaults: Dict[str, Any]) -> List[Difference]:
    """The architecture keys a step checkpoint used as checkpoint.init_from was trained with other values
    of than this config, leaving out those checkpoint.init_override lists."""
    recorded = (state.config or {}).get("model")
    if not isinstance(recorded, dict):
        return []  # an older or foreign checkpoint: its tensors' shapes are still checked
    out = []  # type: List[Difference]
    for key in INIT_ARCHITECTURE_KEYS:
        if "model." + key in config.checkpoint.init_override:
            continue
        was, now = recorded.get(key, defaults[key]), config.model.get(key, defaults[key])
        if was != now:
            out.append(("model." + key, was, now))
    return out


def check_init_matches(config, state, path: str, defaults: Dict[str, Any]) -> None:
    differences = init_differences(config, state, defaults)
    if differences:
        raise UserError(
            "checkpoint.init_from %s was trained with other values: %s; set them to the checkpoint's, or train "
            "with the config's by checkpoint.init_override=[%s]"
            % (path, describe(differences), ",".join(k for k, _, _ in differences)))


__all__ = ["Difference", "RESUMABLE_MODEL_KEYS", "check_fixed", "check_init_matches", "config_differences",
           "describe", "init_differences", "recorded_fingerprint", "refuse_or_force",
           "resume_differences"]
