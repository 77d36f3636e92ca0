"""ExecutionConfig: where and how the packed model runs. Derived values are properties here, in one place.

Vocabulary (used the same way in PopTorch and in PyTorch):

- *pack*: one row of the batch, holding up to K sequences (a padded sequence is a pack with K=1);
- *micro batch*: packs one replica pushes through the model at once (poptorch DataLoader ``batch_size``);
- *gradient accumulation*: micro batches per replica per optimizer step, as run (the application divides
  the accumulation it would use for unpacked data by the packing factor before building the runner);
- *replication*: data-parallel copies of the model (poptorch ``replicationFactor`` or the DDP world size);
- *device iterations*: optimizer steps the IPU runs per host call (poptorch only);
- *stage*: one IPU of a pipelined replica (poptorch) or one process of a ``torch.distributed.pipelining`` run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

BACKENDS = ("torch", "poptorch")
PRECISIONS = ("fp32", "fp16", "bf16")
DEVICES = ("cpu", "cuda")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")

#: In-Processor Memory of one Mk2 IPU (GC200), in bytes: 900 MB as Graphcore quotes it (900 * 10**6).
IPU_MEMORY_BYTES = 900 * 10**6


@dataclass
class ExecutionConfig:
    backend: str = "torch"
    """"torch" (CPU/CUDA, DDP, torch.distributed.pipelining) or "poptorch" (Graphcore IPUs)."""
    device: str = "cpu"
    """torch backend only: "cpu" or "cuda"."""
    micro_batch_size: int = 8
    """Packs per replica per micro batch (a pack with K=1 is one padded sequence)."""
    gradient_accumulation: int = 1
    """Micro batches per replica per optimizer step, as run (already adjusted for packing)."""
    replication_factor: int = 1
    """Data-parallel replicas: poptorch replicationFactor, or DDP world size."""
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
    optimizer_state_offchip: bool = True
    """poptorch: keep optimizer state in streaming (off-chip) memory, as the published IPU BERT app does;
    BERT-Large's LAMB state alone would not fit next to its weights in 900 MB (see the dry run)."""
    replicated_tensor_sharding: bool = False
    """poptorch: shard optimizer state across replicas (each holds 1/replication of it)."""
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
    seed: int = 0
    """poptorch randomSeed, and the seed of the runner's data-order permutation when shuffling."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError("execution.backend must be one of %s, got %r" % (BACKENDS, self.backend))
        if self.device not in DEVICES:
            raise ValueError("execution.device must be one of %s, got %r" % (DEVICES, self.device))
        if self.precision not in PRECISIONS:
            raise ValueError("execution.precision must be one of %s, got %r" % (PRECISIONS, self.precision))
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise ValueError(
                "execution.pipeline_schedule must be one of %s, got %r" % (PIPELINE_SCHEDULES, self.pipeline_schedule)
            )
        for name in ("micro_batch_size", "gradient_accumulation", "replication_factor", "device_iterations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError("execution.%s must be an integer >= 1, got %r" % (name, value))
        self.layers_per_ipu = list(self.layers_per_ipu)
        for n in self.layers_per_ipu:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError("execution.layers_per_ipu must be integers >= 0, got %r" % (self.layers_per_ipu,))
        if self.layers_per_ipu and sum(self.layers_per_ipu) == 0:
            raise ValueError("execution.layers_per_ipu places no encoder layer: %r" % (self.layers_per_ipu,))
        self.available_memory_proportion = [float(p) for p in self.available_memory_proportion]
        if len(self.available_memory_proportion) not in (0, 1, self.num_stages):
            raise ValueError(
                "execution.available_memory_proportion needs one value or one per IPU (%d), got %r"
                % (self.num_stages, self.available_memory_proportion)
            )
        for p in self.available_memory_proportion:
            if not 0.0 < p <= 1.0:
                raise ValueError("execution.available_memory_proportion values must be in (0, 1], got %r" % p)
        if not float(self.loss_scaling) > 0.0:
            raise ValueError("execution.loss_scaling must be > 0, got %r" % (self.loss_scaling,))
        if self.compile_only and self.use_ipu_model:
            raise ValueError("execution.compile_only targets an offline IPU and cannot use the IPU Model")

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
    def global_batch_packs(self) -> int:
        """Packs per optimizer step, all replicas together."""
        return self.packs_per_replica_step * self.replication_factor

    def global_batch_sequences(self, packing_factor: float) -> float:
        """Sequences per optimizer step on average, for a dataset averaging ``packing_factor`` sequences/pack."""
        if not packing_factor >= 1.0:
            raise ValueError("packing factor must be >= 1, got %r" % (packing_factor,))
        return self.global_batch_packs * float(packing_factor)

    @property
    def combined_batch_packs(self) -> int:
        """Packs per host call = poptorch DataLoader item: micro x device iterations x replication x accumulation."""
        return self.micro_batch_size * self.device_iterations * self.replication_factor * self.gradient_accumulation

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

    def memory_proportion_for(self, ipu: int) -> Optional[float]:
        """availableMemoryProportion for ``ipu`` (None: Poplar default)."""
        if not self.available_memory_proportion:
            return None
        if len(self.available_memory_proportion) == 1:
            return self.available_memory_proportion[0]
        return self.available_memory_proportion[ipu]

    def layer_stages(self, num_layers: int) -> List[int]:
        """Stage (IPU) index of every encoder layer, checking ``layers_per_ipu`` covers ``num_layers``."""
        counts = self.layers_per_ipu or [num_layers]
        if sum(counts) != num_layers:
            raise ValueError(
                "execution.layers_per_ipu %r places %d encoder layers but the model has %d"
                % (self.layers_per_ipu, sum(counts), num_layers)
            )
        stages = []  # type: List[int]
        for stage, n in enumerate(counts):
            stages += [stage] * n
        return stages
