"""Every entry point, fed bad input: exactly one line `error: <cause>` on stderr, exit status 2, nothing
on stdout, no traceback. One table; each row is a command, its arguments and words the line must hold.

Rows call each command's main() in this process (the same run_command wrapper `python -m` uses); the
last tests run real subprocesses for what only a process shows: a closed pipe and Ctrl-C."""

import errno
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from ipu_packing.bench.cli import main as bench_main
from ipu_packing.data.cli import main as data_main
from synthetic_corpus import make_inputs
from ipu_packing.train.cli import execution_main
from ipu_packing.bench.planner import main as packing_bench_main
from ipu_packing.packing.cli import main as packing_main
from ipu_packing.train.cli import main as train_main

from app_fixtures import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEEP = "[" * 100000 + "]" * 100000
COMMANDS = {"train": train_main, "data": data_main, "packing": packing_main, "packing.bench": packing_bench_main,
            "bench": bench_main, "execution": execution_main}


@pytest.fixture(scope="module")
def ws(tiny_data, tmp_path_factory):
    """A workspace: the session's prepared dataset, a text corpus + vocab, histograms, a file in the way, and
    hostile files: JSON nested 100,000 deep where a histogram or a manifest is read, a TFRecord record of 2**40
    bytes."""
    root = tmp_path_factory.mktemp("ws")
    w = {"root": str(root), "data": tiny_data}
    w["corpus"], w["vocab"] = make_inputs(str(root))
    (root / "zero.json").write_text('{"histogram": [0, 0, 0], "max_sequence_length": 8}')
    (root / "inf.json").write_text('{"histogram": [1, Infinity], "max_sequence_length": 8}')
    (root / "strlen.json").write_text('{"histogram": [1, 2], "max_sequence_length": "512"}')
    (root / "ok.json").write_text('{"histogram": [1, 2, 3, 4], "max_sequence_length": 8}')
    (root / "a_file").write_text("not a directory")
    bad = root / "badshards"
    for kind in ("empty", "uint64", "random"):
        d = bad / kind
        os.makedirs(str(d))
        packed = os.path.join(w["data"], "packed") if os.path.isdir(os.path.join(w["data"], "packed")) else w["data"]
        for name in os.listdir(packed):
            with open(os.path.join(packed, name), "rb") as src, open(str(d / name), "wb") as dst:
                dst.write(src.read())
        shard = str(d / "shard-00000.npy")
        if kind == "empty":
            open(shard, "wb").close()
        elif kind == "uint64":
            np.save(shard, np.zeros(10, dtype=np.uint64))
        else:
            with open(shard, "wb") as f:
                f.write(np.random.default_rng(0).bytes(4096))
    w["bad"] = str(bad)
    w["checkpoint"] = str(root / "wrong_types.pt")
    import torch

    torch.save({"step": "three", "model": {}}, w["checkpoint"])
    (root / "deep.json").write_text(DEEP)
    (root / "deep_object.json").write_text('{"histogram": ' + DEEP + "}")
    deep_data = root / "deep_data"
    os.makedirs(str(deep_data))
    (deep_data / "manifest.json").write_text('{"a": ' + DEEP + "}")
    os.makedirs(str(deep_data / "packed"))
    (deep_data / "packed" / "manifest.json").write_text('{"a": ' + DEEP + "}")
    w["deep_data"] = str(deep_data)
    from ipu_packing.data.existing.tfrecord import masked_crc

    header = struct.pack("<Q", 1 << 40)
    with open(str(root / "huge.tfrecord"), "wb") as f:
        f.write(header + struct.pack("<I", masked_crc(header)) + b"\0" * 64)
    return w


def _train(w, *extra):
    run = os.path.join(w["root"], "runs", "r%d" % abs(hash(extra)))
    return ["--config", "demo"] + TINY + ["data.dir=%s" % w["data"], "checkpoint.output_dir=%s" % run] + list(extra)


def _prepare(w, *extra):
    return ["prepare", "--input", w["corpus"], "--vocab", w["vocab"], "--output", os.path.join(w["root"], "out"),
            "--max-seq-length", "32", "--dupe-factor", "1", "--workers", "1", "--quiet"] + list(extra)


