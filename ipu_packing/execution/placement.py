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
from typing import List, Optional, Tuple

from ipu_packing.model.stages import Part, Stages, task_stages
from ipu_packing.model.stages import model_stages as declared_stages

from .. import tasks
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


def model_stages(model, config: ExecutionConfig, task: str = tasks.PRETRAINING.name) -> Stages:
    """The parts ``model`` declares (model/stages.py, by its task: pretraining, classification, question
    answering) for ``config.layers_per_ipu`` (one-line ConfigError when the split does not fit: layer_split).
    ``model`` may be a number of layers: the parts of ``task``'s model (the dry run, which builds no model)."""
    if isinstance(model, int):
        return task_stages(task, model, config.layers_per_ipu)
    return declared_stages(model, config.layers_per_ipu)


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


def plan_placement(model, config: ExecutionConfig, task: str = tasks.PRETRAINING.name) -> List[Placement]:
    """One row per module of every part, in execution order (``model``, ``task``: as model_stages takes them)."""
    return placement_rows(model_stages(model, config, task), config)


def placement_rows(stages: Stages, config: ExecutionConfig) -> List[Placement]:
    """plan_placement of parts already split (model_stages)."""
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


def pipeline_groups(plan: List[Placement]) -> List[Tuple[int, List[Placement]]]:
    """The forward pass as PopART runs it: consecutive placed modules on the same IPU form one group.

    With ``AutoStage.AutoIncrement`` every block is its own pipeline stage; PopART executes consecutive
    stages on the same virtual graph together (``Pipeline::withStages``, popart willow/src/transforms/
    pipeline.cpp:985-1035), so they count as one independent stage. Returns (IPU, modules) in order."""
    groups = []  # type: List[Tuple[int, List[Placement]]]
    for p in plan:
        if groups and groups[-1][0] == p.ipu:
            groups[-1][1].append(p)
        else:
            groups.append((p.ipu, [p]))
    return groups


def min_gradient_accumulation(num_groups: int) -> int:
    """Smallest accumulation PopART accepts for a pipeline of ``num_groups`` groups: the main phase needs at
    least one cycle after the fill and flush of 2G-2 cycles (``PipelineInfo``, pipeline.cpp:2286-2300)."""
    return 2 * num_groups - 1 if num_groups > 1 else 1


def check_pipeline_depth(config: ExecutionConfig, plan: Optional[List[Placement]] = None) -> None:
    """Refuse (ValueError, one line) a pipelined poptorch config whose gradient accumulation is below PopART's
    minimum for its groups of consecutive blocks on one IPU; the caller names the keys that set it. ``plan``:
    the config's placement where the caller has it (else computed for ``sum(layers_per_ipu)`` layers)."""
    if config.backend != "poptorch" or config.num_stages <= 1:
        return
    if plan is None:
        plan = plan_placement(sum(config.layers_per_ipu), config)
    groups = pipeline_groups(plan)
    need = min_gradient_accumulation(len(groups))
    if config.gradient_accumulation < need:
        raise ValueError(
            "execution.layers_per_ipu %s pipelines %d groups of consecutive blocks on one IPU (IPUs %s), which "
            "PopART runs only with gradient accumulation >= 2*%d-1 = %d, got %d"
            % (config.layers_per_ipu, len(groups), ", ".join(str(i) for i, _ in groups), len(groups), need,
               config.gradient_accumulation)
        )
