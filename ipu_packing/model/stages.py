"""The packed BERT's pipeline stages, declared by the model: which modules form which part of the forward
pass, on which device of a ``layers_per_ipu`` split, and which tensors each part reads and writes.

Execution applies this description (execution/placement.py): PopTorch blocks on IPUs, processes of a
``torch.distributed.pipelining`` schedule. It never needs the model's module paths or batch fields itself.

The parts of ``PackedBertForPreTraining`` (``pretraining_stages``), in the order the forward runs them:

    Embedding   bert.embeddings                 device 0; reads input_ids, token_type_ids, position_ids
    EncoderN    bert.encoder.layer.N            the device layers_per_ipu gives layer N; reads sequence_ids
                                                (each device builds the attention mask from it)
    Heads       cls (+ bert.pooler, called      device 0: the MLM decoder's weight is the word embedding,
                inside cls.forward)             so the heads sit with the embeddings and that weight is used
                                                on one device only; reads the four label fields

A task model declares its parts beside itself (its module's ``pipeline_stages``: classification.py and the
extractive QA model's, each a call of ``heads_on_last_device``): the same Embedding and EncoderN parts, and its
own last part:

    Heads       heads (+ bert.pooler, dropout,  the LAST device of the split: the heads share no weight with
                classifier / qa_outputs,        the embeddings, so they follow the last layer, as Graphcore's
                called inside heads.forward)    optimum-graphcore places the classifier and qa_outputs on the
                                                last IPU. The hidden states then never travel back to device 0
                                                (one (B, S, H) copy per micro batch saved) and the pipeline has
                                                one group of blocks fewer (a smaller minimum accumulation).
                                                Reads sequence_ids and the head's label fields.

How the task heads' part reads ``sequence_ids``: a torch pipeline sends it to the last process with the
other fields the part reads, and ``Stages.run`` calls the model's ``stages.heads`` method, which derives the
per-sequence tensors from it (model/per_sequence.py). Under PopTorch, whose pipelines stream an input onto one IPU
only, the model's forward derives them next to the attention mask, in the Embedding block, and hands them to
``heads`` as activations; ``sequence_ids`` itself is read on device 0 only (tests/test_model_task_stages.py
traces both heads under the PopTorch stand-in).

Each part has an ``entry`` module whose forward runs every op of the part, so a PopTorch ``BeginBlock`` on
it (a forward pre-hook that opens a block and never closes it) covers exactly that part: the embeddings'
forward, then the attention mask; each layer's forward; ``cls.forward``, which gathers, runs the pooler,
both heads and the losses (``pretraining_heads`` is one call of ``cls``); a task model's ``heads.forward``
(a module without parameters that is handed the pooler, dropout and classifier, or qa_outputs), which
gathers, runs them and the losses. Every parameter belongs to the ``modules`` of exactly one part.

Imports no poptorch and nothing from execution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, MutableMapping, Sequence, Tuple

import torch

from ..errors import ConfigError

HIDDEN = "hidden_states"
"""Name of the (B, S, H) activation that flows from part to part."""

OUTPUT = "output"
"""Name under which the last part leaves the ``PackedBertOutput``."""

INPUTS = (
    "input_ids",
    "token_type_ids",
    "position_ids",
    "sequence_ids",
    "mlm_positions",
    "mlm_labels",
    "cls_positions",
    "nsp_labels",
)
"""The pretraining forward's batch fields, in its argument order (shapes: see the package docstring)."""

_EMBEDDING_FIELDS = INPUTS[:3]
_MASK_FIELD = INPUTS[3]
_LABEL_FIELDS = INPUTS[4:]
_MASK = "_attention_mask"  # built once per device from sequence_ids; never sent between devices


@dataclass(frozen=True)
class Part:
    """One piece of the forward pass."""

    name: str
    """Block id ("Embedding", "Encoder3", "Heads")."""
    entry: str
    """Module whose forward runs every op of this part (where a PopTorch block begins)."""
    modules: Tuple[str, ...]
    """Modules whose parameters this part consumes; together the parts own every parameter once."""
    device: int
    """Device (IPU) within one replica."""
    reads: Tuple[str, ...]
    """Tensors it takes: batch fields and/or ``HIDDEN``."""
    writes: Tuple[str, ...]
    """Tensors it leaves: ``HIDDEN`` or ``OUTPUT``."""
    checkpoint_output: bool = False
    """A recomputation checkpoint at its output is worthwhile (encoder layers)."""


@dataclass(frozen=True)
class Stages:
    """Every part of the forward, in execution order, for one split."""

    parts: Tuple[Part, ...]
    inputs: Tuple[str, ...] = INPUTS
    output: str = OUTPUT
    heads: str = "pretraining_heads"
    """The model's method that the last part runs: (hidden states, the part's other reads) -> the output."""

    @property
    def num_devices(self) -> int:
        return max(p.device for p in self.parts) + 1

    def run(self, model: torch.nn.Module, part: Part, state: MutableMapping[str, object]) -> None:
        """Run ``part`` of ``model`` on ``state`` (name -> tensor), adding what it writes. Running every part
        in order on the batch fields is exactly ``model(**fields)``."""
        module = model.get_submodule(part.entry)
        if part.writes == (OUTPUT,):
            state[OUTPUT] = getattr(model, self.heads)(*(state[k] for k in part.reads))
        elif HIDDEN in part.reads:
            if _MASK not in state:
                state[_MASK] = model.bert.get_attention_mask(state[_MASK_FIELD])
            state[HIDDEN] = module(state[HIDDEN], state[_MASK])
        else:
            state[HIDDEN] = module(*(state[k] for k in part.reads))


