"""Typed pretraining configs: configs/NAME.yaml -> PretrainingConfig.

A config file has these top-level sections, each parsed into a dataclass:

    base:       optional name (or path) of a config this one extends; sections merge key by key
    model:      transformers.BertConfig fields only
    execution:  ipu_packing.execution.ExecutionConfig fields only
    data:       DataConfig        which prepared dataset, and its shape
    optimizer:  OptimizerConfig   LAMB (or AdamW) hyperparameters
    schedule:   ScheduleConfig    warm-up, then linear / poly / constant
    training:   TrainingConfig    steps, global batch in *sequences*, packing batch accounting, seed
    checkpoint: CheckpointConfig  where runs go, how often to save, phase-1 init, resume
    logging:    LoggingConfig     progress bar, TensorBoard, JSON lines

Unknown keys and wrong types are `ConfigError`s that name the dotted key. Command-line overrides
are dotted keys with YAML values (`training.steps=20`, `execution.layers_per_ipu=[3,7,7,7]`).

Nothing is rewritten while parsing. Values that depend on the measured packing factor of the
dataset (gradient accumulation as run, LAMB betas) are computed in one place, `BatchAccounting`,
from the parsed config and the factor, and the run logs them.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from .errors import ConfigError

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
DEFAULT_CONFIG = "demo"

BATCH_ACCOUNTING = ("accumulation", "betas")
LAYOUTS = ("packed", "padded")
OPTIMIZERS = ("lamb", "adamw")
DECAYS = ("linear", "poly", "constant")


# --------------------------------------------------------------------------------------------
# Sections that belong to the application
# --------------------------------------------------------------------------------------------


@dataclass
class DataConfig:
    dir: str = "output/data/demo_128"
    """Prepared data root, as written by `python -m ipu_packing.data prepare --output DIR`
    (holds packed/ and padded/). Relative paths are relative to the working directory."""
    layout: str = "packed"
    """"packed" (DIR/packed) or "padded" (DIR/padded: the baseline, one sequence per row)."""
    max_seq_length: int = 128
    """S of the model's input; the dataset's manifest must agree."""
    max_sequences_per_pack: int = 3
    """K of the packed dataset (the padded one always has K = 1); the manifest must agree."""
    packing_factor_estimate: float = 1.0
    """Sequences per pack assumed where no dataset is opened (--dry-run). Training always uses
    the dataset's measured factor."""
    num_workers: int = 0
    """DataLoader worker processes."""

    def __post_init__(self) -> None:
        _choice("data.layout", self.layout, LAYOUTS)
        _positive("data.max_seq_length", self.max_seq_length)
        _positive("data.max_sequences_per_pack", self.max_sequences_per_pack)
        if self.packing_factor_estimate < 1.0:
            raise ConfigError("data.packing_factor_estimate must be >= 1.0, got %r" % (self.packing_factor_estimate,))
        if self.num_workers < 0:
            raise ConfigError("data.num_workers must be >= 0, got %r" % (self.num_workers,))

    @property
    def path(self) -> str:
        """The dataset directory the run reads."""
        return os.path.join(self.dir, self.layout)

    @property
    def expected_sequences_per_pack(self) -> int:
        return 1 if self.layout == "padded" else self.max_sequences_per_pack


@dataclass
class OptimizerConfig:
    name: str = "lamb"
    """"lamb" (torch LAMB here, poptorch.optim.LAMB on IPUs) or "adamw"."""
    lr: float = 0.001
    """Peak learning rate (reached at the end of warm-up)."""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    """(beta1, beta2) for one *unpacked* sequence batch; see TrainingConfig.batch_accounting."""
    eps: float = 1e-6
    weight_decay: float = 0.01
    """Decoupled weight decay on matrices; biases and LayerNorm weights get none."""
    bias_correction: bool = True
    """Adam-style bias correction of the moments (Graphcore's "LAMB" vs "LAMBNoBiasCorrection")."""
    trust_ratio_on_bias: bool = False
    """Apply the LAMB trust ratio to biases too. Graphcore's app exempts them (max_weight_norm=0)."""

    def __post_init__(self) -> None:
        _choice("optimizer.name", self.name, OPTIMIZERS)
        if not self.lr > 0:
            raise ConfigError("optimizer.lr must be > 0, got %r" % (self.lr,))
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError("optimizer.betas must be two numbers in [0, 1), got %r" % (self.betas,))
        if not self.eps > 0:
            raise ConfigError("optimizer.eps must be > 0, got %r" % (self.eps,))
        if self.weight_decay < 0:
            raise ConfigError("optimizer.weight_decay must be >= 0, got %r" % (self.weight_decay,))


