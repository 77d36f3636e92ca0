"""Question answering on the one run machinery (run_finetuning.py, task.name=question_answering): a packed
BertForQuestionAnswering trained on the demo task's windows, evaluated per question on its validation split
(SQuAD v1.1 exact match and F1 after post-processing), exported as a directory transformers'
BertForQuestionAnswering loads and computes the same logits from, and resumed bitwise after a kill. The data: the
embedded demo task (data/finetune/qa_demo.py), prepared once per session at S=64 (conftest qa_demo_task)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.train import load_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

TINY_QA = ["model.vocab_size=8192", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2",
           "model.num_attention_heads=2", "data.max_seq_length=64", "data.max_sequences_per_pack=4",
           "execution.micro_batch_size=4", "training.global_batch_sequences=8", "logging.progress_bar=false",
           "logging.tensorboard=false", "checkpoint.init_from=null", "task.eval_batch_packs=64"]


@pytest.fixture(scope="module")
def task_dir(qa_demo_task):
    return qa_demo_task


def config(task_dir, run_dir, *extra):
    return load_config("finetune_qa_demo", TINY_QA + ["data.dir=%s" % task_dir, "checkpoint.output_dir=%s" % run_dir]
                       + list(extra))


def test_a_run_trains_evaluates_and_exports_what_transformers_loads(task_dir, tmp_path):
    run = str(tmp_path / "run")
    summary = fx.train(config(task_dir, run, "training.steps=4", "task.eval_every_steps=2"))
    rows = fx.metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert {"loss", "start_accuracy", "end_accuracy"} <= set(rows[0]) and "mlm_loss" not in rows[0]
    evaluations = [json.loads(line) for line in open(os.path.join(run, "eval.jsonl"))]
    questions = fx.num_questions(task_dir, "validation")
    assert [e["step"] for e in evaluations] == [2, 4] and all(e["examples"] == questions for e in evaluations)
    assert set(evaluations[-1]["metrics"]) == {"exact_match", "f1"}
    assert all(0 <= v <= 100 for e in evaluations for v in e["metrics"].values())
    assert summary["evaluation"]["metrics"] == evaluations[-1]["metrics"]
    assert summary["task"] == "question_answering"

    import transformers

    from ipu_packing.model import PackedBertForQuestionAnswering

    final = os.path.join(run, "final")
    hf = transformers.BertForQuestionAnswering.from_pretrained(final).eval()
    ours = PackedBertForQuestionAnswering.from_pretrained(final).eval()
    packs = open_dataset(os.path.join(task_dir, "validation", "packed"), as_tensors=False)
    checked = 0
    for i in range(4):
        row = packs[i]
        batch = {k: torch.as_tensor(row[k])[None].long() for k in
                 ("input_ids", "token_type_ids", "position_ids", "sequence_ids")}
        with torch.no_grad():
            mine = ours(**batch, num_slots=int(row["feature_ids"].shape[0]))
        for k in np.nonzero(row["feature_ids"] >= 0)[0]:
            own = row["sequence_ids"] == k + 1
            first, n = int(row["cls_positions"][k]), int(own.sum())
            with torch.no_grad():
                theirs = hf(input_ids=batch["input_ids"][:, first:first + n],
                            token_type_ids=batch["token_type_ids"][:, first:first + n])
            own_t = torch.as_tensor(own)
            assert torch.allclose(theirs.start_logits[0], mine.start_logits[0, k][own_t], atol=1e-5)
            assert torch.allclose(theirs.end_logits[0], mine.end_logits[0, k][own_t], atol=1e-5)
            checked += 1
    assert checked >= 4


def test_a_killed_run_resumes_to_bitwise_the_same_losses_and_evaluations(task_dir, tmp_path):
    args = ["training.steps=4", "checkpoint.every_steps=2", "checkpoint.keep=4", "task.eval_every_steps=2"]
    reference = str(tmp_path / "reference")
    fx.train(config(task_dir, reference, *args))
    killed = str(tmp_path / "killed")
    shutil.copytree(reference, killed)
    os.unlink(os.path.join(killed, "checkpoints", "step_0000004.pt"))  # as a kill after step 3's metrics leaves it
    shutil.rmtree(os.path.join(killed, "final"))
    os.unlink(os.path.join(killed, "summary.json"))
    fx.train(config(task_dir, killed, *args))
    metrics = ("loss", "start_accuracy", "end_accuracy")
    assert fx.losses_of(killed, *metrics) == fx.losses_of(reference, *metrics)
    evaluations = [open(os.path.join(d, "eval.jsonl")).read() for d in (reference, killed)]
    assert evaluations[0] == evaluations[1] and evaluations[0].count("\n") == 2
    ref, res = fx.load(fx.latest(reference)), fx.load(fx.latest(killed))
    for key, value in ref.model.items():
        assert torch.equal(value, res.model[key]), key


def _task_copy(task_dir, tmp_path, edit):
    """The demo task copied, its validation split's examples file rewritten by ``edit`` (checksum updated)."""
    root = str(tmp_path / "task")
    shutil.copytree(task_dir, root)
    fx.rewrite_examples(os.path.join(root, "validation", "packed"), edit)
    return root


def test_contexts_holding_line_separators_are_evaluated(task_dir, tmp_path):
    """U+2028, U+0085, U+2029 and U+001C in a context are characters of its examples file's rows, not line ends:
    the run evaluates every question and finishes."""
    root = _task_copy(task_dir, tmp_path, fx.line_breaks_in_contexts)
    run = str(tmp_path / "run")
    summary = fx.train(config(root, run, "training.steps=2", "checkpoint.export=false"))
    assert summary["evaluation"]["examples"] == fx.num_questions(task_dir, "validation")
    assert [r["step"] for r in fx.read_jsonl(os.path.join(run, "eval.jsonl"))] == [2]


def test_an_examples_row_without_answers_is_refused_before_the_first_step(task_dir, tmp_path):
    from ipu_packing.errors import DataError
    from ipu_packing.train.loop import plan_run

    def without_answers(rows):
        del rows[2]["answers"]
        return rows

    root = _task_copy(task_dir, tmp_path, without_answers)
    run = str(tmp_path / "run")
    with pytest.raises(DataError) as refused:
        plan_run(config(root, run, "training.steps=2"), open_dataset=open_dataset)
    assert str(refused.value) == "%s:3: has no 'answers' (every example holds id, question, context, answers)" % (
        os.path.join(root, "validation", "packed", "examples.jsonl"))
    assert not os.path.exists(run)
