"""ExecutionConfig: where and how the packed model runs. Derived values are properties here, in one place.

Vocabulary (used the same way in PopTorch and in PyTorch):

- *pack*: one row of the batch, holding up to K sequences (a padded sequence is a pack with K=1);
- *micro batch*: packs one replica pushes through the model at once (poptorch DataLoader ``batch_size``);
- *gradient accumulation*: micro batches per replica per optimizer step, as run (the application divides
  the accumulation it would use for unpacked data by the packing factor before building the runner);
- *pass*: one forward and backward on the torch backend (one stage): consecutive micro batches of a replica's
  step that fit ``pass_memory_mb`` together run as one pass, each micro batch's loss still its own mean and the
  step's gradient the mean of theirs, so the update is the same as one pass per micro batch (``pass_sizes``);
  poptorch and pipelines run one micro batch at a time;
- *replication*: data-parallel copies of the model, all hosts together (poptorch: ``replicationFactor`` times
  the instances; the DDP world size);
- *instance*: one host process of a PopRun launch, driving ``replication_factor / num_instances`` replicas;
- *device iterations*: optimizer steps the IPU runs per host call (poptorch only);
- *stage*: one IPU of a pipelined replica (poptorch) or one process of a ``torch.distributed.pipelining`` run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..errors import ConfigError

BACKENDS = ("torch", "poptorch")
PRECISIONS = ("fp32", "fp16", "bf16")
DEVICES = ("cpu", "cuda")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
ACCUMULATOR_TYPES = ("fp16", "fp32")
OUTPUT_MODES = ("sum", "all", "final")
DATALOADER_MODES = ("sync", "async", "async_rebatched")
#: PopART AccumulateOuterFragmentSchedule, in enum order (graphcore/popart willow/include/popart/
#: sessionoptions.hpp:584-599): the integer PopTorch's ``_Popart.set`` wants is the index.
ACCUMULATE_OUTER_FRAGMENT_SCHEDULES = ("scheduler", "serial", "overlap_cycle_optimized", "overlap_memory_optimized")
#: PopART SubgraphCopyingStrategy, in enum order (sessionoptions.hpp:645-660).
SUBGRAPH_COPYING_STRATEGIES = ("on_enter_and_exit", "just_in_time")
#: Bytes per element of each accumulator / optimizer-state type.
TYPE_BYTES = {"fp16": 2, "fp32": 4}

#: In-Processor Memory of one Mk2 IPU (GC200), in bytes: 900 MB as Graphcore quotes it (900 * 10**6).
IPU_MEMORY_BYTES = 900 * 10**6


@dataclass
class ExecutionConfig:
    backend: str = "torch"
    """"torch" (CPU/CUDA, DDP, torch.distributed.pipelining) or "poptorch" (Graphcore IPUs)."""
    device: str = "cpu"
    """torch backend only: "cpu" or "cuda"."""
    micro_batch_size: int = 8
    """Packs per replica per micro batch (a pack with K=1 is one padded sequence). As written in a config, the
    micro batch of the IPU and of the padded layout; off the IPU a packed step is sized from the global batch
    instead (train/run_config.py BatchAccounting), and the run says what it chose."""
    gradient_accumulation: int = 1
    """Micro batches per replica per optimizer step, as run (already adjusted for packing)."""
    pass_memory_mb: int = 4096
    """torch backend, one stage: the activation memory (MiB, estimated from the model's sizes:
    dry_run.training_activation_bytes) one pass may take. A packed step (batch accounting "accumulation") is cut
    into the fewest micro batches that fit it; otherwise a replica's step runs its micro batches in as few
    passes as fit, at least one micro batch a pass, and the update does not depend on it (each micro batch keeps
    its own loss mean). 0 keeps the named micro batch and runs one a pass. poptorch and pipelines ignore it."""
    micro_batches_per_pass: int = 1
    """At most this many micro batches per pass, as run (derived from ``pass_memory_mb`` by the training
    application's batch accounting, as ``gradient_accumulation`` is; 1: one pass per micro batch)."""
    replication_factor: int = 1
    """Data-parallel replicas over all instances (PopRun's ``--num-replicas``), or the DDP world size. Each
    PopRun instance runs ``local_replicas`` of them (its poptorch replicationFactor)."""
    num_instances: int = 1
    """poptorch only: host processes PopRun launches (``poprun --num-instances``); they share the replicas
    evenly. More than one needs PopRun and PopDist (Poplar SDK); the global batch does not depend on it.
    The torch backend ignores it."""
    device_iterations: int = 1
    """poptorch only: optimizer steps per host call (the torch backend runs one step per call and
    ignores it, as it ignores the other IPU-only settings, so an IPU config also runs on CPU/GPU)."""
    layers_per_ipu: List[int] = field(default_factory=list)
    """Encoder layers on each IPU / pipeline stage; empty means one stage holding every layer.
    The published IPU BERT configs put 0 layers on IPU 0, which holds the embeddings and the tied MLM head."""
    precision: str = "fp32"
    """fp32, fp16 (static loss scaling by ``loss_scaling``) or bf16 (torch autocast)."""
    recompute_checkpoint_every_layer: bool = True
    """poptorch: put a recomputation checkpoint on every encoder layer's output (activations between
    checkpoints are recomputed in the backward pass instead of stashed)."""
    available_memory_proportion: List[float] = field(default_factory=list)
    """poptorch: share of each IPU's tile memory that matmuls/convolutions may use as temporary memory,
    one value per IPU (a single value applies to every IPU); empty keeps the Poplar default."""
    loss_scaling: float = 1.0
    """Static loss scale for fp16: the loss is multiplied by it before the backward pass and the gradients
    divided by it before the update (poptorch: the optimizer's ``loss_scaling``)."""
    optimizer_state_offchip: bool = True  # graphcore/examples nlp/bert/pytorch configs_pretraining.yml:30
    """poptorch: keep optimizer state in streaming (off-chip) memory, as the published IPU BERT app does;
    BERT-Large's LAMB state alone would not fit next to its weights in 900 MB (see the dry run)."""
    replicated_tensor_sharding: bool = False  # configs_pretraining.yml:29 (every pretrain_* entry: true, 85, 151)
    """poptorch: shard optimizer state across replicas (each holds 1/replication of it, and streams only that
    share on and off chip). Graphcore's pretraining configs all turn it on (they run 4 or 16 replicas), as
    the shipped configs/bert_*_pod*.yaml do; with one replica it changes nothing."""
    executable_cache_dir: Optional[str] = None
    """poptorch: directory where compiled executables are cached and reused."""
    compile_only: bool = False
    """poptorch: compile for an offline IPU target and stop (no IPU needed, nothing is trained)."""
    use_ipu_model: bool = False
    """poptorch: run on the IPU Model simulator instead of hardware."""
    pipeline_schedule: str = "gpipe"
    """torch pipelining schedule: "gpipe" (all forwards, then all backwards) or "1f1b"."""
    torch_compile: bool = False
    """torch backend, single stage: run the model through torch.compile(fullgraph=True, dynamic=False).
    Packs have static shapes, so this compiles once (see docs/execution.md)."""
    torch_compile_backend: str = "inductor"
    """torch.compile backend when ``torch_compile`` is set ("inductor"; "eager" captures graphs without
    generating code, which is how the tests count compilations cheaply)."""
    deterministic: bool = False
    """torch backend: deterministic kernels only (``torch.use_deterministic_algorithms(True)``, and cuBLAS's
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` where unset), for the run's duration, as transformers'
    ``full_determinism``: on CUDA a run then repeats bitwise and a resumed run matches the uninterrupted one
    (without it, CUDA's atomic scatter and attention backward kernels differ run to run in the last bits).
    Slower on CUDA; the CPU kernels this project runs are deterministic either way. poptorch ignores it."""
    seed: int = 0
    """poptorch's randomSeed (the device's random number generator: dropout, stochastic rounding). The
    data order is not the runner's: the training loop's epoch order is seeded by training.seed."""

    # ---- Graphcore's memory and PopART settings (poptorch only; the torch backend ignores them) --------
    # Defaults are the `defaults:` block of Graphcore's published app (graphcore/examples nlp/bert/pytorch,
    # configs_pretraining.yml, ipu_options.py, optimization.py, at commit 3cc8f81f); the shipped
    # configs/bert_*_pod*.yaml set what the corresponding `pretrain_*_512*` entries set on top of it.
    embedding_serialization_factor: int = 1  # configs_pretraining.yml:27 (pretrain_*_512: 2, lines 121, 161)
    """Split the tied MLM decoder matmul (hidden -> vocab) into this many serial matmuls over the vocabulary
    (``poptorch.serializedMatMul``, MatMulSerializationMode.OutputChannels), as Graphcore's
    PipelinedBertForPretraining.parallelize does with its SerializedLinear decoder (modeling.py:161-171).
    It must divide the vocabulary size; 1 disables it."""
    half_partials: bool = True  # configs_pretraining.yml:32 enable_half_partials; ipu_options.py:96-98
    """Matmul/convolution partials in fp16 (``opts.Precision.setPartialsType(torch.float16)``). Applies to an
    fp16 model only: fp32 matmuls keep fp32 partials and the option is not emitted."""
    gradient_accumulator_type: Optional[str] = None  # optimization.py:76 accum_type=float16 (fp16 model)
    """Type of the gradient accumulators (poptorch.optim ``accum_type``): "fp16" or "fp32". None follows
    the weights: fp16 for an fp16 model (Graphcore's choice), fp32 otherwise (PopTorch's own default,
    poptorch python/optim.py:733-734)."""
    first_order_momentum_type: str = "fp32"  # optimization.py:54,77 with configs_pretraining.yml:31 (False)
    """Type of the first moment (poptorch.optim ``first_order_momentum_accum_type``; SGD: velocity)."""
    second_order_momentum_type: str = "fp32"  # optimization.py:78 second_order_momentum_accum_type=float32
    """Type of the second moment (poptorch.optim ``second_order_momentum_accum_type``)."""
    output_mode: str = "sum"  # ipu_options.py:61-62 opts.outputMode(poptorch.OutputMode.Sum)
    """What each host call returns per replica: "sum" over the call's micro batches (Graphcore's choice:
    the least host traffic; the runner divides by ``output_sum_count``), "all" (one value per micro
    batch) or "final" (the last micro batch only)."""
    dataloader_mode: str = "async_rebatched"  # configs_pretraining.yml:20; pretraining_data.py:260
    """poptorch.DataLoader ``mode``: "async_rebatched" (DataLoaderMode.AsyncRebatched: an
    AsynchronousDataAccessor fills the next host call while the IPU runs; workers batch 1 element and the
    accessor rebatches), "async" (DataLoaderMode.Async) or "sync"."""
    disable_grad_accumulation_tensor_streams: bool = True  # ipu_options.py:105-106
    """PopART ``disableGradAccumulationTensorStreams``: do not create host streams for the accumulated
    gradients (only tensors the host asks for are streamed)."""
    accumulate_outer_fragment_schedule: str = "overlap_memory_optimized"  # ipu_options.py:107-110
    """PopART ``accumulateOuterFragmentSettings.schedule``: how the weight update after the accumulation
    loop is scheduled across IPUs; "overlap_memory_optimized" runs the IPUs' updates in parallel while
    avoiding the steps that cost most memory."""
    accumulate_outer_fragment_excluded_ipus: List[int] = field(default_factory=lambda: [0])  # ipu_options.py:111
    """PopART ``accumulateOuterFragmentSettings.excludedVirtualGraphs``: IPUs kept out of that parallel
    update (IPU 0, which holds the embedding and its large streamed optimizer state)."""
    subgraph_copying_strategy: str = "just_in_time"  # ipu_options.py:112-113
    """PopART ``subgraphCopyingStrategy``: copy an outlined subgraph's inputs just before use and its
    outputs as soon as produced, so fewer copies are live at once."""
    schedule_non_weight_update_gradient_consumers_early: bool = True  # ipu_options.py:114
    """PopART ``scheduleNonWeightUpdateGradientConsumersEarly``."""
    tied_gather: bool = True  # ipu_options.py:115 setPatterns TiedGather, TiedGatherAccumulate
    """PopART patterns TiedGather and TiedGatherAccumulate: the embedding lookup and the tied MLM decoder
    share one weight layout, and the lookup's gradient is accumulated straight into the decoder's."""
    update_inplace_priorities_for_ipu: bool = True  # ipu_options.py:115 setPatterns
    """PopART pattern UpdateInplacePrioritiesForIpu."""
    engine_options: Dict[str, str] = field(
        default_factory=lambda: {"opt.useAutoloader": "true", "target.syncReplicasIndependently": "true"}
    )  # ipu_options.py:117-121, 132
    """Poplar engine options (``opts._Popart.set("engineOptions", ...)``)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError("execution.backend must be one of %s, got %r" % (BACKENDS, self.backend))
        if self.device not in DEVICES:
            raise ConfigError("execution.device must be one of %s, got %r" % (DEVICES, self.device))
        if self.precision not in PRECISIONS:
            raise ConfigError("execution.precision must be one of %s, got %r" % (PRECISIONS, self.precision))
        if self.backend == "poptorch" and self.precision == "bf16":
            raise ConfigError("execution.precision bf16 is not available on IPUs: use fp16 or fp32")
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise ConfigError(
                "execution.pipeline_schedule must be one of %s, got %r" % (PIPELINE_SCHEDULES, self.pipeline_schedule)
            )
        for name in ("micro_batch_size", "gradient_accumulation", "replication_factor", "device_iterations",
                     "num_instances", "micro_batches_per_pass"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError("execution.%s must be an integer >= 1, got %r" % (name, value))
        if self.replication_factor % self.num_instances:
            # poprun: "The replicas are divided evenly among the instances" (PopRun user guide, 3.1.2)
            raise ConfigError(
                "execution.replication_factor %d is not a multiple of execution.num_instances %d (PopRun divides "
                "the replicas evenly among the instances)" % (self.replication_factor, self.num_instances)
            )
        self.layers_per_ipu = list(self.layers_per_ipu)
        for n in self.layers_per_ipu:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ConfigError("execution.layers_per_ipu must be integers >= 0, got %r" % (self.layers_per_ipu,))
        if self.layers_per_ipu and sum(self.layers_per_ipu) == 0:
            raise ConfigError("execution.layers_per_ipu places no encoder layer: %r" % (self.layers_per_ipu,))
        self.available_memory_proportion = [float(p) for p in self.available_memory_proportion]
        if len(self.available_memory_proportion) not in (0, 1, self.num_stages):
            raise ConfigError(
                "execution.available_memory_proportion needs one value or one per IPU (%d), got %r"
                % (self.num_stages, self.available_memory_proportion)
            )
        for p in self.available_memory_proportion:
            if not 0.0 < p <= 1.0:
                raise ConfigError("execution.available_memory_proportion values must be in (0, 1], got %r" % p)
        if isinstance(self.pass_memory_mb, bool) or not isinstance(self.pass_memory_mb, int) or self.pass_memory_mb < 0:
            raise ConfigError("execution.pass_memory_mb must be an integer >= 0, got %r" % (self.pass_memory_mb,))
        if not float(self.loss_scaling) > 0.0:
            raise ConfigError("execution.loss_scaling must be > 0, got %r" % (self.loss_scaling,))
        if self.compile_only and self.use_ipu_model:
            raise ConfigError("execution.compile_only targets an offline IPU and cannot use the IPU Model")
        n = self.embedding_serialization_factor
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError("execution.embedding_serialization_factor must be an integer >= 1, got %r" % (n,))
        for name in ("gradient_accumulator_type", "first_order_momentum_type", "second_order_momentum_type"):
            value = getattr(self, name)
            if not (value in ACCUMULATOR_TYPES or (value is None and name == "gradient_accumulator_type")):
                raise ConfigError("execution.%s must be one of %s, got %r" % (name, ACCUMULATOR_TYPES, value))
        for name, choices in (
            ("output_mode", OUTPUT_MODES),
            ("dataloader_mode", DATALOADER_MODES),
            ("accumulate_outer_fragment_schedule", ACCUMULATE_OUTER_FRAGMENT_SCHEDULES),
            ("subgraph_copying_strategy", SUBGRAPH_COPYING_STRATEGIES),
        ):
            if getattr(self, name) not in choices:
                raise ConfigError("execution.%s must be one of %s, got %r" % (name, choices, getattr(self, name)))
        self.accumulate_outer_fragment_excluded_ipus = list(self.accumulate_outer_fragment_excluded_ipus)
        for ipu in self.accumulate_outer_fragment_excluded_ipus:
            if isinstance(ipu, bool) or not isinstance(ipu, int) or not 0 <= ipu < self.num_stages:
                raise ConfigError(
                    "execution.accumulate_outer_fragment_excluded_ipus must be IPU indices in [0, %d), got %r"
                    % (self.num_stages, self.accumulate_outer_fragment_excluded_ipus)
                )
        if not isinstance(self.engine_options, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.engine_options.items()
        ):
            raise ConfigError("execution.engine_options must map strings to strings, got %r" % (self.engine_options,))
        self.engine_options = dict(self.engine_options)

    # ---- derived values (the only place they are computed) -------------------------------------------

    @property
    def num_stages(self) -> int:
        """IPUs per replica (poptorch) or pipeline stages/processes (torch)."""
        return max(1, len(self.layers_per_ipu))

    @property
    def ipus_per_replica(self) -> int:
        return self.num_stages

    @property
    def total_ipus(self) -> int:
        """IPUs requested: ipus per replica x replication, rounded up to a power of two (autoRoundNumIPUs)."""
        n = self.ipus_per_replica * self.replication_factor
        return 1 << (n - 1).bit_length()

    @property
    def world_size(self) -> int:
        """torch backend: processes torchrun must start (replicas, or pipeline stages)."""
        return self.replication_factor * self.num_stages

    @property
    def packs_per_replica_step(self) -> int:
        """Packs one replica consumes per optimizer step: micro batch x accumulation."""
        return self.micro_batch_size * self.gradient_accumulation

    @property
    def merges_micro_batches(self) -> bool:
        """Whether this backend and split may run several micro batches in one pass (torch, one stage)."""
        return self.backend == "torch" and self.num_stages == 1 and self.pass_memory_mb > 0

    @property
    def pass_sizes(self) -> List[int]:
        """Micro batches in each pass of a replica's optimizer step, in order: the accumulation split as evenly as
        ``micro_batches_per_pass`` allows (7 by at most 3: 3, 2, 2); one each where micro batches are not merged."""
        most = self.micro_batches_per_pass if self.merges_micro_batches else 1
        passes = -(-self.gradient_accumulation // most)
        share, extra = divmod(self.gradient_accumulation, passes)
        return [share + (1 if i < extra else 0) for i in range(passes)]

    @property
    def global_batch_packs(self) -> int:
        """Packs per optimizer step, all replicas together."""
        return self.packs_per_replica_step * self.replication_factor

    def global_batch_sequences(self, packing_factor: float) -> float:
        """Sequences per optimizer step on average, for a dataset averaging ``packing_factor`` sequences/pack."""
        if not packing_factor >= 1.0:
            raise ConfigError("packing factor must be >= 1, got %r" % (packing_factor,))
        return self.global_batch_packs * float(packing_factor)

    @property
    def local_replicas(self) -> int:
        """Replicas one instance runs: its poptorch replicationFactor (popdist.getNumLocalReplicas())."""
        return self.replication_factor // self.num_instances

    @property
    def instance_batch_packs(self) -> int:
        """Packs one instance consumes per optimizer step: its share of ``global_batch_packs``."""
        return self.packs_per_replica_step * self.local_replicas

    @property
    def combined_batch_packs(self) -> int:
        """Packs per host call of one instance = its poptorch DataLoader item: micro x device iterations x
        local replicas x accumulation (all replicas when there is one instance)."""
        return self.micro_batch_size * self.device_iterations * self.local_replicas * self.gradient_accumulation

    @property
    def packs_per_loader_item(self) -> int:
        """Packs in one item of ``runner.dataloader`` for this process: a host call's combined batch on
        poptorch, one optimizer step of this replica on torch."""
        if self.backend == "poptorch":
            return self.combined_batch_packs
        return self.packs_per_replica_step

    @property
    def optimizer_steps_per_call(self) -> int:
        """Optimizer steps one ``runner.train_step`` runs (device iterations on poptorch, else 1)."""
        return self.device_iterations if self.backend == "poptorch" else 1

    @property
    def accumulator_type(self) -> str:
        """Gradient accumulator type as run: ``gradient_accumulator_type``, or the weights' type if None."""
        if self.gradient_accumulator_type is not None:
            return self.gradient_accumulator_type
        return "fp16" if self.precision == "fp16" else "fp32"

    @property
    def output_sum_count(self) -> int:
        """Micro batches summed into each value a poptorch host call returns per replica: gradient
        accumulation x device iterations under output_mode "sum", else 1. Dividing a returned value's mean
        by it gives the mean per micro batch for every output mode."""
        if self.output_mode == "sum":
            return self.gradient_accumulation * self.device_iterations
        return 1

    def memory_proportion_for(self, ipu: int) -> Optional[float]:
        """availableMemoryProportion for ``ipu`` (None: Poplar default)."""
        if not self.available_memory_proportion:
            return None
        if len(self.available_memory_proportion) == 1:
            return self.available_memory_proportion[0]
        return self.available_memory_proportion[ipu]
