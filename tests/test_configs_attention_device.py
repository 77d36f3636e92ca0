"""What a config may ask of attention and device, refused when it is read: each refusal one `error:` line
through run_pretraining.py's own main, exit 2, nothing on stdout. The CUDA example configs load and validate,
and refuse cleanly where torch sees no GPU. The documented torchrun line validates, and a checkpoint past
training.steps names checkpoint.output_dir as the way out."""

from __future__ import annotations

import os
import re
import shlex

import pytest
import torch
import torch.nn.functional as F

from ipu_packing.model.attention import missing_torch_support
from ipu_packing.train import ConfigError, load_config
from ipu_packing.train.cli import build_parser, main
from ipu_packing.train.fingerprint import check_fixed
from ipu_packing.train.state import TrainingState

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_line_error(capsys, *argv):
    """run_pretraining.py's main on argv: exit 2, one `error:` line on stderr, nothing on stdout."""
    assert main(list(argv)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (out, err)
    return err


REFUSED = [
    (["model.packed_attention=bogus"], ["model.packed_attention must be one of auto, dense, sdpa, flex, varlen",
                                        "bogus"]),
    (["model.packed_attention=sdpa", "execution.backend=poptorch"],
     ["'poptorch' runs attention 'dense' only", "got 'sdpa'", "set model.packed_attention=dense"]),
    (["model.packed_attention=varlen", "execution.backend=poptorch"], ["got 'varlen'"]),
    (["model.packed_attention=flex"], ["'flex' trains only with execution.device=cuda", "no backward on CPU"]),
    (["model.packed_attention=flex", "execution.device=cuda", "execution.layers_per_ipu=[1,1]"],
     ["'flex' trains only with one stage", "use varlen, sdpa or dense"]),
    (["model.packed_attention=flex", "execution.device=cuda", "model.attention_probs_dropout_prob=0.1"],
     ["model.attention_probs_dropout_prob=0", "got 0.1"]),
    (["model.packed_attention=flex", "execution.device=cuda", "execution.torch_compile=true"],
     ["execution.torch_compile=false"]),
    (["model.packed_attention=varlen", "execution.torch_compile=true"],
     ["'varlen' builds its layout from the data", "use sdpa or dense with torch_compile"]),
]


@pytest.mark.parametrize("overrides,words", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_an_attention_the_execution_cannot_train_is_one_line(capsys, overrides, words):
    err = one_line_error(capsys, "--config", "demo", *overrides)
    if "model.packed_attention=flex" in overrides and missing_torch_support("flex"):
        # torch < 2.5 (the Poplar SDK's 2.0.1): no FlexAttention at all, refused before any other rule
        words = ["attention 'flex' needs torch >= 2.5", "use varlen, sdpa or dense"]
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("name", ["dense", "sdpa", "varlen"])
def test_an_attention_reaches_the_bert_config(name):
    config = load_config("demo", ["model.packed_attention=%s" % name])
    assert config.model["packed_attention"] == name
    assert config.bert_config().packed_attention == name
    assert config.to_dict()["model"]["packed_attention"] == name  # what the checkpoint and config.json keep
    # the same on pipelined stages (varlen's layout is rebuilt from sequence_ids on each)
    assert load_config("demo", ["model.packed_attention=%s" % name,
                                "execution.layers_per_ipu=[1,1]"]).execution.num_stages == 2


def test_dense_is_what_poptorch_takes_and_the_key_its_error_names_exists():
    from ipu_packing.errors import UserError
    from ipu_packing.execution.poptorch_backend import check_backend

    with pytest.raises(UserError) as err:
        check_backend("sdpa")
    named = re.search(r"set (model\.packed_attention=\w+)", str(err.value)).group(1)
    config = load_config("demo", [named, "execution.backend=poptorch"])  # the key it names loads
    assert config.model["packed_attention"] == "dense"


def test_an_old_torch_without_the_kernel_is_one_line(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch.nn.attention.flex_attention" else real(name, *a))
    assert "needs torch >= 2.5" in missing_torch_support("flex")
    err = one_line_error(capsys, "--config", "demo", "model.packed_attention=flex", "execution.device=cuda")
    assert "needs torch >= 2.5" in err and "use varlen, sdpa or dense" in err
    monkeypatch.delattr(F, "scaled_dot_product_attention")
    for name in ("sdpa", "varlen"):
        err = one_line_error(capsys, "--config", "demo", "model.packed_attention=%s" % name)
        assert "needs torch >= 2.0" in err and err.rstrip().endswith("use dense")


# ---- CUDA example configs --------------------------------------------------------------------------------

@pytest.mark.parametrize("name,replicas", [("demo_512_cuda", 1), ("demo_512_cuda_ddp", 2)])
def test_the_cuda_configs_load_and_validate(name, replicas):
    config = load_config(name)
    base = load_config("demo_512")
    ex = config.execution_spec
    chosen = (ex.backend, ex.device, ex.precision, config.model["packed_attention"])
    assert chosen == ("torch", "cuda", "bf16", "sdpa")  # auto on CUDA: the fused kernels (make gpu-check)
    assert ex.replication_factor == replicas and config.execution.world_size == replicas
    # the same training problem as demo_512: model, data, steps and the 58-sequence step (packed: 30 packs)
    assert {k: v for k, v in config.model.items() if k != "packed_attention"} == {
        k: v for k, v in base.model.items() if k != "packed_attention"}
    assert (config.data, config.training) == (base.data, base.training)
    packed = config.batch_accounting(1.932)
    assert packed.unpacked_accumulation * ex.micro_batch_size * replicas == 58
    assert packed.global_batch_packs == base.batch_accounting(1.932).global_batch_packs == 30
    assert config.run_dir == os.path.join("output", "runs", name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: nothing to refuse")
@pytest.mark.parametrize("name", ["demo_512_cuda", "demo_512_cuda_ddp"])
def test_the_cuda_configs_refuse_cleanly_without_cuda(capsys, name, tmp_path):
    # before any dataset is opened or anything written (the data directory does not exist)
    run = str(tmp_path / "run")
    err = one_line_error(capsys, "--config", name, "data.dir=%s" % (tmp_path / "no_data"),
                         "checkpoint.output_dir=%s" % run)
    assert err == "error: execution.device is 'cuda' but torch sees no CUDA device\n"
    assert not os.path.exists(run)


# ---- README / docs commands --------------------------------------------------------------------------------

def _documented(prefix: str) -> str:
    with open(os.path.join(REPO, "docs", "usage.md"), encoding="utf-8") as f:
        lines = [line.split("#")[0].strip() for line in f if line.strip().startswith(prefix)]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_documented_torchrun_line_validates():
    words = shlex.split(_documented("torchrun --nproc_per_node 2 run_pretraining.py"))
    nproc = int(words[words.index("--nproc_per_node") + 1])
    args = build_parser().parse_args(words[words.index("run_pretraining.py") + 1:])
    config = load_config(args.config, args.overrides)
    assert config.name == "demo" and config.execution.world_size == nproc == 2
    assert config.unpacked_accumulation * config.execution_spec.micro_batch_size * 2 == 48  # demo's global batch
    # the line as it was: 48 is not a multiple of micro 16 x 2 replicas
    with pytest.raises(ConfigError, match="48"):
        load_config("demo", ["execution.replication_factor=2"])


def test_a_checkpoint_past_training_steps_names_checkpoint_output_dir():
    config = load_config("demo", ["training.steps=20"])
    with pytest.raises(Exception) as err:
        check_fixed(config, {}, TrainingState(step=350, model={}, config={}),
                    "output/runs/demo/checkpoints/step_0000350.pt")
    message = str(err.value)
    assert "at step 350, beyond training.steps=20" in message
    assert "set checkpoint.output_dir" in message and "output/runs/demo" in message
