"""Fine-tuning and serving on the poptorch backend, under the PopTorch stand-in (tests/fake_poptorch): the
shipped IPU-POD4 fine-tuning config (configs/finetune_bert_base_128_pod4.yaml: BERT-Base's [0, 4, 4, 4] pipeline,
the classifier on the last IPU) compiles its training step, a tiny twin of it trains and checkpoints, and
poptorch.inferenceModel serves the classifier packed with the CPU's predictions. What only an IPU can show
(compile times, memory, fp16 on the device) is not shown here."""

from __future__ import annotations

import os

import numpy as np
import pytest

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.execution import ExecutionConfig
from ipu_packing.train import load_config
from ipu_packing.train import loop

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

SMALL = ["model.vocab_size=8192", "model.hidden_size=32", "model.intermediate_size=64",
         "model.num_attention_heads=2", "data.max_seq_length=64", "data.max_sequences_per_pack=6",
         "logging.progress_bar=false", "logging.tensorboard=false", "checkpoint.init_from=null",
         "training.global_batch_sequences=256", "task.eval_batch_packs=16"]
"""The POD4 config's pipeline, batch and precision with a tiny BERT (12 layers of hidden 32), on the demo task."""


def config(demo_task, run_dir, *extra):
    return load_config("finetune_bert_base_128_pod4", SMALL + ["data.dir=%s" % demo_task,
                                                               "checkpoint.output_dir=%s" % run_dir] + list(extra))


def test_the_pod4_fine_tuning_step_compiles_with_the_classifier_on_the_last_ipu(poptorch, demo_task, tmp_path):
    cfg = config(demo_task, str(tmp_path / "run"), "execution.compile_only=true",
                 "execution.executable_cache_dir=%s" % (tmp_path / "cache"))
    assert cfg.execution_spec.backend == "poptorch" and cfg.execution_spec.layers_per_ipu == [0, 4, 4, 4]
    lines = []
    loop.compile_only(cfg, log=lines.append, open_dataset=open_dataset)
    (executor,) = poptorch.executors
    assert executor.isCompiled() and executor.calls == 0
    ipus = {name: ipu for name, ipu in executor.trace.block_order}
    assert ipus["Embedding"] == 0 and ipus["Heads"] == 3 and ipus["Encoder11"] == 3
    assert "for the first batch of %s" % cfg.data.path in lines[0]
    assert not os.path.exists(str(tmp_path / "run"))


def test_a_tiny_pod4_fine_tuning_run_trains_checkpoints_and_evaluates(poptorch, demo_task, tmp_path):
    run = str(tmp_path / "run")
    summary = fx.train(config(demo_task, run, "training.steps=8", "checkpoint.every_steps=4",
                              "execution.use_ipu_model=true", "model.hidden_dropout_prob=0.0",
                              "task.eval_every_steps=8"))
    rows = fx.metrics(run)
    assert [r["step"] for r in rows] == [4, 8]  # a host call is 4 device iterations
    assert all(np.isfinite(r["loss"]) and 0.0 <= r["accuracy"] <= 1.0 for r in rows)
    state = fx.load(fx.latest(run))
    assert int(state.optimizer["ipu_state"]["step"]) == 8  # read back from the device
    assert summary["evaluation"]["examples"] == fx.num_examples(demo_task, "validation")
    assert set(summary["evaluation"]["metrics"]) == {"accuracy", "f1", "matthews_correlation"}


def test_inference_model_serves_packed_with_the_cpus_predictions(poptorch, tmp_path):
    import transformers

    from ipu_packing.model import PackedBertForSequenceClassification
    from ipu_packing.predict import Predictor

    directory = str(tmp_path / "model")
    os.makedirs(directory)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + ["w%d" % i for i in range(40)]
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("\n".join(words) + "\n")
    transformers.BertTokenizerFast(os.path.join(directory, "vocab.txt")).save_pretrained(directory)
    bert = transformers.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64, num_labels=3,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    PackedBertForSequenceClassification(bert).save_pretrained(directory)
    rng = np.random.default_rng(0)
    texts = [" ".join("w%d" % i for i in rng.integers(0, 40, int(rng.integers(2, 20)))) for _ in range(45)]
    cpu = Predictor.from_pretrained(directory, max_seq_length=64, max_sequences_per_pack=6).predict(texts)
    ipu = ExecutionConfig(backend="poptorch", micro_batch_size=2, layers_per_ipu=[0, 2, 2], use_ipu_model=True,
                          device_iterations=1)
    served = Predictor.from_pretrained(directory, max_seq_length=64, max_sequences_per_pack=6, execution=ipu)
    got = served.predict(texts)
    (executor,) = poptorch.executors
    assert executor.isCompiled() and executor.calls >= 2  # packs_per_call packs a call, the last one padded
    assert served._infer.packs_per_call == 2 * 3  # micro batch x device iterations (raised to the 3 stages)
    assert [r["index"] for r in got] == list(range(45))
    for a, b in zip(cpu, got):
        assert a["label"] == b["label"] and a["scores"] == pytest.approx(b["scores"], abs=1e-5)
    ipus = {name: ipu for name, ipu in executor.trace.block_order}
    assert ipus["Heads"] == 2
