"""RunConfig: the whole parsed config, and BatchAccounting: what packing changes about a step.

The sections are the dataclasses in sections.py; loader.py reads configs/NAME.yaml into them
(`load_config`). Values that depend on the dataset's measured packing factor (gradient accumulation as
run, LAMB betas) are derived in one place, `BatchAccounting`, from the parsed config and the factor,
using the batch arithmetic on `TrainingConfig`; the run logs them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Tuple

from ipu_packing.execution.placement import check_pipeline_depth, plan_placement
from ipu_packing.model.stages import layer_split

from ..errors import ConfigError
from .sections import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    OptimizerConfig,
    ScheduleConfig,
    TaskConfig,
    TrainingConfig,
)


@dataclass
class RunConfig:
    name: str
    model: Dict[str, Any]
    """transformers.BertConfig keyword arguments, and the model's own options (model_section.MODEL_OPTION_FIELDS), set
    on the BertConfig too (see `bert_config()`)."""
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
    task: TaskConfig = field(default_factory=TaskConfig)
    explicit_execution_keys: Tuple[str, ...] = ()
    """Keys the `execution:` section set explicitly (for checks only)."""
    explicit_model_keys: Tuple[str, ...] = ()
    """The `model:` keys the user set: in the config file named (not inherited through `base:`) or on the command
    line. Where the run starts from a model directory (checkpoint.init_from), its config.json's architecture
    replaces the others (the values a `base:` config gives a model trained from scratch); one of these that differs
    is refused (train/phase1.py ``with_init_architecture``)."""
    architecture_taken: bool = False
    """Whether checkpoint.init_from's architecture was taken (phase1.with_init_architecture): until then, a key the
    config leaves out may come from a phase-1 directory, so the checks that need it wait for planning."""

    def __post_init__(self) -> None:
        """Checks of the values alone: a config object reads no file (a phase-1 directory's architecture is
        taken by planning, train/phase1.py ``with_init_architecture``, which checks the result again)."""
        if "gradient_accumulation" in self.explicit_execution_keys:
            raise ConfigError(
                "execution.gradient_accumulation is derived from training.global_batch_sequences and the "
                "packing factor; set training.global_batch_sequences instead"
            )
        if "micro_batches_per_pass" in self.explicit_execution_keys:
            raise ConfigError("execution.micro_batches_per_pass is derived from execution.pass_memory_mb and the "
                              "model's sizes; set execution.pass_memory_mb instead (0: one micro batch a pass)")
        layers = self._known("num_hidden_layers")
        if layers is not None:
            layer_split(layers, self.execution_spec.layers_per_ipu)  # ConfigError when the split misses layers
        positions = self._known("max_position_embeddings")
        if positions is not None and self.data.max_seq_length > positions:
            raise ConfigError("data.max_seq_length %d exceeds model.max_position_embeddings %d"
                              % (self.data.max_seq_length, positions))
        hidden, heads = self._known("hidden_size"), self._known("num_attention_heads")
        if hidden is not None and heads is not None and hidden % heads:
            raise ConfigError("model.hidden_size %d is not a multiple of model.num_attention_heads %d"
                              % (hidden, heads))
        vocab, factor = self._known("vocab_size"), self.execution_spec.embedding_serialization_factor
        if self.execution_spec.backend == "poptorch" and vocab is not None and vocab % factor:  # as --dry-run says
            raise ConfigError("execution.embedding_serialization_factor %d must divide the vocabulary size %d "
                              "(model.vocab_size)" % (factor, vocab))
        self.unpacked_accumulation  # raises ConfigError when the batch does not divide
        self.execution  # raises ConfigError when a pipeline is too shallow for its accumulation

    def _known(self, key: str) -> Any:
        """``model_value(key)``, or None while a phase-1 directory may still state it."""
        if self.checkpoint.init_from and not self.architecture_taken and key not in self.explicit_model_keys:
            return None
        return self.model_value(key)

    # ---- derived values (one place) ----

    def model_value(self, key: str) -> Any:
        """``model.KEY`` as the model is built: the config's value, else its default (model_section.py, the one
        statement of the BERT defaults)."""
        from .model_section import MODEL_DEFAULTS

        return self.model[key] if key in self.model else MODEL_DEFAULTS[key]


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
        return self.training.unpacked_accumulation(ex.micro_batch_size, ex.replication_factor)

    def bert_config(self, **settings: Any):
        """transformers.BertConfig of model:, with a task's own settings (num_labels, problem_type, label maps)."""
        import transformers

        return transformers.BertConfig(**dict(self.model, **settings))

    def _activation_sizes(self) -> Any:
        """The model's sizes the activation estimate reads (execution/dry_run.py), or None while a phase-1
        directory may still state them."""
        from types import SimpleNamespace

        keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")
        sizes = {k: self._known(k) for k in keys}
        return None if any(v is None for v in sizes.values()) else SimpleNamespace(**sizes)

    def micro_batches_per_pass(self, execution) -> int:
        """How many of ``execution``'s micro batches one pass runs together (execution/dry_run.py
        ``micro_batches_per_pass``); 1 while the model's sizes are not known."""
        from ipu_packing.execution.dry_run import micro_batches_per_pass

        sizes = self._activation_sizes()
        return 1 if sizes is None else micro_batches_per_pass(sizes, execution, self.data.max_seq_length)

    def packs_per_pass(self, execution) -> int:
        """How many packs one torch pass may hold within ``execution.pass_memory_mb`` (execution/dry_run.py
        ``packs_per_pass``); 0 while the model's sizes are not known."""
        from ipu_packing.execution.dry_run import packs_per_pass

        sizes = self._activation_sizes()
        return 0 if sizes is None else packs_per_pass(sizes, execution, self.data.max_seq_length)

    def batch_accounting(self, packing_factor: float) -> "BatchAccounting":
        """Accumulation and betas as run, for a dataset with this measured packing factor."""
        return BatchAccounting.derive(self, packing_factor)

    def to_dict(self) -> Dict[str, Any]:
        execution = dataclasses.asdict(self.execution_spec)
        execution.pop("gradient_accumulation", None)
        execution.pop("micro_batches_per_pass", None)
        out = {"name": self.name, "model": dict(self.model), "execution": execution}
        for section in ("data", "optimizer", "schedule", "training", "checkpoint", "logging"):
            out[section] = dataclasses.asdict(getattr(self, section))
        if self.task.fine_tuning:  # pretraining runs record what they always recorded
            out["task"] = dataclasses.asdict(self.task)
        return out


