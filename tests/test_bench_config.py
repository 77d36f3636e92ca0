"""bench --config: the same sequences of the config's prepared dataset laid out packed and padded by the data
package's builder, timed through the config's own runner (torch; poptorch under the PopTorch stand-in; a
2-stage pipeline), with the batch accounting training gives each layout. Speed is reported, never asserted:
the tests assert what must hold whatever the speed (counts, accounting, the arithmetic of the ratios)."""

import contextlib
import io
import json
import math
import os
import socket

import numpy as np
import pytest
import torch

import poptorch_stand_in as si
from ipu_packing.bench import cli as bench_cli
from ipu_packing.bench import throughput as bench
from ipu_packing.data import open_dataset
from ipu_packing.data.reference import pack_sequences, unpack
from ipu_packing.train import load_config
from ipu_packing.train.data import read_training_data
from torch_features import PIPELINING_MISSING
from spawned import leave_after

BENCH_TINY = [
    "model.vocab_size=64", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2",
    "model.num_attention_heads=2", "data.max_seq_length=32", "execution.micro_batch_size=2",
    "training.global_batch_sequences=8",
]
"""The tiny model (app_fixtures.TINY's sizes, without its dropout and logging overrides) at micro batch 2 and 8
sequences a step: a bench of a few steps."""


def run_main(args):
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = bench_cli.main(args)
    finally:
        torch.set_num_threads(threads)  # the demo config sets one thread
    return code, out.getvalue(), err.getvalue()


def expected_packed_steps(data_dir, config, steps):
    """Sequences and rows of the timed packed steps, from the dataset directly: the run's first-epoch order,
    after the warm-up call's packs."""
    dataset = open_dataset(os.path.join(data_dir, "packed"), as_tensors=False)
    data = read_training_data(os.path.join(data_dir, "packed"))
    data.dataset = dataset
    per_step = config.batch_accounting(data.packing_factor).global_batch_packs
    order = data.epoch_order(config.training.seed, 0)[per_step : (steps + 1) * per_step]
    sequences = sum(int((dataset[int(i)]["nsp_labels"] != -100).sum()) for i in order)
    return sequences, len(order), data.packing_factor


def test_unpack_gives_back_the_sequences_pack_sequences_laid_out(data_dir):
    dataset = open_dataset(os.path.join(data_dir, "packed"), as_tensors=False)
    records = [dataset[i] for i in range(len(dataset))]
    again = pack_sequences([unpack(r) for r in records], 32, 3, dataset.mlm_slots)
    for name in records[0]:
        assert np.array_equal(np.stack([r[name] for r in records]), again[name].astype(np.int32)), name
    assert sum(len(unpack(r)) for r in records) == dataset.manifest["num_sequences"]


