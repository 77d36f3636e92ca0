"""python -m ipu_packing.bench.convergence: packed and padded fine-tuning runs of each seed, their final
evaluations in one table. Tiny runs (4 steps); the metrics' values are not asserted, only where they come from."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
import torch

from ipu_packing.bench.convergence import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

TINY_TASK = ["model.vocab_size=8192", "model.hidden_size=32", "model.intermediate_size=64",
             "model.num_hidden_layers=2", "model.num_attention_heads=2", "data.max_seq_length=64",
             "data.max_sequences_per_pack=6", "execution.micro_batch_size=4", "training.global_batch_sequences=24",
             "checkpoint.init_from=null", "logging.tensorboard=false", "task.eval_batch_packs=16",
             "training.steps=4", "task.eval_every_steps=0"]


def run_main(argv):
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        torch.set_num_threads(threads)
    return code, out.getvalue(), err.getvalue()


def test_each_seed_trains_both_layouts_and_the_table_reads_their_summaries(demo_task, tmp_path):
    output = str(tmp_path / "runs")
    argv = ["--seeds", "1,2", "--output", output, "--json", "--packed", "execution.micro_batch_size=2",
            "data.dir=%s" % demo_task] + TINY_TASK
    code, out, err = run_main(argv)
    assert code == 0, err
    r = json.loads(out)
    assert [(row["layout"], row["seed"]) for row in r["rows"]] == [("packed", 1), ("padded", 1), ("packed", 2),
                                                                   ("padded", 2)]
    for row in r["rows"]:
        summary = json.load(open(os.path.join(output, "%s_seed%d" % (row["layout"], row["seed"]), "summary.json")))
        assert summary["dataset"]["path"].endswith(os.path.join("train", row["layout"]))
        assert row["steps"] == 4 and row["metrics"] == summary["evaluation"]["metrics"]
        assert row["split"] == "validation" and row["examples"] > 0
    padded = [row for row in r["rows"] if row["layout"] == "padded"]
    assert all(row["sequences_per_step"] == 24 for row in padded)
    assert r["packed_overrides"] == ["execution.micro_batch_size=2"]
    assert set(r["summary"]) == {"packed", "padded"} and "accuracy" in r["summary"]["packed"]
    # finished runs are read back, not trained again: the same table
    code, again, err = run_main(argv)
    assert code == 0, err
    assert [row["metrics"] for row in json.loads(again)["rows"]] == [row["metrics"] for row in r["rows"]]
    # asked for with other values, a finished run is refused, not mixed into the table
    before = {name: os.listdir(os.path.join(output, name)) for name in os.listdir(output)}
    code, out, err = run_main(argv + ["training.steps=5"])
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and out == "" and errors == [err.splitlines()[-1]], err
    assert errors[0].startswith("error: the packed run of seed 1 (%s): " % os.path.join(output, "packed_seed1"))
    assert "training.steps" in errors[0], errors
    assert {name: os.listdir(os.path.join(output, name)) for name in os.listdir(output)} == before


@pytest.mark.parametrize("argv, words", [
    (["--seeds", "1,x"], "--seeds takes integers"),
    (["--seeds", "1,1"], "names a seed twice"),
    (["training.seed=3"], "training.seed is set by the command"),
    (["--config", "demo"], "is not a fine-tuning config"),
    (["--seeds", "1,-1"], "training.seed must be"),
    (["--packed", "optimizer.lr=-1"], "optimizer.lr"),
], ids=["not integers", "a seed twice", "a seed override", "a pretraining config", "a bad second seed",
        "a bad packed override"])
def test_a_bad_argument_is_one_line(argv, words, tmp_path):
    code, out, err = run_main(argv + ["--output", str(tmp_path / "runs")])
    assert code == 2 and out == ""
    assert err.startswith("error: ") and words in err and err.count("\n") == 1, err
    assert not os.path.exists(str(tmp_path / "runs"))