CASES = [
    # run_pretraining.py: config values
    ("train", lambda w: _train(w, "model.hidden_act=foo"), ["hidden_act", "foo"]),
    ("train", lambda w: _train(w, "model.hidden_dropout_prob=5"), ["model.hidden_dropout_prob"]),
    ("train", lambda w: _train(w, "training.seed=-1"), ["training.seed"]),
    ("train", lambda w: _train(w, "training.seed=%d" % 2**70), ["training.seed"]),
    ("train", lambda w: _train(w, "optimizer.lr=.nan"), ["optimizer.lr", "finite"]),
    ("train", lambda w: _train(w, "no_equals_sign"), ["section.key=value"]),
    ("train", lambda w: _train(w, "bogus.key=1"), ["bogus"]),
    ("train", lambda w: ["--config", "no_such_config"], ["no_such_config"]),
    ("train", lambda w: ["--no-such-flag"], ["--no-such-flag"]),
    # run_pretraining.py: the launch and the backend
    ("train", lambda w: _train(w, "execution.device=cuda"), ["cuda"]),
    ("train", lambda w: _train(w, "execution.backend=poptorch"), ["Poplar SDK"]),
    ("train", lambda w: _train(w, "execution.layers_per_ipu=[1,1]"), ["torchrun"]),
    ("train", lambda w: _train(w, "execution.replication_factor=2"), ["torchrun"]),
    ("train", lambda w: _train(w, "execution.layers_per_ipu=[1,2]"), ["layers_per_ipu"]),
    # run_pretraining.py: files
    ("train", lambda w: _train(w, "checkpoint.init_from=%s" % w["checkpoint"]), ["'step' must be an integer"]),
    ("train", lambda w: _train(w, "checkpoint.output_dir=%s" % os.path.join(w["root"], "a_file")), ["a_file"]),
    ("train", lambda w: _train(w, "checkpoint.output_dir=%s" % os.path.join(w["root"], "a_file", "run")), ["a_file"]),
    ("train", lambda w: _train(w, "data.dir=%s" % os.path.join(w["root"], "nowhere")), ["nowhere"]),
    # the execution package's dry run (same loader)
    ("execution", lambda w: ["dry-run", "--config", "demo", "model.hidden_dropout_prob=5"],
     ["model.hidden_dropout_prob"]),
    ("execution", lambda w: ["dry-run"], ["--config"]),
    ("execution", lambda w: ["dry-run", "--config", "bert_large_512_pod128", "execution.num_instances=3"],
     ["execution.replication_factor 32", "execution.num_instances 3"]),
    # data
    ("data", lambda w: _prepare(w, "--shard-mb", "0"), ["--shard-mb"]),
    ("data", lambda w: _prepare(w, "--max-seq-length", "x"), ["--max-seq-length"]),
    ("data", lambda w: _prepare(w, "--lp-max-rounds", "0"), ["--lp-max-rounds"]),
    ("data", lambda w: ["prepare", "--input", os.path.join(w["root"], "missing.txt"), "--output",
                        os.path.join(w["root"], "out2")], ["missing.txt"]),
    ("data", lambda w: ["pack", "--input", os.path.join(w["root"], "a_file"), "--vocab", w["vocab"], "--output",
                        os.path.join(w["root"], "out3")], ["a_file", "neither an HDF5"]),
    ("data", lambda w: ["pack", "--input", os.path.join(w["root"], "missing.hdf5"), "--vocab", w["vocab"],
                        "--output", os.path.join(w["root"], "out3")], ["missing.hdf5"]),
    ("data", lambda w: ["pack", "--input", os.path.join(w["root"], "a_file"), "--output",
                        os.path.join(w["root"], "out3")], ["--vocab"]),
    ("data", lambda w: ["pack", "--input", os.path.join(w["root"], "a_file"), "--vocab", w["vocab"], "--output",
                        os.path.join(w["root"], "out3"), "--format", "parquet"], ["--format"]),
    ("data", lambda w: ["inspect", os.path.join(w["bad"], "empty")], ["shard-00000.npy"]),
    ("data", lambda w: ["inspect", os.path.join(w["bad"], "uint64")], ["shard-00000.npy"]),
    ("data", lambda w: ["inspect", os.path.join(w["bad"], "random")], ["shard-00000.npy"]),
    ("data", lambda w: ["inspect", os.path.join(w["root"], "nowhere")], ["nowhere"]),
    # packing
    ("packing", lambda w: ["--histogram", os.path.join(w["root"], "zero.json")], ["no sequences"]),
    ("packing", lambda w: ["--histogram", os.path.join(w["root"], "inf.json")], ["finite"]),
    ("packing", lambda w: ["--histogram", os.path.join(w["root"], "strlen.json")], ["max_sequence_length"]),
    ("packing", lambda w: ["--histogram", os.path.join(w["root"], "ok.json"), "--max-seq-length", str(10**11)],
     ["at most"]),
    ("packing.bench", lambda w: ["--histogram", os.path.join(w["root"], "zero.json")], ["no sequences"]),
    ("packing.bench", lambda w: ["--histogram", os.path.join(w["root"], "inf.json")], ["finite"]),
    ("packing.bench", lambda w: ["--histogram", os.path.join(w["root"], "strlen.json")], ["max_sequence_length"]),
    ("packing.bench", lambda w: ["--histogram", os.path.join(w["root"], "ok.json"), "--algorithms", ","],
     ["--algorithms"]),
    # packed-vs-padded bench
    ("bench", lambda w: ["--histogram", os.path.join(w["root"], "ok.json"), "--plot",
                         os.path.join(w["root"], "a_file", "bench.png")], ["a_file"]),
    ("bench", lambda w: ["--histogram", os.path.join(w["root"], "zero.json"), "--plot", ""], ["no sequences"]),
    ("bench", lambda w: ["--histogram", os.path.join(w["root"], "ok.json"), "--repeats", "0"], ["--repeats"]),
    ("bench", lambda w: ["--histogram", os.path.join(w["root"], "ok.json"), "--model", "nope"], ["--model"]),
]