def test_torch_runner_json(data_dir, tmp_path, monkeypatch):
    from ipu_packing.execution.runner_ddp import TorchRunner

    rows = []
    original = TorchRunner.train_step

    def counting(self, batch):
        rows.append(int(batch["input_ids"].shape[0]))
        return original(self, batch)

    monkeypatch.setattr(TorchRunner, "train_step", counting)
    overrides = BENCH_TINY + ["data.dir=%s" % data_dir]
    plot = tmp_path / "bench.png"
    code, out, err = run_main(["--config", "demo", "--steps", "3", "--json", "--plot", str(plot)] + overrides)
    assert code == 0, err
    r = json.loads(out)
    config = load_config("demo", overrides)
    sequences, packs, factor = expected_packed_steps(data_dir, config, 3)
    padded_steps, packed_steps = r["padded"], r["packed"]
    assert (r["backend"], r["device"], r["pipeline_stages"], r["replication_factor"]) == ("torch", "cpu", 1, 1)
    assert r["source"] == os.path.join(data_dir, "packed") and r["packing_factor"] == factor
    # the same sequences in both layouts
    assert r["padded_rows"] == r["num_sequences"] and r["num_packs"] < r["num_sequences"]
    # the accounting training gives each layout: 8 sequences a padded step (micro batch 2 x accumulation 4), the
    # packed step 8 / packing factor packs in one micro batch
    assert padded_steps["gradient_accumulation"] == 4 and padded_steps["global_batch_packs"] == 8
    assert packed_steps["gradient_accumulation"] == 1
    assert packed_steps["global_batch_packs"] == max(1, int(math.floor(8 / factor + 0.5)))
    assert padded_steps["steps"] == packed_steps["steps"] == 3
    assert padded_steps["sequences"] == padded_steps["rows"] == 24
    assert (packed_steps["sequences"], packed_steps["rows"]) == (sequences, packs)
    # every call went through the training runner: a warm-up and 3 timed calls of each layout, interleaved
    p = packed_steps["global_batch_packs"]
    assert rows == [8, p] + [8, p] * 3
    assert r["theoretical_speedup"] == sequences / float(packs)
    assert r["speedup"] > 0
    assert r["speedup"] == pytest.approx(r["packed_sequences_per_second"] / r["padded_sequences_per_second"])
    assert r["overhead"] == pytest.approx(r["theoretical_speedup"] / r["speedup"] - 1.0)
    assert r["packed_tokens_per_second"] == pytest.approx(packed_steps["tokens"] / packed_steps["seconds"])
    assert r["compile_seconds"] == padded_steps["compile_seconds"] + packed_steps["compile_seconds"]
    assert open(str(plot), "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_histogram_sequences_through_the_config(data_dir, tmp_path):
    hist = np.zeros(32)
    hist[[7, 15, 31]] = [300, 200, 100]
    path = tmp_path / "hist.json"
    path.write_text(json.dumps({"histogram": hist.tolist()}))
    code, out, err = run_main(["--config", "demo", "--histogram", str(path), "--steps", "2", "--json", "--plot", ""]
                              + BENCH_TINY + ["data.dir=%s" % data_dir])
    assert code == 0, err
    r = json.loads(out)
    assert r["source"] == str(path) and r["padded"]["sequences"] == 16
    assert r["packing_factor"] == pytest.approx(600 / float(bench.plan_histogram(hist, 32, 3, None).num_packs))
    assert r["theoretical_speedup"] == r["packed"]["sequences"] / float(r["packed"]["rows"])


@pytest.fixture
def poptorch(monkeypatch):
    pt = si.install(monkeypatch)
    yield pt
    si.end_workers(pt)


def test_poptorch_runner_under_the_stand_in_reports_compile_time(data_dir, poptorch):
    overrides = BENCH_TINY + ["data.dir=%s" % data_dir, "execution.backend=poptorch", "execution.layers_per_ipu=[1,1]",
                              "execution.use_ipu_model=true", "execution.micro_batch_size=1",
                              "training.global_batch_sequences=12", "execution.device_iterations=2"]
    code, out, err = run_main(["--config", "demo", "--steps", "4", "--json", "--plot", ""] + overrides)
    assert code == 0, err
    r = json.loads(out)
    assert (r["backend"], r["device"], r["pipeline_stages"]) == ("poptorch", "ipu", 2)
    padded, packed = poptorch.executors  # one executable per layout, each compiled once
    assert padded.isCompiled() and packed.isCompiled()
    assert r["padded"]["compile_seconds"] > 0 and r["packed"]["compile_seconds"] > 0
    assert r["compile_seconds"] == r["padded"]["compile_seconds"] + r["packed"]["compile_seconds"]
    # 4 optimizer steps = 2 host calls of 2 device iterations, after a warm-up call; the layouts take turns
    # on the IPUs (both compiled first): each call, the warm-up's included, attached its executable again, and
    # none is left attached
    assert r["padded"]["steps"] == r["packed"]["steps"] == 4 and len(r["padded"]["call_seconds"]) == 2
    assert padded.calls == packed.calls == 3 and padded.attaches == packed.attaches == 3
    assert not padded.isAttachedToDevice() and not packed.isAttachedToDevice()
    assert r["padded"]["sequences"] == 48 and r["padded"]["gradient_accumulation"] == 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pipeline_worker(rank, world, port, data_dir, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    def work():
        code, out, err = run_main(["--config", "demo", "--steps", "2", "--json", "--plot", ""] + BENCH_TINY
                                  + ["data.dir=%s" % data_dir, "execution.layers_per_ipu=[1,1]"])
        with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
            json.dump({"code": code, "out": out, "err": err}, f)

    leave_after(work)


@pytest.mark.skipif(PIPELINING_MISSING is not None, reason=PIPELINING_MISSING or "")
@pytest.mark.serial
@pytest.mark.slow
def test_pipelined_config_two_stages(data_dir, tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_pipeline_worker, args=(2, _free_port(), data_dir, str(tmp_path)), nprocs=2, join=True)
    first, second = (json.load(open(str(tmp_path / ("rank%d.json" % i)))) for i in (0, 1))
    assert first["code"] == second["code"] == 0, first["err"] + second["err"]
    assert second["out"] == ""  # only the first process reports
    r = json.loads(first["out"])
    assert (r["backend"], r["pipeline_stages"], r["world_size"]) == ("torch", 2, 2)
    assert r["padded"]["steps"] == r["packed"]["steps"] == 2 and r["padded"]["sequences"] == 16
    assert r["theoretical_speedup"] == r["packed"]["sequences"] / float(r["packed"]["rows"])


@pytest.mark.slow
def test_bad_input_is_one_line_exit_2(data_dir, tmp_path):
    for args, words in (
        (["--steps", "3"], "--steps is an option of --config, not of the synthetic mode"),
        (["--config", "demo", "--micro-batch-size", "4"], "--micro-batch-size is an option of the synthetic mode, "
         "--peers and --classifier, not of --config: set the value in the config"),
        (["--config", "demo", "--steps", "0"], "--steps must be >= 1"),
        (["--config", "demo", "data.dir=%s" % tmp_path], "dataset not found"),
        (["--config", "demo", "training.nope=1"], "training.nope"),
        (["--config", "demo", "--steps", "1000"] + BENCH_TINY + ["data.dir=%s" % data_dir], "lower --steps"),
    ):
        code, out, err = run_main(args + ["--plot", ""])
        assert code == 2 and out == "", args
        assert err.count("\n") == 1 and err.startswith("error: ") and words in err, (args, err)
