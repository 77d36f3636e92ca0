"""Fine-tuning and serving on the poptorch backend, under the PopTorch stand-in (tests/fake_poptorch), for each
fine-tuning task of the registry: the task's shipped IPU config (classification: configs/finetune_bert_base_128_pod4
.yaml, BERT-Base's [0, 4, 4, 4] pipeline; question answering: configs/finetune_qa_bert_large_384_pod16.yaml,
BERT-Large's [3, 7, 7, 7], 4 replicas, S=384) compiles its training step with the task's head on the last IPU, with
or without a dataset; a tiny twin of it trains, checkpoints and evaluates with the task's metrics; the dry run
places the head; and poptorch.inferenceModel serves the task packed with the CPU's answers. What only an IPU can
show (compile times, memory, fp16 on the device) is not shown here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import numpy as np
import pytest

import app_fixtures as fx
from ipu_packing import tasks
from ipu_packing.data import open_dataset
from ipu_packing.execution import ExecutionConfig
from ipu_packing.train import UserError, load_config
from ipu_packing.train import loop
from ipu_packing.train.cli import finetune_main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

TINY = ["model.vocab_size=8192", "model.hidden_size=32", "model.intermediate_size=64", "model.num_attention_heads=2",
        "data.max_seq_length=64", "logging.progress_bar=false", "logging.tensorboard=false",
        "checkpoint.init_from=null"]
"""The shipped config's pipeline, replicas, batch and precision with a tiny BERT (hidden 32, its layer count)."""


@dataclass(frozen=True)
class Case:
    """One fine-tuning task on the IPU: its shipped config and what its tiny twin shows."""

    config: str
    data: str
    """The conftest fixture of the task's demo dataset."""
    tiny: Tuple[str, ...]
    """Overrides beyond TINY."""
    shape: Tuple[int, int, int]
    """The shipped model: (S, hidden size, layers)."""
    pipeline: Tuple[int, ...]
    replicas: int
    placed: Dict[str, int]
    """Blocks of the compiled step and their IPU: the head on the last one."""
    dry_run: Dict[str, Tuple[str, str]]
    """Parameter groups of the dry run's table and their (block, IPU)."""
    not_in_dry_run: Tuple[str, ...]
    train: Tuple[str, ...]
    """The tiny run's overrides."""
    logged_steps: List[int]
    examples: Callable[[str, str], int]
    """How many examples the validation split's evaluation counts."""
    evaluation: Tuple[str, ...]
    labels_from_data: bool
    """The model's head is sized from the dataset (its labels), so compile-only needs the dataset."""


CASES = {
    "classification": Case(
        "finetune_bert_base_128_pod4", "demo_task",
        ("data.max_sequences_per_pack=6", "training.global_batch_sequences=256", "task.eval_batch_packs=16"),
        (128, 768, 12), (0, 4, 4, 4), 1, {"Embedding": 0, "Heads": 3, "Encoder11": 3},
        {"classifier": ("Heads", "3"), "bert.encoder.layer.11": ("Encoder11", "3")}, ("cls", "qa_outputs"),
        ("training.steps=8", "checkpoint.every_steps=4", "task.eval_every_steps=8"), [4, 8],  # 4 iterations a call
        fx.num_examples, ("accuracy", "f1", "matthews_correlation"), True),
    "question_answering": Case(
        "finetune_qa_bert_large_384_pod16", "qa_demo_task",
        ("data.max_sequences_per_pack=4", "task.eval_batch_packs=64"),
        (384, 1024, 24), (3, 7, 7, 7), 4, {"Embedding": 0, "Encoder2": 0, "Encoder3": 1, "Heads": 3, "Encoder23": 3},
        {"qa_outputs": ("Heads", "3"), "bert.encoder.layer.23": ("Encoder23", "3")},
        ("cls", "bert.pooler", "classifier"),
        # accumulation 8: enough for question answering's 4 pipeline groups (7), not for pretraining's 5 (9)
        ("training.steps=2", "checkpoint.every_steps=2", "training.global_batch_sequences=128"), [1, 2],
        fx.num_questions, ("exact_match", "f1"), False),
}
FINE_TUNING = [t.name for t in tasks.TASKS.values() if t.fine_tuning]