@dataclass
class ScheduleConfig:
    warmup_fraction: float = 0.1
    """Fraction of training.steps spent warming up linearly from 0 to optimizer.lr."""
    decay: str = "linear"
    """After warm-up: "linear" or "poly" decay to end_lr_fraction * lr, or "constant"."""
    poly_power: float = 1.0
    """Exponent of the poly decay (1.0 is linear)."""
    end_lr_fraction: float = 0.0
    """Learning rate at the last step, as a fraction of the peak."""

    def __post_init__(self) -> None:
        _choice("schedule.decay", self.decay, DECAYS)
        if not 0.0 <= self.warmup_fraction <= 1.0:
            raise ConfigError("schedule.warmup_fraction must be in [0, 1], got %r" % (self.warmup_fraction,))
        if not self.poly_power > 0:
            raise ConfigError("schedule.poly_power must be > 0, got %r" % (self.poly_power,))
        if not 0.0 <= self.end_lr_fraction <= 1.0:
            raise ConfigError("schedule.end_lr_fraction must be in [0, 1], got %r" % (self.end_lr_fraction,))


@dataclass
class TrainingConfig:
    steps: int = 100
    """Optimizer steps."""
    global_batch_sequences: int = 64
    """Sequences per optimizer step without packing (all replicas, all accumulation)."""
    batch_accounting: str = "accumulation"
    """How packing keeps the statistics of a batch of `global_batch_sequences` sequences:
    "accumulation" (paper's option 1): divide gradient accumulation by the packing factor;
    "betas" (paper's option 2): keep accumulation in packs, raise LAMB betas to the packing factor."""
    seed: int = 42
    """Seeds weights (from scratch), dropout and the per-epoch data order."""
    num_threads: int = 0
    """torch intra-op threads on CPU; 0 keeps torch's default. One thread is steadier on a busy
    machine (the demo uses 1: its matrices are too small to gain from more)."""

    def __post_init__(self) -> None:
        _positive("training.steps", self.steps)
        _positive("training.global_batch_sequences", self.global_batch_sequences)
        _choice("training.batch_accounting", self.batch_accounting, BATCH_ACCOUNTING)
        if self.num_threads < 0:
            raise ConfigError("training.num_threads must be >= 0, got %r" % (self.num_threads,))


@dataclass
class CheckpointConfig:
    output_dir: str = ""
    """Run directory (checkpoints, logs, export). Empty: output/runs/<config name>."""
    every_steps: int = 0
    """Save every N steps; 0 saves only at the end."""
    keep: int = 2
    """How many step checkpoints to keep (oldest are deleted after a newer one is written)."""
    init_from: Optional[str] = None
    """Phase-1 weights: a Hugging Face BERT directory (config.json + weights) or one of our
    checkpoints (a step_*.pt file or a run directory). Only the model weights are taken."""
    resume: str = "auto"
    """"auto": continue from the run directory's latest checkpoint if there is one;
    "never": refuse to start in a run directory that has checkpoints; or a checkpoint path."""
    export: bool = True
    """Write the final model as a Hugging Face directory (run_dir/final)."""

    def __post_init__(self) -> None:
        if self.every_steps < 0:
            raise ConfigError("checkpoint.every_steps must be >= 0, got %r" % (self.every_steps,))
        _positive("checkpoint.keep", self.keep)


@dataclass
class LoggingConfig:
    progress_bar: bool = True
    tensorboard: bool = True
    """Write TensorBoard event files to run_dir/tensorboard (skipped with a note if unavailable)."""
    jsonl: bool = True
    """Append one JSON object per step to run_dir/metrics.jsonl."""


# --------------------------------------------------------------------------------------------
# The whole config
# --------------------------------------------------------------------------------------------