@dataclass(frozen=True)
class BatchAccounting:
    """What packing changes about a step, derived from the config and a measured packing factor.

    Option 1 ("accumulation"): the step keeps about `global_batch_sequences` sequences. On the IPU (and on
    torch pipeline stages) the micro batch is static, so the accumulation count is divided by the packing
    factor, rounded to the nearest integer (Graphcore's app rounds up; nearest keeps the step closest to the
    stated batch). Off the IPU, one torch stage, the step is global / (replicas x factor) packs a replica
    (TrainingConfig.packs_per_step), whatever micro batch the config names for the padded layout: one micro
    batch where they fit ``execution.pass_memory_mb``, else the fewest equal micro batches that fit (each
    micro batch's loss is its own mean, as every micro batch's is).
    Option 2 ("betas"): the step keeps `global_batch_sequences` *packs*, i.e. about
    packing_factor times more sequences, and LAMB's betas become beta ** packing_factor so that the
    moments decay per sequence seen as they would without packing.
    """

    method: str
    packing_factor: float
    unpacked_accumulation: int
    gradient_accumulation: int
    betas: Tuple[float, float]
    execution: Any  # ExecutionConfig with micro_batch_size and gradient_accumulation as run
    named_micro_batch: int = 0
    """The config's execution.micro_batch_size where the step replaced it (off the IPU, packed), else 0."""

    @property
    def global_batch_packs(self) -> int:
        return int(self.execution.global_batch_packs)

    @property
    def expected_sequences_per_step(self) -> float:
        return self.global_batch_packs * self.packing_factor

    @staticmethod
    def derive(config: RunConfig, packing_factor: float) -> "BatchAccounting":
        if not packing_factor >= 1.0:
            raise ConfigError("packing factor must be >= 1.0, got %r" % (packing_factor,))
        training, ex = config.training, config.execution_spec
        unpacked = training.unpacked_accumulation(ex.micro_batch_size, ex.replication_factor)
        betas = training.betas(config.optimizer.betas, packing_factor)
        named = 0
        if training.batch_accounting == "accumulation" and ex.merges_micro_batches and packing_factor > 1.0:
            step = training.packs_per_step(ex.replication_factor, packing_factor)
            count = -(-step // (config.packs_per_pass(ex) or step))  # micro batches: the fewest that fit
            micro = max(1, int(math.floor(step / float(count) + 0.5)))
            execution = dataclasses.replace(ex, micro_batch_size=micro, gradient_accumulation=count)
            named = ex.micro_batch_size
        else:
            accumulation = training.gradient_accumulation(ex.micro_batch_size, ex.replication_factor, packing_factor)
            execution = dataclasses.replace(ex, gradient_accumulation=accumulation)
        execution = dataclasses.replace(execution, micro_batches_per_pass=config.micro_batches_per_pass(execution))
        try:
            pipelined = execution.backend == "poptorch" and execution.num_stages > 1
            check_pipeline_depth(execution, plan_placement(sum(execution.layers_per_ipu), execution,
                                                           config.task.name) if pipelined else None)
        except ValueError as error:
            raise ConfigError(
                "%s: the accumulation is training.global_batch_sequences %d / (execution.micro_batch_size %d x "
                "execution.replication_factor %d)%s; raise training.global_batch_sequences or lower "
                "execution.micro_batch_size" % (error, training.global_batch_sequences, ex.micro_batch_size,
                                                ex.replication_factor, " / packing factor %.3f" % packing_factor
                                                if training.batch_accounting == "accumulation" else "")
            ) from None
        return BatchAccounting(training.batch_accounting, float(packing_factor), unpacked,
                               execution.gradient_accumulation, betas, execution, named)

    def describe(self) -> str:
        if self.named_micro_batch:
            ex = self.execution
            return ("batch accounting: packing factor %.4f, the step in packs (training.global_batch_sequences / "
                    "packing factor%s; execution.micro_batch_size %d is the padded layout's): %d micro batch%s of %d "
                    "packs; %d packs/step ~ %.0f sequences/step"
                    % (self.packing_factor, "" if ex.replication_factor == 1 else " / replicas", self.named_micro_batch,
                       ex.gradient_accumulation, "" if ex.gradient_accumulation == 1 else "es", ex.micro_batch_size,
                       self.global_batch_packs, self.expected_sequences_per_step))
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

    def describe_passes(self) -> str:
        """One line: how a replica's step runs, in passes of micro batches (ExecutionConfig ``pass_sizes``)."""
        ex = self.execution
        sizes = ex.pass_sizes

        def n(count: int, what: str) -> str:
            return "%d %s%s" % (count, what, "" if count == 1 else ("es" if what.endswith(("s", "h")) else "s"))

        step = "a replica's step (%s of %s = %s) runs as " % (
            n(ex.gradient_accumulation, "micro batch"), n(ex.micro_batch_size, "pack"), n(ex.packs_per_replica_step,
                                                                                          "pack"))
        if ex.gradient_accumulation == 1:
            return "passes: %s1 pass" % step
        if not ex.merges_micro_batches:
            why = ("execution.pass_memory_mb 0" if ex.backend == "torch" and ex.num_stages == 1 else
                   "the IPU's static micro batch" if ex.backend == "poptorch" else "a pipeline's micro batches")
            return "passes: %s%s of 1 micro batch (%s)" % (step, n(len(sizes), "pass"), why)
        return ("passes: %s%s of %s micro batches (at most %d a pass within execution.pass_memory_mb %d; each micro "
                "batch's loss is its own mean, so the update is that of one pass per micro batch)"
                % (step, n(len(sizes), "pass"), "/".join(str(s) for s in sorted(set(sizes), reverse=True)),
                   ex.micro_batches_per_pass, ex.pass_memory_mb))
