"""The dry run for any config, without poptorch: placement of every layer on its IPU/stage,
memory per IPU against 900 MB (the memory model itself: tests/test_execution_memory.py), batch sizes in
packs and sequences."""

from __future__ import annotations

import sys

import pytest
import transformers

from ipu_packing.execution import ExecutionConfig
from ipu_packing.execution.dry_run import dry_run_report, memory_per_device, module_parameters

from shipped_configs import CASES

LARGE = transformers.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)


@pytest.fixture(autouse=True)
def no_poptorch(monkeypatch):
    monkeypatch.setitem(sys.modules, "poptorch", None)  # the dry run must not need it


def test_parameter_counts_match_transformers():
    config = transformers.BertConfig(vocab_size=96, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=80, max_position_embeddings=40, type_vocab_size=2)
    model = transformers.BertForPreTraining(config)
    counts = module_parameters(config)
    assert sum(counts.values()) == sum(p.numel() for p in model.parameters())  # tied decoder counted once
    for name, n in counts.items():
        module = model.get_submodule(name)
        own = sum(p.numel() for p in module.parameters())
        if name == "cls":  # its decoder weight is the word embedding, counted with the embeddings
            own -= config.vocab_size * config.hidden_size
        assert own == n, name


@pytest.mark.parametrize("task, hf_class, num_labels", [
    ("classification", "BertForSequenceClassification", 3),
    ("question_answering", "BertForQuestionAnswering", 2),  # start and end logits
])
def test_task_models_place_their_own_heads_only(task, hf_class, num_labels):
    config = transformers.BertConfig(vocab_size=96, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=80, max_position_embeddings=40, num_labels=num_labels)
    model = getattr(transformers, hf_class)(config)
    counts = module_parameters(config, task)
    assert sum(counts.values()) == sum(p.numel() for p in model.parameters())
    assert "cls" not in counts
    report = dry_run_report(config, ExecutionConfig(backend="poptorch", layers_per_ipu=[0, 1, 2],
                                                    device_iterations=3), 2.0, task=task)
    assert "python run_finetuning.py" in report
    assert "MLM loss" not in report and "MLM logits" not in report  # a task model has no MLM head: no MLM memory


def test_bert_large_pod16_memory_per_ipu():
    # micro batch 2 at S=512, as pretrain_large_512 (the 8 of pretrain_large_128 would not fit its stashes)
    e = ExecutionConfig(backend="poptorch", micro_batch_size=2, gradient_accumulation=1024, replication_factor=4,
                        layers_per_ipu=[3, 7, 7, 7], precision="fp16")
    plan, rows = memory_per_device(LARGE, e, "lamb")
    counts = module_parameters(LARGE)
    layer = counts["bert.encoder.layer.0"]
    heads = counts["bert.embeddings"] + counts["bert.pooler"] + counts["cls"]
    assert [r["params"] for r in rows] == [heads + 3 * layer, 7 * layer, 7 * layer, 7 * layer]
    assert sum(r["params"] for r in rows) == sum(counts.values())
    # fp16 weights + fp16 accumulators on chip (an fp16 model's accumulators follow it, as Graphcore's
    # accum_type=float16), LAMB's two fp32 moments off chip (published default)
    assert rows[1]["weights"] + rows[1]["gradients"] == 7 * layer * (2 + 2)
    assert rows[1]["optimizer"] == 0 and rows[1]["optimizer_offchip"] == 7 * layer * 8
    assert all(r["total"] < 900e6 for r in rows)
    # on chip they would not fit: why the published app streams optimizer state
    _, on_chip = memory_per_device(LARGE, ExecutionConfig(**dict(vars(e), optimizer_state_offchip=False)), "lamb")
    assert on_chip[1]["weights"] + on_chip[1]["gradients"] + on_chip[1]["optimizer"] == 7 * layer * 12 > 900e6


def test_torch_pipeline_holds_the_tied_embedding_twice():
    e = ExecutionConfig(layers_per_ipu=[12, 12])
    _, rows = memory_per_device(LARGE, e, "adamw")
    counts = module_parameters(LARGE)
    assert sum(r["params"] for r in rows) == sum(counts.values()) + LARGE.vocab_size * LARGE.hidden_size


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_for_every_ipu_config(case):
    layers, kwargs = CASES[case]
    model_config = transformers.BertConfig(num_hidden_layers=layers)
    execution = ExecutionConfig(**kwargs)
    report = dry_run_report(model_config, execution, sequences_per_pack=2.0)
    for i in range(layers):  # every layer is listed, in order, once
        assert report.count("bert.encoder.layer.%d " % i) == 1
    assert "of 900 MB" in report and "* stash" in report
    assert "%d packs" % execution.global_batch_packs in report
    assert "%.1f sequences" % execution.global_batch_sequences(2.0) in report