def test_every_fine_tuning_task_of_the_registry_has_a_case():
    assert sorted(CASES) == sorted(FINE_TUNING)


def config(case: Case, data_dir: str, run_dir: str, *extra: str):
    return load_config(case.config, TINY + list(case.tiny) + ["data.dir=%s" % data_dir,
                                                            "checkpoint.output_dir=%s" % run_dir] + list(extra))


@pytest.mark.parametrize("name", FINE_TUNING)
def test_the_shipped_config_is_the_task_on_its_pod(name):
    case = CASES[name]
    cfg = load_config(case.config)
    assert cfg.task.name == name and cfg.task.fine_tuning
    spec = cfg.execution_spec
    assert spec.backend == "poptorch" and spec.layers_per_ipu == list(case.pipeline)
    assert spec.replication_factor == case.replicas
    assert (cfg.data.max_seq_length, cfg.model["hidden_size"], cfg.model["num_hidden_layers"]) == case.shape


@pytest.mark.parametrize("name", FINE_TUNING)
def test_the_step_compiles_with_the_head_on_the_last_ipu(poptorch, request, tmp_path, name):
    case = CASES[name]
    data = request.getfixturevalue(case.data)
    cfg = config(case, data, str(tmp_path / "run"), "execution.compile_only=true",
                 "execution.executable_cache_dir=%s" % (tmp_path / "cache"))
    lines = []
    loop.compile_only(cfg, log=lines.append, open_dataset=open_dataset)
    (executor,) = poptorch.executors
    assert executor.isCompiled() and executor.calls == 0
    ipus = {block: ipu for block, ipu in executor.trace.block_order}
    assert {block: ipus[block] for block in case.placed} == case.placed
    assert "for the first batch of %s" % cfg.data.path in lines[0]
    assert not os.path.exists(str(tmp_path / "run"))


@pytest.mark.parametrize("name", FINE_TUNING)
def test_the_step_compiles_without_a_dataset_on_a_generated_batch(poptorch, tmp_path, name):
    """Or, where the head is sized from the dataset's labels, refuses in one line naming the command to run."""
    case = CASES[name]
    cfg = config(case, str(tmp_path / "absent"), str(tmp_path / "run"), "execution.compile_only=true",
                 "execution.executable_cache_dir=%s" % (tmp_path / "cache"))
    lines = []
    if case.labels_from_data:
        with pytest.raises(UserError, match="task.name=%s needs its prepared dataset .* to know its labels: prepare "
                                            "it with `python -m ipu_packing.data prepare --task %s" % (name, name)):
            loop.compile_only(cfg, log=lines.append, open_dataset=open_dataset)
        assert not poptorch.executors and not os.path.exists(str(tmp_path / "run"))
        return
    loop.compile_only(cfg, log=lines.append, open_dataset=open_dataset)
    (executor,) = poptorch.executors
    assert executor.isCompiled()
    assert "a generated batch (S=64, K=%d, task %s" % (cfg.data.max_sequences_per_pack, name) in lines[0]


@pytest.mark.parametrize("name", FINE_TUNING)
def test_a_tiny_twin_trains_checkpoints_and_evaluates(poptorch, request, tmp_path, name):
    case = CASES[name]
    data = request.getfixturevalue(case.data)
    run = str(tmp_path / "run")
    summary = fx.train(config(case, data, run, "execution.use_ipu_model=true", "model.hidden_dropout_prob=0.0",
                              *case.train))
    rows = fx.metrics(run)
    assert [r["step"] for r in rows] == case.logged_steps
    metrics = tasks.get(name).metrics
    assert all(np.isfinite(r["loss"]) and all(0.0 <= r[m] <= 1.0 for m in metrics[1:]) for r in rows)
    state = fx.load(fx.latest(run))
    assert int(state.optimizer["ipu_state"]["step"]) == case.logged_steps[-1]  # read back from the device
    assert summary["evaluation"]["examples"] == case.examples(data, "validation")
    assert set(summary["evaluation"]["metrics"]) == set(case.evaluation)


