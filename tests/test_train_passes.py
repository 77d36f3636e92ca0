"""Micro batches run in passes: on the torch backend a replica's step runs several micro batches in one forward and
backward (ExecutionConfig ``pass_sizes``, within ``execution.pass_memory_mb``), each micro batch's loss still its
own mean (the models' ``loss_groups``), so the step's losses, metrics and gradients are those of one pass per micro
batch. Float64 models on random packs (tests/task_packs.py) for every head; a fine-tuning run on the demo task at a
high packing factor, whose step off the IPU is its global batch in packs whatever micro batch the config names,
and a padded run of one-row micro batches in one pass against the same run one micro batch a pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import app_fixtures as fx
from ipu_packing.execution import ExecutionConfig
from ipu_packing.model import PackedBertForPreTraining
from ipu_packing.model.classification import PackedBertForSequenceClassification
from ipu_packing.model.question_answering import PackedBertForQuestionAnswering
from ipu_packing.train import load_config
from ipu_packing.train.loop import plan_run
from ipu_packing.train.run_config import RunConfig
from model_fixtures import make_config, randomize_
from task_packs import TINY, task_packs

GROUPS = 4  # task_packs' 8 packs: 4 micro batches of 2


def _labels(kind, batch, rng):
    """The label fields of ``kind``'s model for ``batch`` (seeded)."""
    B, K = batch["cls_positions"].shape
    if kind == "pretraining":
        return {k: batch[k] for k in ("mlm_positions", "mlm_labels", "cls_positions", "nsp_labels")}
    if kind == "question_answering":
        return {"start_positions": batch["cls_positions"] + 1, "end_positions": batch["cls_positions"] + 2}
    problem, labels = kind
    if problem == "single_label_classification":
        labels = torch.as_tensor(rng.integers(0, 3, (B, K)))
    elif problem == "regression":
        labels = torch.as_tensor(rng.normal(size=(B, K)))
    else:
        labels = torch.as_tensor(rng.integers(0, 2, (B, K, 3)).astype(np.float64))
    return {"cls_positions": batch["cls_positions"], "labels": labels}


KINDS = {
    "pretraining": (PackedBertForPreTraining, {}, "pretraining"),
    "single_label": (PackedBertForSequenceClassification,
                     dict(num_labels=3, problem_type="single_label_classification"),
                     ("single_label_classification", 3)),
    "regression": (PackedBertForSequenceClassification, dict(num_labels=1, problem_type="regression"),
                   ("regression", 1)),
    "multi_label": (PackedBertForSequenceClassification, dict(num_labels=3, problem_type="multi_label_classification"),
                    ("multi_label_classification", 3)),
    "question_answering": (PackedBertForQuestionAnswering, {}, "question_answering"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KINDS))
def test_one_pass_of_micro_batches_computes_what_one_pass_each_does(name):
    cls, fields, kind = KINDS[name]
    torch.manual_seed(0)
    model = cls(make_config(**dict(TINY, **fields)), attention="dense").double().eval()
    randomize_(model, 0)
    _, batch = task_packs(0)
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "position_ids", "sequence_ids")}
    inputs.update(_labels(kind, batch, np.random.default_rng(1)))
    rows = batch["input_ids"].shape[0] // GROUPS

    merged = model(**inputs, loss_groups=GROUPS)
    merged.loss.backward()
    together = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    parts = [model(**{k: v[g * rows:(g + 1) * rows] for k, v in inputs.items()}) for g in range(GROUPS)]
    (sum(p.loss for p in parts) / GROUPS).backward()

    for metric in model.METRICS if hasattr(model, "METRICS") else ("loss",):
        mean = sum(float(getattr(p, metric).detach()) for p in parts) / GROUPS
        assert float(getattr(merged, metric).detach()) == pytest.approx(mean, rel=1e-12, abs=1e-15), metric
    plain = float(model(**inputs).loss.detach())  # the mean over the whole batch: not what a step of 4 computes
    assert float(merged.loss.detach()) != pytest.approx(plain, rel=1e-6)
    assert together and all(torch.allclose(together[n], p.grad, rtol=1e-10, atol=1e-13)
                            for n, p in model.named_parameters() if p.grad is not None)


def test_passes_split_the_accumulation_evenly_and_only_where_one_stage_runs_on_torch():
    assert ExecutionConfig(gradient_accumulation=7, micro_batches_per_pass=3).pass_sizes == [3, 2, 2]
    assert ExecutionConfig(gradient_accumulation=7, micro_batches_per_pass=7).pass_sizes == [7]
    assert ExecutionConfig(gradient_accumulation=7, micro_batches_per_pass=7, pass_memory_mb=0).pass_sizes == [1] * 7
    pipeline = ExecutionConfig(gradient_accumulation=4, micro_batches_per_pass=4, layers_per_ipu=[1, 1])
    assert pipeline.pass_sizes == [1] * 4
    assert ExecutionConfig(backend="poptorch", gradient_accumulation=3, micro_batches_per_pass=3).pass_sizes == [1] * 3


