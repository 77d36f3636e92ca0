"""Fine-tuning on the one run machinery (run_finetuning.py, task.name=classification): a packed classifier trained
from a pretraining export, evaluated per example on its validation split, resumed bitwise after a kill, refused
where config and data disagree, and exported as a directory transformers' BertForSequenceClassification loads
and computes the same logits from. The data: the embedded demo task (data/finetune/demo.py), prepared with the
default vocabulary at S=64."""

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
from ipu_packing.train.cli import finetune_main, main as pretrain_main
from ipu_packing.train.loop import plan_run

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

# the demo BERT's vocabulary (the default one), a small classifier
TINY_TASK = ["model.vocab_size=8192", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2",
             "model.num_attention_heads=2", "data.max_seq_length=64", "data.max_sequences_per_pack=6",
             "execution.micro_batch_size=4", "training.global_batch_sequences=24", "logging.progress_bar=false",
             "logging.tensorboard=false", "checkpoint.init_from=null", "task.eval_batch_packs=16"]


def config(demo_task, run_dir, *extra):
    return load_config("finetune_demo", TINY_TASK + ["data.dir=%s" % demo_task, "checkpoint.output_dir=%s" % run_dir]
                       + list(extra))


def test_a_run_trains_evaluates_and_exports_what_transformers_loads(demo_task, tmp_path):
    run = str(tmp_path / "run")
    summary = fx.train(config(demo_task, run, "training.steps=6", "task.eval_every_steps=3"))
    rows = fx.metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert {"loss", "accuracy", "sequences", "packs"} <= set(rows[0]) and "mlm_loss" not in rows[0]
    evaluations = [json.loads(line) for line in open(os.path.join(run, "eval.jsonl"))]
    assert [e["step"] for e in evaluations] == [3, 6] and all(
        e["examples"] == fx.num_examples(demo_task, "validation") for e in evaluations)
    assert set(evaluations[-1]["metrics"]) == {"accuracy", "f1", "matthews_correlation"}
    assert summary["evaluation"]["metrics"] == evaluations[-1]["metrics"] and summary["task"] == "classification"

    import transformers

    from ipu_packing.model import PackedBertForSequenceClassification

    final = os.path.join(run, "final")
    hf = transformers.BertForSequenceClassification.from_pretrained(final).eval()
    assert hf.config.id2label == {0: "concurrency", 1: "mail", 2: "networking", 3: "testing"}
    assert hf.config.problem_type == "single_label_classification"
    ours = PackedBertForSequenceClassification.from_pretrained(final).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(final)
    padded = open_dataset(os.path.join(demo_task, "validation", "padded"), as_tensors=False)
    for i in range(5):
        row = padded[i]
        n = int((row["sequence_ids"] != 0).sum())
        ids = torch.as_tensor(row["input_ids"][:n], dtype=torch.long)[None]
        with torch.no_grad():
            theirs = hf(input_ids=ids, token_type_ids=torch.zeros_like(ids)).logits[0]
            mine = ours(**{k: torch.as_tensor(row[k])[None].long() for k in
                           ("input_ids", "token_type_ids", "position_ids", "sequence_ids", "cls_positions")}).logits
        assert torch.allclose(theirs, mine[0, 0], atol=1e-5), i
    assert tokenizer.convert_ids_to_tokens([2, 3]) == ["[CLS]", "[SEP]"]


def test_the_evaluation_is_per_example_the_same_packed_or_one_per_row(demo_task, tmp_path):
    """Scoring the packed validation split and its padded twin (the same examples, one per row) with one model
    gives each example the same logits and so the same metrics: packing changes nothing an evaluation sees."""
    from ipu_packing.train.evaluate import collect
    from ipu_packing.train.task_metrics import task_metrics

    plan = plan_run(config(demo_task, str(tmp_path / "run")), open_dataset=open_dataset)
    model = plan.model
    packed = collect(model, open_dataset(os.path.join(demo_task, "validation", "packed")), 16)
    padded = collect(model, open_dataset(os.path.join(demo_task, "validation", "padded")), 16)
    examples = list(range(fx.num_examples(demo_task, "validation")))
    assert packed["example_ids"].tolist() == padded["example_ids"].tolist() == examples
    np.testing.assert_allclose(packed["logits"], padded["logits"], atol=1e-5)
    assert (packed["labels"] == padded["labels"]).all()
    a = task_metrics("single_label_classification", packed["logits"], packed["labels"], 4)
    b = task_metrics("single_label_classification", padded["logits"], padded["labels"], 4)
    assert a == b