@pytest.mark.parametrize("command, argv, words", CASES, ids=["%s-%d" % (c[0], i) for i, c in enumerate(CASES)])
def test_one_line_exit_2(command, argv, words, ws, capsys):
    code = COMMANDS[command](argv(ws))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert out == "", out
    for word in words:
        assert word in err, (word, err)


# Hostile files through the real commands: deep JSON where a histogram, a manifest or an index is read; a TFRecord
# record of 2**40 bytes. A dependency's fault (errors.py describe_dependency_fault) is one line too.
HOSTILE_FILES = [
    ("packing-deep-histogram", packing_main, lambda w: ["--histogram", os.path.join(w["root"], "deep.json")],
     ["nested too deeply"]),
    ("packing-deep-histogram-object", packing_main,
     lambda w: ["--histogram", os.path.join(w["root"], "deep_object.json")], ["nested too deeply"]),
    ("train-deep-manifest", train_main,
     lambda w: ["--config", "demo"] + TINY + ["data.dir=%s" % w["deep_data"],
                                             "checkpoint.output_dir=%s" % os.path.join(w["root"], "run")],
     ["nested too deeply"]),
    ("inspect-deep-manifest", data_main, lambda w: ["inspect", w["deep_data"]], ["nested too deeply"]),
    ("pack-tfrecord-2**40", data_main,
     lambda w: ["pack", "--input", os.path.join(w["root"], "huge.tfrecord"), "--vocab", w["vocab"], "--output",
                os.path.join(w["root"], "out_huge"), "--workers", "1", "--quiet"],
     ["huge.tfrecord: record 0", "1099511627776 bytes, more than"]),  # checked against the file's size first
]


@pytest.mark.parametrize("name, main, argv, words", HOSTILE_FILES, ids=[c[0] for c in HOSTILE_FILES])
def test_a_hostile_file_through_a_command_is_one_line(name, main, argv, words, ws, capsys):
    code = main(argv(ws))
    out, err = capsys.readouterr()
    assert code == 2, (out[-300:], err[-600:])
    assert err.startswith("error: ") and err.count("\n") == 1 and len(err) < 600, err
    for word in words:
        assert word in err, (word, err)


def test_a_full_disk_while_checkpointing_is_one_line(ws, capsys, monkeypatch):
    import torch

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    run = os.path.join(ws["root"], "runs", "full")
    code = train_main(["--config", "demo"] + TINY + ["data.dir=%s" % ws["data"], "checkpoint.output_dir=%s" % run,
                                                      "training.steps=1", "checkpoint.export=false"])
    out, err = capsys.readouterr()
    checkpoints = os.path.join(run, "checkpoints")
    assert code == 2 and err == "error: no space left on device: %s\n" % os.path.join(checkpoints, "step_0000001.pt"), \
        err
    assert not os.path.isdir(checkpoints) or os.listdir(checkpoints) == []  # no temporary left behind


def test_a_checkpoint_beyond_the_file_size_limit_is_one_line_and_nothing_half_written(ws, capsys):
    """A real limit (RLIMIT_FSIZE, as `ulimit -f` sets it; Python ignores SIGXFSZ, so the write fails with EFBIG
    inside torch.save's own writer): one line naming the checkpoint, no file left in checkpoints/."""
    import resource

    run = os.path.join(ws["root"], "runs", "file-size-limit")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = 64 * 1024  # the tiny model's checkpoint is larger; config.json and the lock are smaller
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip("the hard file-size limit is below %d bytes" % limit)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        code = train_main(["--config", "demo"] + TINY + ["data.dir=%s" % ws["data"], "checkpoint.output_dir=%s" % run,
                                                          "training.steps=1", "checkpoint.export=false"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    out, err = capsys.readouterr()
    checkpoints = os.path.join(run, "checkpoints")
    assert code == 2 and err == "error: file too large (the file-size limit, `ulimit -f`, or the file system's): %s\n" \
        % os.path.join(checkpoints, "step_0000001.pt"), err
    assert os.listdir(checkpoints) == []  # neither the checkpoint nor its temporary


def test_inspect_into_a_closed_pipe_is_silent(ws):
    proc = subprocess.Popen([sys.executable, "-m", "ipu_packing.data", "inspect", os.path.join(ws["data"], "packed")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 141) and "Traceback" not in err and "Error" not in err, err


@pytest.mark.slow
def test_ctrl_c_while_training_is_one_line_and_exit_130(ws):
    run = os.path.join(ws["root"], "runs", "interrupted")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "run_pretraining.py")] + TINY
        + ["data.dir=%s" % ws["data"], "checkpoint.output_dir=%s" % run, "training.steps=100000"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        for line in proc.stdout:
            if line.startswith(b"training "):
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    # the step in flight completes and is checkpointed first (train/guard.py; tests/test_train_guard.py)
    line = err.decode()
    assert line.startswith("error: stopped by SIGINT at step ") and line.endswith("resume with the same command\n")
    assert line.count("\n") == 1, line