@dataclass
class PretrainingConfig:
    name: str
    model: Dict[str, Any]
    """transformers.BertConfig keyword arguments (see `bert_config()`)."""
    execution_spec: Any
    """ipu_packing.execution.ExecutionConfig as written in the `execution:` section. The file does
    not set gradient_accumulation: it is derived from training.global_batch_sequences and the
    packing factor (see `execution` and `batch_accounting`)."""
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    explicit_execution_keys: Tuple[str, ...] = ()
    """Keys the `execution:` section set explicitly (for checks only)."""

    def __post_init__(self) -> None:
        layers = int(self.model.get("num_hidden_layers", 12))
        if "gradient_accumulation" in self.explicit_execution_keys:
            raise ConfigError(
                "execution.gradient_accumulation is derived from training.global_batch_sequences and the "
                "packing factor; set training.global_batch_sequences instead"
            )
        split = list(getattr(self.execution_spec, "layers_per_ipu", []) or [])
        if split and sum(split) != layers:
            raise ConfigError(
                "execution.layers_per_ipu %s sums to %d, but model.num_hidden_layers is %d"
                % (split, sum(split), layers)
            )
        if self.data.max_seq_length > int(self.model.get("max_position_embeddings", 512)):
            raise ConfigError(
                "data.max_seq_length %d exceeds model.max_position_embeddings %d"
                % (self.data.max_seq_length, int(self.model.get("max_position_embeddings", 512)))
            )
        hidden, heads = int(self.model.get("hidden_size", 768)), int(self.model.get("num_attention_heads", 12))
        if hidden % heads:
            raise ConfigError("model.hidden_size %d is not a multiple of model.num_attention_heads %d" % (hidden, heads))
        self.unpacked_accumulation  # raises ConfigError when the batch does not divide

    # ---- derived values (one place) ----

    @property
    def run_dir(self) -> str:
        return self.checkpoint.output_dir or os.path.join("output", "runs", self.name)

    @property
    def nominal_packing_factor(self) -> float:
        """Packing factor assumed before a dataset is opened: 1 for the padded layout."""
        return 1.0 if self.data.layout == "padded" else self.data.packing_factor_estimate

    @property
    def execution(self):
        """ExecutionConfig as run with the nominal packing factor (gradient_accumulation derived).
        Training replaces it with `batch_accounting(measured_factor).execution`."""
        return self.batch_accounting(self.nominal_packing_factor).execution

    @property
    def unpacked_accumulation(self) -> int:
        """Micro batches per replica per step without packing: global batch / (micro * replicas)."""
        ex = self.execution_spec
        per_micro = ex.micro_batch_size * ex.replication_factor
        if self.training.global_batch_sequences % per_micro:
            raise ConfigError(
                "training.global_batch_sequences %d is not a multiple of execution.micro_batch_size * "
                "execution.replication_factor = %d" % (self.training.global_batch_sequences, per_micro)
            )
        return self.training.global_batch_sequences // per_micro

    def bert_config(self):
        import transformers

        return transformers.BertConfig(**self.model)

    def batch_accounting(self, packing_factor: float) -> "BatchAccounting":
        """Accumulation and betas as run, for a dataset with this measured packing factor."""
        return BatchAccounting.derive(self, packing_factor)

    def to_dict(self) -> Dict[str, Any]:
        execution = dataclasses.asdict(self.execution_spec)
        execution.pop("gradient_accumulation", None)
        out = {"name": self.name, "model": dict(self.model), "execution": execution}
        for section in ("data", "optimizer", "schedule", "training", "checkpoint", "logging"):
            out[section] = dataclasses.asdict(getattr(self, section))
        return out