def test_a_killed_run_resumes_to_bitwise_the_same_losses_and_evaluations(demo_task, tmp_path):
    args = ["training.steps=6", "checkpoint.every_steps=2", "checkpoint.keep=4", "task.eval_every_steps=2"]
    reference = str(tmp_path / "reference")
    fx.train(config(demo_task, reference, *args))
    killed = str(tmp_path / "killed")
    shutil.copytree(reference, killed)
    for name in ("step_0000004.pt", "step_0000006.pt"):  # as a kill after step 4's metrics leaves it
        os.unlink(os.path.join(killed, "checkpoints", name))
    shutil.rmtree(os.path.join(killed, "final"))
    os.unlink(os.path.join(killed, "summary.json"))
    fx.train(config(demo_task, killed, *args))
    assert fx.losses_of(killed, "loss", "accuracy") == fx.losses_of(reference, "loss", "accuracy")
    evaluations = [open(os.path.join(d, "eval.jsonl")).read() for d in (reference, killed)]
    assert evaluations[0] == evaluations[1] and evaluations[0].count("\n") == 3
    ref, res = fx.load(fx.latest(reference)), fx.load(fx.latest(killed))
    for key, value in ref.model.items():
        assert torch.equal(value, res.model[key]), key


ROWS = [
    ("a pretraining config", pretrain_main, ["--config", "finetune_demo"], "run it with run_finetuning.py"),
    ("a fine-tuning config", finetune_main, ["--config", "demo"], "run it with run_pretraining.py"),
    ("pretraining data", finetune_main, ["--config", "finetune_demo", 'data.split=""', "data.max_sequences_per_pack=3",
                                         "data.max_seq_length=32"], "is not a classification dataset"),
]


@pytest.mark.parametrize("row, command, argv, words", ROWS, ids=[r[0] for r in ROWS])
def test_config_and_data_that_disagree_are_one_line(row, command, argv, words, demo_task, tmp_path, capsys):
    data = fx.write_prepared(str(tmp_path / "pretraining"), S=32, K=3, V=64, num_sequences=96, seed=0)
    where = data if row == "pretraining data" else demo_task
    code = command(argv + TINY_TASK[:5] + ["data.dir=%s" % where, "checkpoint.output_dir=%s" % (tmp_path / "run"),
                                           "checkpoint.init_from=null"] + (["model.vocab_size=64"]
                                                                            if row == "pretraining data" else []))
    err = capsys.readouterr()[1]
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert words in err, err
    assert not os.path.exists(str(tmp_path / "run"))


def test_a_finished_fine_tuning_run_is_not_rewritten(demo_task, tmp_path, capsys):
    run = str(tmp_path / "run")
    argv = ["--config", "finetune_demo"] + TINY_TASK + ["data.dir=%s" % demo_task, "checkpoint.output_dir=%s" % run,
                                                        "training.steps=2"]
    assert finetune_main(argv) == 0
    capsys.readouterr()
    before = {name: os.stat(os.path.join(run, name)).st_mtime_ns for name in os.listdir(run)}
    assert finetune_main(argv) == 0
    assert "already finished at step 2" in capsys.readouterr()[0]
    assert {name: os.stat(os.path.join(run, name)).st_mtime_ns for name in os.listdir(run)} == before


def test_a_second_sigterm_during_an_evaluation_names_the_checkpoint_and_the_resume_evaluates_again(
        demo_task, tmp_path, monkeypatch):
    """Two SIGTERMs during the evaluation after step 2 (its checkpoint written): the line names that checkpoint, and
    the resumed run evaluates step 2 before training on, so eval.jsonl is the uninterrupted run's."""
    import signal

    from ipu_packing.signals import Stopped
    from ipu_packing.train import evaluate as evaluate_module

    args = ["training.steps=4", "checkpoint.every_steps=2", "checkpoint.keep=4", "task.eval_every_steps=2",
            "checkpoint.export=false"]
    reference = str(tmp_path / "reference")
    fx.train(config(demo_task, reference, *args))
    run = str(tmp_path / "run")
    evaluate = evaluate_module.evaluate

    def signalled(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(*a, **k)

    def outside_the_loop(signum, frame):
        raise RuntimeError("SIGTERM reached the test's own handler")

    monkeypatch.setattr(evaluate_module, "evaluate", signalled)
    previous = signal.signal(signal.SIGTERM, outside_the_loop)
    try:
        with pytest.raises(Stopped) as stopped:
            fx.train(config(demo_task, run, *args))
    finally:
        signal.signal(signal.SIGTERM, previous)
    checkpoint = os.path.join(run, "checkpoints", "step_0000002.pt")
    assert stopped.value.exit_code == 143 and stopped.value.line == (
        "stopped by a second SIGTERM during the evaluation after step 2; the last checkpoint is %s; resume with the "
        "same command (it runs that evaluation again)" % checkpoint)
    assert os.path.isfile(checkpoint) and not os.path.exists(os.path.join(run, "eval.jsonl"))
    monkeypatch.setattr(evaluate_module, "evaluate", evaluate)
    fx.train(config(demo_task, run, *args))
    evaluations = [open(os.path.join(d, "eval.jsonl")).read() for d in (reference, run)]
    assert evaluations[0] == evaluations[1] and [json.loads(line)["step"] for line in evaluations[0].splitlines()] \
        == [2, 4]
    assert fx.losses_of(run, "loss", "accuracy") == fx.losses_of(reference, "loss", "accuracy")