TASK = ["model.vocab_size=8192", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2",
        "model.num_attention_heads=2", "data.max_seq_length=64", "data.max_sequences_per_pack=6",
        "execution.micro_batch_size=1", "training.global_batch_sequences=24", "training.steps=3",
        "logging.progress_bar=false", "logging.tensorboard=false", "checkpoint.init_from=null",
        "task.eval_batch_packs=16", "task.eval_every_steps=0", "checkpoint.export=false"]


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_packed_step_off_the_ipu_holds_the_global_batch_whatever_micro_batch_the_config_names(demo_task, tmp_path,
                                                                                              monkeypatch):
    """At a high packing factor the packed step is 24 / factor packs in one micro batch, from a named micro batch of
    1 pack or of 8 alike (the same losses, bitwise); a pass memory too small for it cuts it into the fewest equal
    micro batches that fit; pass_memory_mb 0 keeps the named micro batch, one a pass."""
    def config(name, *extra):
        return load_config("finetune_demo", TASK + ["data.dir=%s" % demo_task,
                                                    "checkpoint.output_dir=%s" % (tmp_path / name)] + list(extra))

    plan = plan_run(config("one"))
    ex = plan.accounting.execution
    step = int(math.floor(24 / plan.data.packing_factor + 0.5))
    assert plan.data.packing_factor > 3 and step >= 5
    assert (ex.micro_batch_size, ex.gradient_accumulation, ex.pass_sizes) == (step, 1, [1])
    assert plan.accounting.named_micro_batch == 1
    said = plan.accounting.describe()
    assert ("the step in packs (training.global_batch_sequences / packing factor; execution.micro_batch_size 1 is "
            "the padded layout's): 1 micro batch of %d packs; %d packs/step" % (step, step)) in said
    eight = plan_run(config("eight", "execution.micro_batch_size=8")).accounting.execution
    assert (eight.micro_batch_size, eight.gradient_accumulation) == (step, 1)
    with monkeypatch.context() as m:  # a pass memory that holds 2 packs (this tiny model's fit in 1 MiB)
        m.setattr(RunConfig, "packs_per_pass", lambda self, execution: 2)
        small = plan.config.batch_accounting(plan.data.packing_factor).execution
    count = -(-step // 2)
    assert small.gradient_accumulation == count and small.micro_batch_size == int(math.floor(step / count + 0.5))
    named = plan_run(config("named", "execution.pass_memory_mb=0")).accounting.execution
    assert (named.micro_batch_size, named.gradient_accumulation, named.pass_sizes) == (1, step, [1] * step)

    fx.train(config("one"))
    fx.train(config("eight", "execution.micro_batch_size=8"))
    a, b = (fx.losses_of(str(tmp_path / name), "loss", "accuracy") for name in ("one", "eight"))
    assert len(a) == 3 and a == b


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_padded_step_of_one_row_micro_batches_runs_in_one_pass_as_it_would_one_a_pass(demo_task, tmp_path):
    def config(name, *extra):
        return load_config("finetune_demo", TASK + ["data.dir=%s" % demo_task, "data.layout=padded",
                                                    "checkpoint.output_dir=%s" % (tmp_path / name)] + list(extra))

    plan = plan_run(config("merged"))
    ex = plan.accounting.execution
    assert plan.data.packing_factor == 1.0 and plan.accounting.named_micro_batch == 0
    assert (ex.micro_batch_size, ex.gradient_accumulation, ex.pass_sizes) == (1, 24, [24])
    assert "runs as 1 pass of 24 micro batches" in plan.accounting.describe_passes()
    one_each = plan_run(config("one_each", "execution.pass_memory_mb=0")).accounting.execution
    assert one_each.pass_sizes == [1] * 24 and one_each.global_batch_packs == ex.global_batch_packs

    merged = fx.train(config("merged"))
    separate = fx.train(config("one_each", "execution.pass_memory_mb=0"))
    a, b = (fx.losses_of(str(tmp_path / name), "loss", "accuracy") for name in ("merged", "one_each"))
    assert len(a) == 3 and [x for row in a for x in row] == pytest.approx([x for row in b for x in row], rel=1e-5)
    assert merged["evaluation"]["metrics"] == pytest.approx(separate["evaluation"]["metrics"], rel=1e-5)


def test_the_dry_run_says_how_a_step_runs_and_on_the_ipu_what_its_static_micro_batch_costs():
    from ipu_packing.train.cli import finetune_main, main

    dry = ["--config", "finetune_demo", "--dry-run", "execution.micro_batch_size=1",
           "data.packing_factor_estimate=4.72"]
    code, out, err = fx.captured(finetune_main, dry)
    assert code == 0, err
    assert "1 micro batch of 7 packs; 7 packs/step ~ 33 sequences/step" in out  # 32 / 4.72
    assert "passes: a replica's step (1 micro batch of 7 packs = 7 packs) runs as 1 pass" in out
    code, out, err = fx.captured(finetune_main, dry + ["execution.pass_memory_mb=0"])
    assert code == 0 and "runs as 7 passes of 1 micro batch (execution.pass_memory_mb 0)" in out
    code, out, err = fx.captured(finetune_main, dry[:3] + ["data.layout=padded"])
    assert code == 0 and "passes: a replica's step (4 micro batches of 8 packs = 32 packs) runs as 1 pass of 4 " \
                         "micro batches" in out
    code, out, err = fx.captured(main, ["--config", "bert_base_512_pod16", "--dry-run"])
    assert code == 0, err
    assert "runs as 256 passes of 1 micro batch (the IPU's static micro batch)" in out
    assert "static micro batch (IPU): 8 packs, ~16.0 sequences at factor 2.000; a packed step runs 256 micro batches " \
           "of it (the padded layout 512)" in out
