"""The sections of a pretraining config, one typed dataclass each, with field docs and checks.

configs/NAME.yaml has one mapping per section (`data:`, `optimizer:`, `schedule:`, `training:`,
`checkpoint:`, `logging:`); `loader.py` turns each into the dataclass below, rejecting unknown keys and
wrong types, and `__post_init__` checks the values. `model:` (transformers.BertConfig fields, plus the
model's own `fused_qkv`) and `execution:` (ipu_packing.execution.ExecutionConfig) are defined where they
belong.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from .. import tasks
from ..errors import ConfigError

BATCH_ACCOUNTING = ("accumulation", "betas")
LAYOUTS = ("packed", "padded")
OPTIMIZERS = ("lamb", "adamw")
DECAYS = ("linear", "poly", "constant")
# The model's architecture as a phase-1 Hugging Face directory's config.json states it: taken from there
# by checkpoint.init_from (train/phase1.py).
INIT_ARCHITECTURE_KEYS = ("hidden_act", "layer_norm_eps", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "vocab_size", "type_vocab_size", "max_position_embeddings")
INIT_SETTING_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "initializer_range")
"""What else a phase-1 directory's config.json states and transformers' from_pretrained takes from it: the dropout
rates and the scale of fresh weights. Taken as the architecture is, except that a value the user sets wins."""
INIT_OVERRIDE_VOCAB = "vocab"


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
    split: str = ""
    """A fine-tuning dataset's split the run trains on ("train": DIR/train/packed); empty for pretraining data,
    which has none (DIR/packed)."""

    def __post_init__(self) -> None:
        _choice("data.layout", self.layout, LAYOUTS)
        if self.split and (self.split in (".", "..") or "/" in self.split or os.sep in self.split):
            raise ConfigError("data.split must be a split's name (train, validation, ...), got %r" % (self.split,))
        _positive("data.max_seq_length", self.max_seq_length)
        _positive("data.max_sequences_per_pack", self.max_sequences_per_pack)
        if self.packing_factor_estimate < 1.0:
            raise ConfigError("data.packing_factor_estimate must be >= 1.0, got %r" % (self.packing_factor_estimate,))
        if self.num_workers < 0:
            raise ConfigError("data.num_workers must be >= 0, got %r" % (self.num_workers,))

    @property
    def path(self) -> str:
        """The dataset directory the run reads: DIR/layout, or DIR/split/layout for a fine-tuning split."""
        return self.split_path(self.split)

    def split_path(self, split: str) -> str:
        """The dataset directory of ``split`` (of this layout) under data.dir."""
        return os.path.join(self.dir, split, self.layout) if split else os.path.join(self.dir, self.layout)

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
        if not 0 <= self.seed < 2**63:  # numpy, torch and Python generators all take it
            raise ConfigError("training.seed must be in [0, 2**63), got %r" % (self.seed,))

    # Batch arithmetic, beside the fields it derives from (as litgpt's TrainArgs keeps batch sizes).

    def unpacked_accumulation(self, micro_batch_size: int, replication_factor: int) -> int:
        """Micro batches per replica per step without packing: global batch / (micro * replicas)."""
        per_micro = micro_batch_size * replication_factor
        if self.global_batch_sequences % per_micro:
            raise ConfigError(
                "training.global_batch_sequences %d is not a multiple of execution.micro_batch_size * "
                "execution.replication_factor = %d" % (self.global_batch_sequences, per_micro)
            )
        return self.global_batch_sequences // per_micro

    def gradient_accumulation(self, micro_batch_size: int, replication_factor: int, packing_factor: float) -> int:
        """Micro batches per replica per step as run on data averaging `packing_factor` sequences per pack.
        "accumulation": the unpacked count divided by the factor, rounded to the nearest integer (at least 1);
        "betas": the unpacked count."""
        unpacked = self.unpacked_accumulation(micro_batch_size, replication_factor)
        if self.batch_accounting == "accumulation":
            return max(1, int(math.floor(unpacked / packing_factor + 0.5)))
        return unpacked

    def packs_per_step(self, replication_factor: int, packing_factor: float) -> int:
        """Packs per replica per step that hold ``global_batch_sequences`` on data averaging ``packing_factor``
        sequences a pack: global / (replicas x factor), rounded to the nearest integer (at least 1). The
        "accumulation" step off the IPU, whatever micro batch the config names (BatchAccounting)."""
        return max(1, int(math.floor(self.global_batch_sequences / (replication_factor * packing_factor) + 0.5)))

    def betas(self, betas: Sequence[float], packing_factor: float) -> Tuple[float, float]:
        """The optimizer's (beta1, beta2) as run: "betas" raises each to the packing factor, so the moments
        decay per sequence seen as without packing; "accumulation" keeps them."""
        b1, b2 = betas
        if self.batch_accounting == "betas":
            return (float(b1) ** packing_factor, float(b2) ** packing_factor)
        return (float(b1), float(b2))


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
    checkpoints (a step_*.pt file or a run directory). Only the model weights are taken; from a
    Hugging Face directory the architecture too (INIT_ARCHITECTURE_KEYS, from its config.json, over
    the values a `base:` config gives; a `model:` value the user sets that disagrees is refused, naming
    both), and its dropout rates and initializer range (INIT_SETTING_KEYS, where the user sets none). Its
    vocabulary (the directory's vocab.txt,
    or the vocab_sha256 a checkpoint records) must be the dataset's. Weights the source lacks (e.g. a
    BertModel without the pretraining heads) keep their fresh initialisation; loading says which."""
    init_override: List[str] = field(default_factory=list)
    """What may differ from checkpoint.init_from: `model.KEY` (one of INIT_ARCHITECTURE_KEYS) trains with
    the config's value instead of the checkpoint's; `vocab` starts from a checkpoint trained on another
    vocabulary. E.g. checkpoint.init_override=[model.layer_norm_eps]."""
    resume: str = "auto"
    """"auto": continue from the run directory's latest checkpoint if there is one, refusing a
    checkpoint trained with other optimizer, schedule, step-count or batch values;
    "force": the same, but continue with the new values (both configs are kept in the run directory);
    "never": refuse to start in a run directory that has checkpoints; or a checkpoint path."""
    export: bool = True
    """Write the final model as a Hugging Face directory (run_dir/final)."""

    def __post_init__(self) -> None:
        if self.every_steps < 0:
            raise ConfigError("checkpoint.every_steps must be >= 0, got %r" % (self.every_steps,))
        _positive("checkpoint.keep", self.keep)
        allowed = ["model." + key for key in INIT_ARCHITECTURE_KEYS] + [INIT_OVERRIDE_VOCAB]
        for item in self.init_override:
            if item not in allowed:
                raise ConfigError("checkpoint.init_override: %r is not one of %s" % (item, ", ".join(allowed)))