@pytest.mark.parametrize("name", FINE_TUNING)
def test_the_dry_run_places_the_head(capsys, name):
    case = CASES[name]
    assert finetune_main(["--config", case.config, "--dry-run"]) == 0
    out = capsys.readouterr()[0]
    rows = {line.split()[0]: tuple(line.split()[1:3]) for line in out.splitlines() if line.startswith("  ") and
            len(line.split()) >= 5}
    assert {group: rows[group] for group in case.dry_run} == case.dry_run
    assert not any(group in rows for group in case.not_in_dry_run)
    assert "python run_finetuning.py" in out and "%d groups of consecutive blocks" % len(case.pipeline) in out


# ---- serving: poptorch.inferenceModel against the CPU ---------------------------------------------------------

def tiny_model(directory: str, model_class, **settings) -> None:
    import transformers

    os.makedirs(directory)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + ["w%d" % i for i in range(40)]
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("\n".join(words) + "\n")
    transformers.BertTokenizerFast(os.path.join(directory, "vocab.txt")).save_pretrained(directory)
    bert = transformers.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0, **settings)
    model_class(bert).save_pretrained(directory)


def served_classification(directory: str, execution):
    """The demo texts' predictions: [(index, label, scores)], on the CPU when ``execution`` is None."""
    from ipu_packing.model import PackedBertForSequenceClassification
    from ipu_packing.predict import Predictor

    if not os.path.isdir(directory):
        tiny_model(directory, PackedBertForSequenceClassification, num_labels=3)
    rng = np.random.default_rng(0)
    texts = [" ".join("w%d" % i for i in rng.integers(0, 40, int(rng.integers(2, 20)))) for _ in range(45)]
    predictor = Predictor.from_pretrained(directory, max_seq_length=64, max_sequences_per_pack=6, execution=execution)
    got = predictor.predict(texts)
    assert [r["index"] for r in got] == list(range(45))
    return predictor, [(r["label"], r["scores"]) for r in got], 1e-5


def served_questions(directory: str, execution):
    """Answers to 25 questions, several with more than one window: [(text, feature, start_char, score)]."""
    from ipu_packing.model import PackedBertForQuestionAnswering
    from ipu_packing.predict import QuestionAnswerer

    if not os.path.isdir(directory):
        tiny_model(directory, PackedBertForQuestionAnswering)
    rng = np.random.default_rng(0)

    def text(low, high):
        return " ".join("w%d" % i for i in rng.integers(0, 40, int(rng.integers(low, high))))

    questions = [text(2, 8) for _ in range(25)]
    contexts = [text(5, 90) for _ in range(25)]
    assert sum(1 for c in contexts if len(c.split()) > 45) > 3  # questions with several windows among them
    answerer = QuestionAnswerer.from_pretrained(directory, 64, 16, 16, 6, execution=execution)
    got = answerer.answers(questions, contexts)
    assert all(a.text for a in got)
    return answerer, [((a.text, a.feature, a.start_char), [a.score]) for a in got], 1e-4


SERVED = {"classification": served_classification, "question_answering": served_questions}


def test_every_fine_tuning_task_is_served_here():
    assert sorted(SERVED) == sorted(FINE_TUNING)


@pytest.mark.parametrize("name", FINE_TUNING)
def test_inference_model_serves_packed_with_the_cpus_answers(poptorch, tmp_path, name):
    """poptorch.inferenceModel brings back the model's served fields of a compiled batch, the last one padded with
    empty packs: the same answers as the CPU (labels or spans exactly, scores within float rounding)."""
    directory = str(tmp_path / "model")
    _, cpu, tolerance = SERVED[name](directory, None)
    ipu = ExecutionConfig(backend="poptorch", micro_batch_size=2, layers_per_ipu=[0, 2, 2], use_ipu_model=True,
                          device_iterations=1)
    served, got, _ = SERVED[name](directory, ipu)
    (executor,) = poptorch.executors
    assert executor.isCompiled() and executor.calls >= 2  # packs_per_call packs a call, the last one padded
    assert served._infer.packs_per_call == 2 * 3  # micro batch x device iterations (raised to the 3 stages)
    assert [key for key, _ in got] == [key for key, _ in cpu]
    for (_, a), (_, b) in zip(cpu, got):
        assert b == pytest.approx(a, abs=tolerance)
    ipus = {block: ipu for block, ipu in executor.trace.block_order}
    assert ipus["Heads"] == 2
