"""The stages the model declares (ipu_packing/model/stages.py): running every part in order is the forward,
every parameter belongs to exactly one part, and a split that does not cover the layers is refused."""

from __future__ import annotations

import pytest
import torch

from ipu_packing.execution.runner_common import BATCH_FIELDS
from synthetic_packs import collate
from ipu_packing.model.stages import HIDDEN, INPUTS, OUTPUT, parameter_owners, pretraining_stages

import poptorch_stand_in as si
from execution_fixtures import build_model, make_packs


def test_the_parts_in_order_are_the_forward():
    model = si.tiny_model(3, dropout=0.0)
    batch = {k: torch.as_tensor(v) for k, v in collate(si.packs(4)).items()}
    stages = pretraining_stages(3, [1, 2])
    state = dict(batch)
    for part in stages.parts:
        assert set(part.reads) <= set(state), part.name  # every part reads only what exists by then
        stages.run(model, part, state)
    whole = model(**batch)
    assert torch.equal(state[OUTPUT].loss, whole.loss) and torch.equal(state[OUTPUT].mlm_logits, whole.mlm_logits)
    assert stages.inputs == INPUTS == BATCH_FIELDS


@pytest.mark.parametrize("split", [[], [2], [0, 2], [1, 1], [0, 1, 1]])
def test_every_parameter_belongs_to_one_part_and_heads_sit_with_the_embeddings(split):
    model = si.tiny_model(2)
    stages = pretraining_stages(2, split)
    owners = parameter_owners(model, stages)
    assert set(owners) == {n for n, _ in model.named_parameters()}
    assert owners["bert.embeddings.word_embeddings.weight"].name == "Embedding"
    heads = stages.parts[-1]
    assert heads.name == "Heads" and heads.device == 0 and heads.writes == (OUTPUT,) and HIDDEN in heads.reads
    assert [p.device for p in stages.parts[1:-1]] == [d for d, n in enumerate(split or [2]) for _ in range(n)]


def test_a_split_that_misses_layers_is_refused():
    with pytest.raises(ValueError) as info:
        pretraining_stages(2, [1, 2])
    assert str(info.value) == "execution.layers_per_ipu [1, 2] sums to 3, but model.num_hidden_layers is 2"


def test_forward_is_the_composition_the_pipeline_splits():
    model = build_model()
    batch = {k: torch.as_tensor(v) for k, v in collate(make_packs(4)).items()}
    whole = model(**batch)
    h = model.bert.embeddings(batch["input_ids"], batch["token_type_ids"], batch["position_ids"])
    mask = model.bert.get_attention_mask(batch["sequence_ids"])
    for layer in model.bert.encoder.layer:
        h = layer(h, mask)
    parts = model.pretraining_heads(h, *(batch[k] for k in BATCH_FIELDS[4:]))
    assert torch.equal(whole.loss, parts.loss)
    assert torch.equal(whole.mlm_logits, parts.mlm_logits)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
