"""The default attention (model.packed_attention "auto"): the fastest exact implementation the execution allows,
chosen when the config is read and recorded in the run like any model setting (config.json, every checkpoint,
the export's config.json). docs/results.md gives the measurement behind each choice."""

from __future__ import annotations

import json
import os

import pytest

import app_fixtures as fx
from ipu_packing.train import load_config
from ipu_packing.train.model_section import LONG_SEQUENCES, resolve_attention

pytestmark = pytest.mark.usefixtures("one_thread")


# (config, overrides, the attention "auto" gives)
ROWS = [
    ("demo", [], "sdpa"),                                               # CPU, S=128
    ("demo_padded", [], "sdpa"),
    ("demo_512", [], "varlen"),                                         # CPU, S=512
    ("demo_512_padded", [], "varlen"),
    ("demo_512", ["model.packed_attention=auto"], "varlen"),            # "auto" spelled out
    ("demo", ["data.max_seq_length=%d" % LONG_SEQUENCES], "varlen"),    # the threshold itself
    ("demo", ["data.max_seq_length=%d" % (LONG_SEQUENCES - 1)], "sdpa"),
    ("demo", ["execution.device=cuda"], "sdpa"),                        # CUDA: the fused kernels at any S
    ("demo_512", ["execution.device=cuda"], "sdpa"),
    ("demo_512", ["execution.torch_compile=true"], "sdpa"),             # fullgraph cannot take varlen's layout
    ("bert_large_512_pod16", [], "dense"),                              # PopTorch traces dense only
    ("bert_base_512_pod16_padded", [], "dense"),
    ("demo_512", ["model.packed_attention=dense"], "dense"),            # a choice written is kept
    ("demo", ["model.packed_attention=varlen"], "varlen"),
]


@pytest.mark.parametrize("name, overrides, chosen", ROWS, ids=["%s %s" % (r[0], " ".join(r[1])) for r in ROWS])
def test_auto_chooses_the_fastest_exact_attention_the_execution_allows(name, overrides, chosen):
    config = load_config(name, overrides)
    assert config.model["packed_attention"] == chosen
    assert config.bert_config().packed_attention == chosen
    assert config.to_dict()["model"]["packed_attention"] == chosen  # what config.json and checkpoints record


def test_auto_falls_back_where_this_torch_lacks_the_kernel(monkeypatch):
    from ipu_packing.train import model_section
    from ipu_packing.execution import ExecutionConfig

    monkeypatch.setattr(model_section, "missing_torch_support", lambda name: "no %s here" % name)
    assert resolve_attention({}, ExecutionConfig(), 512) == "dense"  # neither varlen nor sdpa: dense
    monkeypatch.setattr(model_section, "missing_torch_support", lambda name: "no varlen" if name == "varlen" else None)
    assert resolve_attention({}, ExecutionConfig(), 512) == "sdpa"


def test_a_run_records_the_attention_it_trained_with(tmp_path):
    data = fx.write_prepared(str(tmp_path / "data"), S=32, K=3, V=64, num_sequences=96, seed=0)
    run = str(tmp_path / "run")
    fx.train(fx.tiny(data, run, "training.steps=2"))
    with open(os.path.join(run, "config.json")) as f:
        assert json.load(f)["model"]["packed_attention"] == "sdpa"  # CPU, S=32
    assert fx.load(fx.latest(run)).config["model"]["packed_attention"] == "sdpa"
    with open(os.path.join(run, "final", "config.json")) as f:
        assert json.load(f)["packed_attention"] == "sdpa"
