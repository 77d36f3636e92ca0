"""Where every part of the packed BERT runs: one plan, read by the PopTorch adapter, the torch pipeline and
the dry run, so the three cannot disagree.

IPU placement follows Graphcore's published BERT pretraining app (graphcore/examples, nlp/bert/pytorch):
the embeddings open the pipeline on IPU 0, encoder layer i runs on the IPU that ``layers_per_ipu`` gives it,
and the pooler and the pretraining heads (MLM head, whose decoder weight is tied to the word embedding, and
NSP head) come back to IPU 0. The tied weight therefore lives on one IPU only: its two uses are two pipeline
stages on the same chip, and its gradient is accumulated in one place. Each block gets its own name (and,
with ``AutoStage.AutoIncrement``, its own pipeline stage), as in the published app.

The torch pipeline (one process per stage, ``torch.distributed.pipelining``) cannot send the last
computation back to the first process without an interleaved schedule, so there the heads run on the last
stage and the tied weight has a copy on the first and on the last stage; the runner sums the two partial
gradients across those two processes before every optimizer step, so both copies receive the same update and
stay identical (what Megatron-LM does for its tied embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from .config import ExecutionConfig


@dataclass(frozen=True)
class Placement:
    module: str
    """Dotted path in PackedBertForPreTraining (transformers' BertForPreTraining names)."""
    block: str
    """poptorch BeginBlock user id."""
    ipu: int
    """IPU within a replica (poptorch)."""
    stage: int
    """Pipeline stage = process within a torch pipeline."""
    recompute: bool
    """poptorch recomputation checkpoint on the module's output."""


HEAD_MODULES = ("bert.pooler", "cls")
"""Modules after the encoder, placed as one group (pooler, MLM + NSP heads)."""


def plan_placement(num_layers: int, config: ExecutionConfig) -> List[Placement]:
    """Placement of embeddings, every encoder layer and the heads, in execution order."""
    layer_stage = config.layer_stages(num_layers)
    last = config.num_stages - 1
    plan = [Placement("bert.embeddings", "Embedding", ipu=0, stage=0, recompute=False)]
    for i, s in enumerate(layer_stage):
        plan.append(
            Placement(
                "bert.encoder.layer.%d" % i,
                "Encoder%d" % i,
                ipu=s,
                stage=s,
                recompute=bool(config.recompute_checkpoint_every_layer),
            )
        )
    plan.append(Placement("bert.pooler", "Pooler", ipu=0, stage=last, recompute=False))
    plan.append(Placement("cls", "Classifier", ipu=0, stage=last, recompute=False))
    return plan


def owner_stage(param_name: str, plan: List[Placement]) -> int:
    """torch pipeline stage that owns parameter/buffer ``param_name``: the stage of the longest placed
    module path that prefixes it; anything outside the encoder and embeddings belongs to the heads (last)."""
    best, stage = -1, plan[-1].stage
    for p in plan:
        if (param_name == p.module or param_name.startswith(p.module + ".")) and len(p.module) > best:
            best, stage = len(p.module), p.stage
    return stage
