"""compare refuses two runs of another S, K or dataset unless --force; forced, each difference is a warning
(the --json warnings field, and a warning: line on stderr). A packed and a padded run of one prepared
dataset (demo_512 against demo_512_padded: the same data.dir, S and K) compare without a word."""

from __future__ import annotations

import json
import os

import pytest

from ipu_packing.compare import compare, main, read_run


def write_run(root, name, data, steps=4):
    path = os.path.join(str(root), name)
    os.makedirs(path)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for i in range(steps):
            f.write(json.dumps({"step": i + 1, "sequences": 10, "tokens": 100, "seconds": 1.0, "mlm_loss": 8.0 - i,
                                "mlm_accuracy": 0.1, "nsp_accuracy": 0.5, "loss": 9.0 - i}) + "\n")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"training": {"global_batch_sequences": 10}, "data": data}, f)
    return path


DEMO_512 = {"dir": "output/data/demo_512", "layout": "packed", "max_seq_length": 512, "max_sequences_per_pack": 3}


def test_packed_against_padded_of_one_dataset_is_like_for_like(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = write_run(tmp_path, "packed", DEMO_512)
    b = write_run(tmp_path, "padded", dict(DEMO_512, layout="padded", dir="output/data/./demo_512/"))
    assert compare(read_run(a), read_run(b)).warnings == []
    assert main([a, b, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["warnings"] == [] and err == ""


@pytest.mark.parametrize("change,words", [
    ({"max_seq_length": 128, "dir": "output/data/demo_128"},
     ["the runs differ in S: data.max_seq_length 128 (A) against 512 (B)",
      "dataset: data.dir output/data/demo_128 (A) against output/data/demo_512 (B)"]),
    ({"max_sequences_per_pack": 12}, ["the runs differ in K: data.max_sequences_per_pack 12 (A) against 3 (B)"]),
    ({"dir": "elsewhere"}, ["the runs differ in dataset: data.dir elsewhere (A) against output/data/demo_512 (B)"]),
])
def test_other_s_k_or_dataset_is_refused_unless_forced(tmp_path, capsys, monkeypatch, change, words):
    monkeypatch.chdir(tmp_path)  # the data.dir paths name no prepared dataset (compare would read its manifest)
    a = write_run(tmp_path, "a", dict(DEMO_512, **change))
    b = write_run(tmp_path, "b", DEMO_512)
    assert main([a, b]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1
    for word in words:
        assert word in err, err
    assert "--force" in err
    # forced: the comparison, each difference a warning in --json and a line on stderr
    assert main([a, b, "--json", "--force"]) == 0
    out, err = capsys.readouterr()
    warnings = json.loads(out)["warnings"]
    assert len(warnings) == len(words) == err.count("\n")
    assert err.splitlines() == ["warning: %s" % w for w in warnings]
    assert json.loads(out)["throughput_ratio"] == pytest.approx(1.0)
    assert main([a, b, "--force"]) == 0  # the text report ends with them
    assert capsys.readouterr().out.splitlines()[-len(warnings):] == ["warning: %s" % w for w in warnings]


def test_runs_that_do_not_record_their_data_are_not_compared_on_it(tmp_path):
    a = write_run(tmp_path, "a", DEMO_512)
    b = write_run(tmp_path, "b", {"layout": "padded"})  # an older or hand-made run: nothing to compare
    assert compare(read_run(a), read_run(b)).warnings == []


def test_a_data_section_that_is_not_an_object_is_one_line(tmp_path, capsys):
    a = write_run(tmp_path, "a", DEMO_512)
    b = write_run(tmp_path, "b", [1, 2])
    assert main([a, b]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data is a list, not a JSON object" in err