def layer_split(num_layers: int, layers_per_ipu: Sequence[int] = ()) -> List[int]:
    """Encoder layers per device, in order: ``layers_per_ipu``, or every layer on device 0 when it is empty.
    The one check that a split places exactly the model's layers (the config, the placement and the runners
    all come through here); raises ConfigError, one line."""
    counts = [int(n) for n in layers_per_ipu] or [num_layers]
    if any(n < 0 for n in counts):
        raise ConfigError("execution.layers_per_ipu must be integers >= 0, got %r" % (list(layers_per_ipu),))
    if sum(counts) != num_layers:
        raise ConfigError(
            "execution.layers_per_ipu %s sums to %d, but model.num_hidden_layers is %d"
            % (list(layers_per_ipu), sum(counts), num_layers)
        )
    return counts


def _embedding_and_layers(num_layers: int, layers_per_ipu: Sequence[int]) -> Tuple[List[Part], int]:
    """The Embedding part and one part per encoder layer; and the number of devices of the split."""
    counts = layer_split(num_layers, layers_per_ipu)
    parts = [Part("Embedding", "bert.embeddings", ("bert.embeddings",), 0, _EMBEDDING_FIELDS, (HIDDEN,))]
    layer = 0
    for device, n in enumerate(counts):
        for _ in range(n):
            path = "bert.encoder.layer.%d" % layer
            parts.append(
                Part("Encoder%d" % layer, path, (path,), device, (HIDDEN, _MASK_FIELD), (HIDDEN,),
                     checkpoint_output=True)
            )
            layer += 1
    return parts, len(counts)


def pretraining_stages(num_layers: int, layers_per_ipu: Sequence[int] = ()) -> Stages:
    """The parts of ``PackedBertForPreTraining`` with ``num_layers`` encoder layers, split as
    ``layers_per_ipu`` (encoder layers per device, in order; empty: all on device 0)."""
    parts, _ = _embedding_and_layers(num_layers, layers_per_ipu)
    parts.append(Part("Heads", "cls", ("bert.pooler", "cls"), 0, (HIDDEN,) + _LABEL_FIELDS, (OUTPUT,)))
    return Stages(tuple(parts))


def heads_on_last_device(num_layers: int, layers_per_ipu: Sequence[int], inputs: Tuple[str, ...],
                         modules: Tuple[str, ...], heads: str) -> Stages:
    """The parts of a task model (module docstring): Embedding, EncoderN, and its heads part, whose ``modules``
    share no weight with the embeddings, on the last device; ``inputs``: its forward's batch fields in argument
    order, the four token fields first (the heads part reads sequence_ids and the ones after it); ``heads``: the
    model's method a torch pipeline's last stage calls."""
    parts, devices = _embedding_and_layers(num_layers, layers_per_ipu)
    parts.append(Part("Heads", "heads", modules, devices - 1, (HIDDEN,) + inputs[3:], (OUTPUT,)))
    return Stages(tuple(parts), inputs=inputs, heads=heads)


def model_stages(model: torch.nn.Module, layers_per_ipu: Sequence[int] = ()) -> Stages:
    """The parts of any packed model (its ``TASK``, a task's name: tasks/) for ``layers_per_ipu``."""
    from .. import tasks

    task = getattr(model, "TASK", None)
    if task not in tasks.TASKS:
        raise ValueError("%s declares no pipeline parts (TASK %r, expected one of %s)"
                         % (type(model).__name__, task, sorted(tasks.TASKS)))
    return task_stages(task, int(model.config.num_hidden_layers), layers_per_ipu)


def task_stages(task: str, num_layers: int, layers_per_ipu: Sequence[int] = ()) -> Stages:
    """The parts of the packed model of ``task`` (a task's name) with ``num_layers`` layers, without building it
    (the dry run): the task's recipe names which of the functions above."""
    from .. import tasks

    return tasks.TASKS[task].stages(num_layers, layers_per_ipu)


def parameter_owners(model: torch.nn.Module, stages: Stages) -> Dict[str, Part]:
    """Parameter name (``named_parameters``, tied weights once) -> the one part whose modules hold it."""
    owners = {}  # type: Dict[str, Part]
    for name, _ in model.named_parameters():
        found = [p for p in stages.parts for m in p.modules if name == m or name.startswith(m + ".")]
        if len(found) != 1:
            raise ValueError("parameter %s belongs to %d parts, not 1" % (name, len(found)))
        owners[name] = found[0]
    return owners


__all__ = [
    "HIDDEN",
    "INPUTS",
    "OUTPUT",
    "Part",
    "Stages",
    "heads_on_last_device",
    "layer_split",
    "model_stages",
    "parameter_owners",
    "pretraining_stages",
]

