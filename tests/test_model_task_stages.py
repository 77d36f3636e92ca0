"""The pipeline parts the task models declare (each model module's ``pipeline_stages``, model/stages.py
``heads_on_last_device``): running every part in order is the forward, every parameter belongs to exactly
one part, the heads sit on the last device, and the training step traces under the PopTorch stand-in
(tests/fake_poptorch) as PopART would accept it: every op in a block, every weight and every input stream on
one IPU while pipelining, supported ops only, the loss through identity_loss.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from ipu_packing import tasks
from ipu_packing.execution import ExecutionConfig
from ipu_packing.execution.poptorch_backend import apply_placement
from ipu_packing.execution.poptorch_options import build_options
from ipu_packing.model import (
    PackedBertForPreTraining,
    PackedBertForQuestionAnswering,
    PackedBertForSequenceClassification,
)
from ipu_packing.model.classification import INPUTS as CLASSIFICATION_INPUTS
from ipu_packing.model.classification import pipeline_stages as classification_stages
from ipu_packing.model.question_answering import INPUTS as QUESTION_ANSWERING_INPUTS
from ipu_packing.model.question_answering import pipeline_stages as question_answering_stages
from ipu_packing.model.stages import HIDDEN, OUTPUT, model_stages, parameter_owners, pretraining_stages
from task_packs import slots, task_packs

import poptorch_stand_in as si

TASKS = {task.name: task for task in tasks.TASKS.values() if task.fine_tuning}
"""Every fine-tuning task of the registry: its model class and its parts (tasks/: model and stages hooks)."""


def test_the_registry_names_each_tasks_model_and_parts():
    assert {name: (task.model_class(), task.stages(2).inputs) for name, task in TASKS.items()} == {
        "classification": (PackedBertForSequenceClassification, CLASSIFICATION_INPUTS),
        "question_answering": (PackedBertForQuestionAnswering, QUESTION_ANSWERING_INPUTS)}
    assert classification_stages(2, [1, 1]) == TASKS["classification"].stages(2, [1, 1])
    assert question_answering_stages(2, [1, 1]) == TASKS["question_answering"].stages(2, [1, 1])


def tiny(task, num_layers=2, seed=0, dropout=0.0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=97, hidden_size=16, num_hidden_layers=num_layers, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=dropout,
                                     attention_probs_dropout_prob=dropout,
                                     num_labels=3 if task == "classification" else 2)
    return TASKS[task].model_class()(config)


def task_batch(task, seed=0, num_packs=6):
    """The task's fields, in its forward's order, with labels for every real sequence."""
    groups, batch = task_packs(seed, num_packs=num_packs)
    rng = np.random.default_rng(seed)
    if task == "classification":
        batch["labels"] = torch.as_tensor(rng.integers(0, 3, size=batch["cls_positions"].shape))
    else:
        start = torch.full_like(batch["cls_positions"], -100)
        for b, k, seq in slots(groups):
            start[b, k] = batch["cls_positions"][b, k] + int(rng.integers(0, len(seq)))
        batch["start_positions"], batch["end_positions"] = start, start.clone()
    return {name: batch[name] for name in TASKS[task].stages(2).inputs}


@pytest.mark.parametrize("split", [[], [2], [0, 2], [1, 1], [2, 0]])
@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_parts_in_order_are_the_forward(task, split):
    model = tiny(task).eval()
    batch = task_batch(task)
    stages = TASKS[task].stages(2, split)
    assert stages.inputs == tuple(batch) and model_stages(model, split) == stages
    state = dict(batch)
    for part in stages.parts:
        assert set(part.reads) <= set(state), part.name  # every part reads only what exists by then
        stages.run(model, part, state)
    whole = model(**batch)
    for name, value in whole._asdict().items():
        assert torch.equal(getattr(state[OUTPUT], name), value), name
    assert whole.loss.item() > 0


@pytest.mark.parametrize("split", [[], [2], [0, 2], [1, 1], [2, 0], [0, 1, 1]])
@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_parameter_belongs_to_one_part_and_the_heads_sit_on_the_last_device(task, split):
    model = tiny(task)
    stages = TASKS[task].stages(2, split)
    owners = parameter_owners(model, stages)
    assert set(owners) == {n for n, _ in model.named_parameters()}
    heads = stages.parts[-1]
    assert heads.name == "Heads" and heads.entry == "heads" and heads.writes == (OUTPUT,)
    assert heads.device == len(split or [2]) - 1  # the last device of the split
    assert heads.reads == (HIDDEN,) + stages.inputs[3:]  # sequence_ids and the head's fields
    head_weight = "classifier.weight" if task == "classification" else "qa_outputs.weight"
    assert owners[head_weight] is heads and owners["bert.embeddings.word_embeddings.weight"].device == 0
    assert [p.device for p in stages.parts[1:-1]] == [d for d, n in enumerate(split or [2]) for _ in range(n)]


def test_the_task_heads_pipeline_has_one_group_fewer_than_heads_on_device_0():
    """Heads on the last device continue its group; the pretraining heads (device 0, with the tied word
    embedding) open one more: PopART's minimum accumulation is 2G-1 for G groups."""

    def groups(stages):
        devices = [p.device for p in stages.parts]
        return 1 + sum(a != b for a, b in zip(devices, devices[1:]))

    assert groups(classification_stages(4, [1, 1, 1, 1])) == groups(question_answering_stages(4, [1, 1, 1, 1])) == 4
    assert groups(pretraining_stages(4, [1, 1, 1, 1])) == 5