@dataclass(frozen=True)
class BatchAccounting:
    """What packing changes about a step, derived from the config and a measured packing factor.

    Option 1 ("accumulation"): the step keeps about `global_batch_sequences` sequences, so the
    accumulation count is divided by the packing factor, rounded to the nearest integer (Graphcore's
    app rounds up; nearest keeps the step closest to the stated batch).
    Option 2 ("betas"): the step keeps `global_batch_sequences` *packs*, i.e. about
    packing_factor times more sequences, and LAMB's betas become beta ** packing_factor so that the
    moments decay per sequence seen as they would without packing.
    """

    method: str
    packing_factor: float
    unpacked_accumulation: int
    gradient_accumulation: int
    betas: Tuple[float, float]
    execution: Any  # ExecutionConfig with gradient_accumulation as run

    @property
    def global_batch_packs(self) -> int:
        return int(self.execution.global_batch_packs)

    @property
    def expected_sequences_per_step(self) -> float:
        return self.global_batch_packs * self.packing_factor

    @staticmethod
    def derive(config: PretrainingConfig, packing_factor: float) -> "BatchAccounting":
        if not packing_factor >= 1.0:
            raise ConfigError("packing factor must be >= 1.0, got %r" % (packing_factor,))
        unpacked = config.unpacked_accumulation
        b1, b2 = config.optimizer.betas
        method = config.training.batch_accounting
        if method == "accumulation":
            accumulation = max(1, int(math.floor(unpacked / packing_factor + 0.5)))
            betas = (float(b1), float(b2))
        else:
            accumulation = unpacked
            betas = (float(b1) ** packing_factor, float(b2) ** packing_factor)
        execution = dataclasses.replace(config.execution_spec, gradient_accumulation=accumulation)
        return BatchAccounting(method, float(packing_factor), unpacked, accumulation, betas, execution)

    def describe(self) -> str:
        if self.method == "accumulation":
            what = "gradient accumulation %d -> %d (divided by the packing factor)" % (
                self.unpacked_accumulation,
                self.gradient_accumulation,
            )
        else:
            what = "LAMB betas -> (%.6f, %.6f) (raised to the packing factor), accumulation %d" % (
                self.betas[0],
                self.betas[1],
                self.gradient_accumulation,
            )
        return "batch accounting: packing factor %.4f, %s; %d packs/step ~ %.0f sequences/step" % (
            self.packing_factor,
            what,
            self.global_batch_packs,
            self.expected_sequences_per_step,
        )


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

_SECTIONS = {
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "training": TrainingConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
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
    try:
        with open(path, "r", encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        raise ConfigError("config %s is not valid YAML: %s" % (path, " ".join(str(exc).split())))
    except UnicodeDecodeError as exc:
        raise ConfigError("config %s is not UTF-8: %s" % (path, exc))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("config %s must be a mapping of sections, got %s" % (path, type(raw).__name__))
    for key, value in raw.items():
        if key not in _TOP_KEYS:
            raise ConfigError("unknown config section %r in %s (expected one of: %s)" % (key, path, ", ".join(_TOP_KEYS)))
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
        raise ConfigError("override %r must look like section.key=value" % (item,))
    key, _, text = item.partition("=")
    parts = key.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError("override key %r must be section.key, e.g. training.steps=20" % (key,))
    section, name = parts
    if section not in _TOP_KEYS or section == "base":
        raise ConfigError("unknown config section %r in override %r" % (section, item))
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        raise ConfigError("override %r: value is not valid YAML" % (item,))
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


def _parse_model(raw: Dict[str, Any]) -> Dict[str, Any]:
    defaults = dict(BERT_CONFIG_FIELDS)
    allowed = [name for name, _ in BERT_CONFIG_FIELDS]
    out = {}
    for key, value in raw.items():
        if key not in defaults:
            raise ConfigError("unknown key model.%s (transformers.BertConfig fields: %s)" % (key, ", ".join(allowed)))
        default = defaults[key]
        if default is None:  # classifier_dropout: a number or null
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError("model.%s must be a number or null, got %r" % (key, value))
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
            value = float(value)
        elif isinstance(default, str):
            if not isinstance(value, str):
                raise ConfigError("model.%s must be a string, got %r" % (key, value))
        out[key] = value
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if key in out and out[key] < 1:
            raise ConfigError("model.%s must be >= 1, got %r" % (key, out[key]))
    return out


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
        errors = []
        for option in args:
            if option is type(None):
                continue
            try:
                return _check_type(key, value, option)
            except ConfigError as exc:
                errors.append(str(exc))
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
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError("%s must be a string, got %r" % (key, value))
        return value
    return value


def _type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "")


def _choice(key: str, value: str, options: Sequence[str]) -> None:
    if value not in options:
        raise ConfigError("%s must be one of %s, got %r" % (key, ", ".join(options), value))


def _positive(key: str, value: int) -> None:
    if value < 1:
        raise ConfigError("%s must be >= 1, got %r" % (key, value))


def deep_copy_config(config: PretrainingConfig) -> PretrainingConfig:
    return copy.deepcopy(config)
