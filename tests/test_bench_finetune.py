"""bench --config on a fine-tuning config: both layouts of the task's prepared train split, the same examples
(matched by example_ids; question-answering windows by feature_ids), timed through the config's runner. Speed is
reported, never asserted."""

from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest
import torch

from ipu_packing.bench import cli as bench_cli
from ipu_packing.data import open_dataset

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_TASK = ["model.vocab_size=8192", "model.hidden_size=32", "model.intermediate_size=64",
             "model.num_hidden_layers=2", "model.num_attention_heads=2", "data.max_seq_length=64",
             "data.max_sequences_per_pack=6", "execution.micro_batch_size=4", "training.global_batch_sequences=24",
             "checkpoint.init_from=null"]
"""finetune_demo at tiny sizes on the demo task prepared at S=64, K=6 (conftest's demo_task), from scratch."""


def run_main(args):
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = bench_cli.main(args)
    finally:
        torch.set_num_threads(threads)  # the config sets one thread
    return code, out.getvalue(), err.getvalue()


def test_both_layouts_time_the_same_examples_of_the_task(demo_task):
    code, out, err = run_main(["--config", "finetune_demo", "--steps", "2", "--json", "data.dir=%s" % demo_task]
                              + TINY_TASK)
    assert code == 0, err
    r = json.loads(out)
    assert r["task"] == "classification" and r["matched_by"] == "example_ids"
    assert r["source"] == os.path.join(demo_task, "train", "packed")
    assert r["padded_source"] == os.path.join(demo_task, "train", "padded")
    assert (r["max_seq_length"], r["max_sequences_per_pack"], r["steps"]) == (64, 6, 2)
    # every example of the chosen packs has its own padded row, and no example twice
    assert r["num_sequences"] == r["padded_rows"] == len(r["example_ids"]) == len(set(r["example_ids"]))
    assert r["num_packs"] < r["num_sequences"]
    packed = open_dataset(os.path.join(demo_task, "train", "packed"), as_tensors=False)
    in_packs = sorted(int(e) for i in range(len(packed)) for e in packed[i]["example_ids"] if e >= 0)
    assert set(r["example_ids"]) <= set(in_packs)
    for name in ("padded", "packed"):
        layout = r[name]
        assert layout["steps"] == 2 and layout["sequences"] <= r["num_sequences"]
        assert np.isfinite(layout["sequences_per_second"]) and layout["sequences_per_second"] > 0
    # the padded steps: 24 sequences each, one per row; the packed ones: packs holding about as many
    assert r["padded"]["sequences"] == r["padded"]["rows"] == 2 * 24
    assert r["packed"]["rows"] < r["packed"]["sequences"]


TINY_QA_TASK = TINY_TASK[:5] + ["data.max_seq_length=64", "data.max_sequences_per_pack=4",
                                "execution.micro_batch_size=4", "training.global_batch_sequences=8",
                                "checkpoint.init_from=null"]
"""finetune_qa_demo at tiny sizes on the QA demo task prepared at S=64, K=4 (conftest's qa_demo_task), from
scratch."""


def test_question_answering_layouts_time_the_same_windows(qa_demo_task):
    from ipu_packing.bench.config_finetune import sequence_labels

    code, out, err = run_main(["--config", "finetune_qa_demo", "--steps", "2", "--json",
                               "data.dir=%s" % qa_demo_task] + TINY_QA_TASK)
    assert code == 0, err
    r = json.loads(out)
    assert r["task"] == "question_answering" and (r["max_seq_length"], r["max_sequences_per_pack"]) == (64, 4)
    assert r["matched_by"] == "feature_ids"
    # the ids are windows' (feature_ids), each once, each with its padded row
    assert r["num_sequences"] == r["padded_rows"] == len(r["example_ids"]) == len(set(r["example_ids"]))
    assert r["padded"]["sequences"] == r["padded"]["rows"] == 2 * 8
    assert r["packed"]["rows"] < r["packed"]["sequences"]
    # an answer is compared from its window's own [CLS]: the same window's labels in both layouts
    packed = open_dataset(os.path.join(qa_demo_task, "train", "packed"), as_tensors=False)
    padded = open_dataset(os.path.join(qa_demo_task, "train", "padded"), as_tensors=False)
    row_of = {int(padded[i]["feature_ids"][0]): i for i in range(len(padded))}
    shifted = 0
    for i in range(len(packed)):
        record = packed[i]
        for k, f in enumerate(record["feature_ids"]):
            if f >= 0:
                row = padded[row_of[int(f)]]
                assert np.array_equal(sequence_labels(record, k), sequence_labels(row, 0))
                moved = record["start_positions"][k] != row["start_positions"][0]
                shifted += int(record["cls_positions"][k] > 0 and moved)
    assert shifted > 0  # the positions themselves differ between the layouts: the comparison must shift them


def test_a_histogram_is_refused_for_a_fine_tuning_config(demo_task, tmp_path):
    histogram = tmp_path / "h.json"
    histogram.write_text(json.dumps({"histogram": [1] * 64}))
    code, out, err = run_main(["--config", "finetune_demo", "--steps", "1", "--histogram", str(histogram),
                               "data.dir=%s" % demo_task] + TINY_TASK)
    assert code == 2 and out == ""
    assert err.startswith("error: --histogram applies to pretraining configs") and err.count("\n") == 1


def test_too_few_examples_for_the_steps_is_one_line(demo_task):
    code, out, err = run_main(["--config", "finetune_demo", "--steps", "100000", "data.dir=%s" % demo_task]
                              + TINY_TASK)
    assert code == 2 and out == ""
    assert "lower --steps" in err and err.startswith("error: ") and err.count("\n") == 1
