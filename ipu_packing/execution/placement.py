"""Where every part of the model runs: the model declares its parts (ipu_packing/model/stages.py), this file
maps them onto IPUs and onto the processes of a torch pipeline. The PopTorch adapter, the torch pipeline and
the dry run all read this one plan.

On IPUs each part is a PopTorch block on the device the model gives it, as in Graphcore's BERT app
(graphcore/examples nlp/bert/pytorch): embeddings on IPU 0, encoder layers where ``layers_per_ipu`` puts
them, the heads back on IPU 0 with the word embedding their decoder is tied to, so that weight is used on
one IPU only (PopART refuses a variable copied between IPUs while pipelining). With
``AutoStage.AutoIncrement`` every block is its own pipeline stage.

A torch pipeline (one process per stage, ``torch.distributed.pipelining``) only flows forward: a part whose
device comes before the previous part's runs on the previous part's process, and the part that produces the
loss runs on the last process (the schedule takes the loss there). The heads therefore run on the last
stage, which holds its own copy of the tied word embedding; the runner sums the copies' gradients before
every optimizer step, so both receive the same update (as Megatron-LM does for tied embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from ipu_packing.model.stages import Part, Stages, pretraining_stages

from .config import ExecutionConfig


@dataclass(frozen=True)
class Placement:
    module: str
    """Module path whose parameters this row places (one row per module of every part)."""
    block: str
    """Name of the part = poptorch block id."""
    ipu: int
    """IPU within a replica (poptorch)."""
    stage: int
    """Pipeline stage = process within a torch pipeline."""
    recompute: bool
    """poptorch recomputation checkpoint on the part's output."""


def model_stages(num_layers: int, config: ExecutionConfig) -> Stages:
    """The model's parts for ``config.layers_per_ipu`` (one-line error when the split does not fit)."""
    config.layer_stages(num_layers)
    return pretraining_stages(num_layers, config.layers_per_ipu)


def torch_stages(stages: Stages, num_stages: int) -> List[int]:
    """Process of every part in a forward-only torch pipeline of ``num_stages`` processes."""
    out, current = [], 0
    for part in stages.parts:
        current = max(current, part.device)
        out.append(current)
    out[-1] = num_stages - 1
    return out


def ipu_blocks(stages: Stages, config: ExecutionConfig) -> List[Tuple[Part, bool]]:
    """(part, recomputation checkpoint at its output) for every PopTorch block, in execution order."""
    recompute = bool(config.recompute_checkpoint_every_layer)
    return [(p, recompute and p.checkpoint_output) for p in stages.parts]


def plan_placement(num_layers: int, config: ExecutionConfig) -> List[Placement]:
    """One row per module of every part, in execution order."""
    stages = model_stages(num_layers, config)
    plan = []
    for (part, recompute), stage in zip(ipu_blocks(stages, config), torch_stages(stages, config.num_stages)):
        for module in part.modules:
            plan.append(Placement(module, part.name, ipu=part.device, stage=stage, recompute=recompute))
    return plan


def owner_stage(param_name: str, plan: List[Placement]) -> int:
    """torch pipeline stage that owns parameter/buffer ``param_name``: the stage of the longest placed
    module path that prefixes it."""
    best, stage = -1, plan[-1].stage
    for p in plan:
        if (param_name == p.module or param_name.startswith(p.module + ".")) and len(p.module) > best:
            best, stage = len(p.module), p.stage
    return stage