def test_model_stages_names_a_model_without_parts():
    with pytest.raises(ValueError, match="declares no pipeline parts"):
        model_stages(torch.nn.Linear(2, 2))
    assert model_stages(si.tiny_model(2)) == pretraining_stages(2)
    assert PackedBertForPreTraining.TASK == "pretraining"


class _TrainingStep(torch.nn.Module):
    """What a PopTorch runner compiles: the model on positional fields, the loss through identity_loss."""

    def __init__(self, model, names, poptorch) -> None:
        super().__init__()
        self.model, self.names, self.identity_loss = model, names, poptorch.identity_loss

    def forward(self, *fields):
        out = self.model(**dict(zip(self.names, fields)))
        return (self.identity_loss(out.loss, reduction="none"),) + tuple(
            t for t in out[1:] if t is not None and t.dim() == 0)


CONFIG = dict(backend="poptorch", micro_batch_size=2, gradient_accumulation=5, layers_per_ipu=[1, 1],
              use_ipu_model=True, device_iterations=1, optimizer_state_offchip=False)


def compile_step(poptorch, task, model=None):
    config = ExecutionConfig(**CONFIG)
    model = model or tiny(task, dropout=0.1)
    stages = TASKS[task].stages(2, config.layers_per_ipu)
    apply_placement(model, config, poptorch, stages)
    model.train()
    batch = task_batch(task, num_packs=8)  # 10 packs: micro batch 2 x accumulation 5
    step = _TrainingStep(model, stages.inputs, poptorch)
    executor = poptorch.trainingModel(step, options=build_options(config, poptorch))
    executor.compile(*(batch[name] for name in stages.inputs))
    return executor


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_training_step_traces_as_popart_would_accept_it(poptorch, task):
    trace = compile_step(poptorch, task).trace
    assert all(ipu is not None for _, ipu, _ in trace.ops)  # every op in a block
    blocks = list(dict.fromkeys(trace.block_order))
    assert blocks == [("Embedding", 0), ("Encoder0", 0), ("Encoder1", 1), ("Heads", 1)]
    heads = [op for op, _, block in trace.ops if block == "Heads"]
    assert "nll_loss_forward" in heads and {ipu for _, ipu, b in trace.ops if b == "Heads"} == {1}
    if task == "question_answering":
        assert "where" in heads  # the per-window logits are built on the heads' IPU
    assert [op for op, _, _ in trace.ops].count("poptorch.identity_loss") == 1


@pytest.mark.parametrize("task", sorted(TASKS))
def test_deriving_the_slots_after_the_encoder_is_refused(poptorch, task):
    """Why the forward derives the per-sequence tensors next to the attention mask: the heads' own entry
    point (what a torch pipeline runs) reads sequence_ids after the last layer, on the last IPU, and PopART
    streams an input onto one IPU only while pipelining."""
    model = tiny(task, dropout=0.1)
    heads = model.classification_heads if task == "classification" else model.question_answering_heads

    def forward(input_ids, token_type_ids, position_ids, sequence_ids, **head_fields):
        return heads(model.bert(input_ids, token_type_ids, position_ids, sequence_ids), sequence_ids, **head_fields)

    model.forward = forward
    with pytest.raises(poptorch.Error, match=r"stream tensors can only be streamed directly onto a single IPU "
                                             r"\(input 3 used on IPUs \[0, 1\]\)"):
        compile_step(poptorch, task, model)
