"""ExecutionConfig: derived batch values in one place, and one-line errors for bad values."""

from __future__ import annotations

import pytest

from ipu_packing.execution import ExecutionConfig
from ipu_packing.execution.placement import owner_stage, plan_placement


def test_derived_batch_sizes():
    c = ExecutionConfig(backend="poptorch", micro_batch_size=8, gradient_accumulation=64, replication_factor=4,
                        device_iterations=2, layers_per_ipu=[3, 7, 7, 7])
    assert c.num_stages == c.ipus_per_replica == 4
    assert c.packs_per_replica_step == 8 * 64
    assert c.global_batch_packs == 8 * 64 * 4
    assert c.global_batch_sequences(2.0) == 8 * 64 * 4 * 2.0
    assert c.combined_batch_packs == 8 * 2 * 4 * 64 == c.packs_per_loader_item
    assert c.optimizer_steps_per_call == 2
    assert c.total_ipus == 16
    assert ExecutionConfig(backend="poptorch", replication_factor=3, layers_per_ipu=[1, 1]).total_ipus == 8
    t = ExecutionConfig(micro_batch_size=8, gradient_accumulation=4, replication_factor=2, device_iterations=5)
    assert t.packs_per_loader_item == 32 and t.optimizer_steps_per_call == 1 and t.world_size == 2
    assert ExecutionConfig(layers_per_ipu=[2, 2]).world_size == 2


def test_memory_proportion_broadcast_and_per_ipu():
    assert ExecutionConfig(layers_per_ipu=[1, 1, 1], available_memory_proportion=[0.2]).memory_proportion_for(2) == 0.2
    c = ExecutionConfig(layers_per_ipu=[1, 1], available_memory_proportion=[0.1, 0.3])
    assert [c.memory_proportion_for(i) for i in range(2)] == [0.1, 0.3]
    assert ExecutionConfig().memory_proportion_for(0) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(backend="tpu"), "execution.backend must be one of"),
        (dict(micro_batch_size=0), "execution.micro_batch_size must be an integer >= 1, got 0"),
        (dict(gradient_accumulation=2.5), "execution.gradient_accumulation must be an integer >= 1"),
        (dict(layers_per_ipu=[0, 0]), "places no encoder layer"),
        (dict(layers_per_ipu=[2, -1]), "layers_per_ipu must be integers >= 0"),
        (dict(layers_per_ipu=[1, 1], available_memory_proportion=[0.1, 0.2, 0.3]), "one value or one per IPU (2)"),
        (dict(available_memory_proportion=[1.5]), "must be in (0, 1]"),
        (dict(loss_scaling=0), "loss_scaling must be > 0"),
        (dict(pipeline_schedule="zb"), "pipeline_schedule must be one of"),
        (dict(backend="poptorch", compile_only=True, use_ipu_model=True), "cannot use the IPU Model"),
        (dict(precision="int8"), "execution.precision must be one of"),
    ],
)
def test_bad_values_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError) as err:
        ExecutionConfig(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unknown_field_is_an_error():
    with pytest.raises(TypeError):
        ExecutionConfig(replication=2)


def test_layers_must_cover_the_model():
    with pytest.raises(ValueError) as info:
        plan_placement(6, ExecutionConfig(layers_per_ipu=[2, 2]))
    assert str(info.value) == "execution.layers_per_ipu [2, 2] sums to 4, but model.num_hidden_layers is 6"


def test_placement_and_owners():
    c = ExecutionConfig(layers_per_ipu=[0, 2, 1])
    plan = plan_placement(3, c)
    assert [(p.module, p.ipu, p.stage) for p in plan] == [
        ("bert.embeddings", 0, 0),
        ("bert.encoder.layer.0", 1, 1),
        ("bert.encoder.layer.1", 1, 1),
        ("bert.encoder.layer.2", 2, 2),
        ("bert.pooler", 0, 2),
        ("cls", 0, 2),
    ]
    assert owner_stage("bert.embeddings.word_embeddings.weight", plan) == 0
    assert owner_stage("bert.encoder.layer.1.qkv.weight", plan) == 1
    assert owner_stage("bert.encoder.layer.2.out.bias", plan) == 2
    assert owner_stage("cls.predictions.decoder.bias", plan) == 2
