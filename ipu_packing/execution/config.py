"""ExecutionConfig: where and how the packed model runs. Derived values are properties here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

BACKENDS = ("torch", "poptorch")
PRECISIONS = ("fp32", "fp16", "bf16")


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
    """poptorch only: optimizer steps per host call."""
    layers_per_ipu: List[int] = field(default_factory=list)
    """Encoder layers on each IPU / pipeline stage; empty means one stage holding every layer."""
    precision: str = "fp32"
    """fp32, fp16 (IPU; loss scaling) or bf16 (autocast)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError("execution.backend must be one of %s, got %r" % (BACKENDS, self.backend))
        if self.precision not in PRECISIONS:
            raise ValueError("execution.precision must be one of %s, got %r" % (PRECISIONS, self.precision))
        for name in ("micro_batch_size", "gradient_accumulation", "replication_factor", "device_iterations"):
            if int(getattr(self, name)) < 1:
                raise ValueError("execution.%s must be >= 1, got %r" % (name, getattr(self, name)))

    @property
    def num_stages(self) -> int:
        return max(1, len(self.layers_per_ipu))

    @property
    def packs_per_replica_step(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation

    @property
    def global_batch_packs(self) -> int:
        """Packs per optimizer step, all replicas together."""
        return self.packs_per_replica_step * self.replication_factor