TASKS = tasks.NAMES


@dataclass
class TaskConfig:
    name: str = tasks.PRETRAINING.name
    """What the run trains: a task's name (tasks/; the default, pretraining: MLM and NSP on prepared text); a
    fine-tuning task trains on a dataset of its own (`prepare --task NAME`), each recipe saying what it trains."""
    eval_split: str = "validation"
    """The split (under data.dir) a fine-tuning run is evaluated on, per example; "" for none."""
    eval_every_steps: int = 0
    """Evaluate every N optimizer steps; 0: only at the end (a fine-tuning run always evaluates at its end)."""
    eval_batch_packs: int = 64
    """Packs per forward pass of the evaluation."""
    replace_head: bool = False
    """Start a new classifier where checkpoint.init_from's classifier does not fit the dataset's labels (its
    label2id names other labels, or another number of them): transformers' ignore_mismatched_sizes. Without it
    such a head is refused; the same names in another order are always mapped through its label2id, as
    run_glue.py maps them."""

    def __post_init__(self) -> None:
        _choice("task.name", self.name, TASKS)
        if self.eval_every_steps < 0:
            raise ConfigError("task.eval_every_steps must be >= 0, got %r" % (self.eval_every_steps,))
        _positive("task.eval_batch_packs", self.eval_batch_packs)
        if self.eval_split and (self.eval_split in (".", "..") or "/" in self.eval_split):
            raise ConfigError("task.eval_split must be a split's name, got %r" % (self.eval_split,))

    @property
    def fine_tuning(self) -> bool:
        return tasks.TASKS[self.name].fine_tuning


@dataclass
class LoggingConfig:
    progress_bar: bool = True
    tensorboard: bool = True
    """Write TensorBoard event files to run_dir/tensorboard (skipped with a note if unavailable)."""
    jsonl: bool = True
    """Append one JSON object per step to run_dir/metrics.jsonl."""


def _choice(key: str, value: str, options: Sequence[str]) -> None:
    if value not in options:
        raise ConfigError("%s must be one of %s, got %r" % (key, ", ".join(options), value))


def _positive(key: str, value: int) -> None:
    if value < 1:
        raise ConfigError("%s must be >= 1, got %r" % (key, value))
