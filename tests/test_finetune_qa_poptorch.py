"""Question answering on the poptorch backend, under the PopTorch stand-in (tests/fake_poptorch): the shipped
BERT-Large IPU-POD16 config (configs/finetune_qa_bert_large_384_pod16.yaml: [3, 7, 7, 7], 4 replicas, S=384)
compiles its training step with the question-answering head on the last IPU, and a tiny twin of it trains,
checkpoints and evaluates with exact match and F1. What only an IPU can show (compile times, memory, fp16 on the
device) is not shown here."""

from __future__ import annotations

import os

import numpy as np
import pytest

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.train import load_config
from ipu_packing.train import loop
from ipu_packing.train.cli import finetune_main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

NAME = "finetune_qa_bert_large_384_pod16"
SMALL = ["model.vocab_size=8192", "model.hidden_size=32", "model.intermediate_size=64",
         "model.num_attention_heads=2", "data.max_seq_length=64", "data.max_sequences_per_pack=4",
         "logging.progress_bar=false", "logging.tensorboard=false", "checkpoint.init_from=null",
         "task.eval_batch_packs=64"]
"""The POD16 config's pipeline, replicas, batch and precision with a tiny BERT (24 layers of hidden 32), on the demo
question-answering task at S=64."""


@pytest.fixture(scope="module")
def task_dir(qa_demo_task):
    return qa_demo_task


def config(task_dir, run_dir, *extra):
    return load_config(NAME, SMALL + ["data.dir=%s" % task_dir, "checkpoint.output_dir=%s" % run_dir] + list(extra))


def test_the_shipped_config_is_bert_large_question_answering_at_384_on_a_pod16():
    cfg = load_config(NAME)
    assert cfg.task.name == "question_answering" and cfg.task.fine_tuning
    assert cfg.data.max_seq_length == 384 and cfg.model["hidden_size"] == 1024 and cfg.model["num_hidden_layers"] == 24
    spec = cfg.execution_spec
    assert spec.backend == "poptorch" and spec.layers_per_ipu == [3, 7, 7, 7] and spec.replication_factor == 4


def test_the_pod16_question_answering_step_compiles_with_the_head_on_the_last_ipu(poptorch, task_dir, tmp_path):
    cfg = config(task_dir, str(tmp_path / "run"), "execution.compile_only=true",
                 "execution.executable_cache_dir=%s" % (tmp_path / "cache"))
    lines = []
    loop.compile_only(cfg, log=lines.append, open_dataset=open_dataset)
    (executor,) = poptorch.executors
    assert executor.isCompiled() and executor.calls == 0
    ipus = {name: ipu for name, ipu in executor.trace.block_order}
    assert ipus["Embedding"] == 0 and ipus["Encoder2"] == 0 and ipus["Encoder3"] == 1
    assert ipus["Heads"] == 3 and ipus["Encoder23"] == 3
    assert "for the first batch of %s" % cfg.data.path in lines[0]
    assert not os.path.exists(str(tmp_path / "run"))


def test_the_step_compiles_without_a_dataset_on_a_generated_batch(poptorch, tmp_path):
    cfg = load_config(NAME, SMALL + ["data.dir=%s" % (tmp_path / "absent"), "checkpoint.output_dir=%s" % (
        tmp_path / "run"), "execution.compile_only=true", "execution.executable_cache_dir=%s" % (tmp_path / "cache")])
    lines = []
    loop.compile_only(cfg, log=lines.append, open_dataset=open_dataset)
    (executor,) = poptorch.executors
    assert executor.isCompiled()
    assert "a generated batch (S=64, K=4, task question_answering" in lines[0]


def test_a_tiny_pod16_question_answering_run_trains_checkpoints_and_evaluates(poptorch, task_dir, tmp_path):
    run = str(tmp_path / "run")
    # accumulation 8: enough for question answering's 4 pipeline groups (7), not for pretraining's 5 (9)
    summary = fx.train(config(task_dir, run, "training.steps=2", "checkpoint.every_steps=2",
                              "execution.use_ipu_model=true", "model.hidden_dropout_prob=0.0",
                              "training.global_batch_sequences=128"))
    rows = fx.metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["loss"]) and 0.0 <= r["start_accuracy"] <= 1.0 for r in rows)
    state = fx.load(fx.latest(run))
    assert int(state.optimizer["ipu_state"]["step"]) == 2  # read back from the device
    assert summary["evaluation"]["examples"] == fx.num_questions(task_dir, "validation")
    assert set(summary["evaluation"]["metrics"]) == {"exact_match", "f1"}


def test_the_dry_run_places_the_question_answering_head(capsys):
    assert finetune_main(["--config", NAME, "--dry-run"]) == 0
    out = capsys.readouterr()[0]
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines() if line.startswith("  ") and
            len(line.split()) >= 5}
    assert rows["qa_outputs"] == ["Heads", "3"] and rows["bert.encoder.layer.23"] == ["Encoder23", "3"]
    assert "cls" not in rows and "bert.pooler" not in rows and "classifier" not in rows
    assert "python run_finetuning.py" in out and "4 groups of consecutive blocks" in out


def test_inference_model_serves_question_answering_packed_with_the_cpus_answers(poptorch, tmp_path):
    """poptorch.inferenceModel brings back the token start and end logits (the model's SERVED fields) of a compiled
    batch, the last one padded with empty packs; the answers are the CPU's, span and score."""
    import transformers

    from ipu_packing.execution import ExecutionConfig
    from ipu_packing.model import PackedBertForQuestionAnswering
    from ipu_packing.predict import QuestionAnswerer

    directory = str(tmp_path / "model")
    os.makedirs(directory)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + ["w%d" % i for i in range(40)]
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("\n".join(words) + "\n")
    transformers.BertTokenizerFast(os.path.join(directory, "vocab.txt")).save_pretrained(directory)
    bert = transformers.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0)
    PackedBertForQuestionAnswering(bert).save_pretrained(directory)
    rng = np.random.default_rng(0)

    def text(low, high):
        return " ".join("w%d" % i for i in rng.integers(0, 40, int(rng.integers(low, high))))

    questions = [text(2, 8) for _ in range(25)]
    contexts = [text(5, 90) for _ in range(25)]
    cpu = QuestionAnswerer.from_pretrained(directory, 64, 16, 16, 6).answers(questions, contexts)
    ipu = ExecutionConfig(backend="poptorch", micro_batch_size=2, layers_per_ipu=[0, 2, 2], use_ipu_model=True,
                          device_iterations=1)
    served = QuestionAnswerer.from_pretrained(directory, 64, 16, 16, 6, execution=ipu)
    got = served.answers(questions, contexts)
    (executor,) = poptorch.executors
    assert executor.isCompiled() and executor.calls >= 2 and served._infer.packs_per_call == 2 * 3
    assert sum(1 for c in contexts if len(c.split()) > 45) > 3  # questions with several windows among them
    assert [(a.text, a.feature, a.start_char) for a in got] == [(a.text, a.feature, a.start_char) for a in cpu]
    assert [a.score for a in got] == pytest.approx([a.score for a in cpu], abs=1e-4)
    assert all(a.text for a in got)
    ipus = {name: ipu for name, ipu in executor.trace.block_order}
    assert ipus["Heads"] == 2
