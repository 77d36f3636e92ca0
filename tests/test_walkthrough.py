"""docs/walkthrough.md, run as written: every command of its ```sh block, in order, in a fresh directory.

An installed ``ipu-packing-X`` is the function pyproject.toml's [project.scripts] names (run as
``python -c`` with the checkout on PYTHONPATH, as an install would put the package on sys.path);
``python`` is this interpreter. The corpus is 400 documents of the embedded default corpus, written as
the user's ``my_corpus.txt``. Each command must exit 0; the checks below read what the doc says each
step shows. Run with ``-s`` to see the commands' output.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from app_fixtures import console_scripts as scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "walkthrough.md")


def doc_commands():
    """The command lines of the doc's ```sh blocks, comments left out."""
    with open(DOC, "r", encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)
    return [line for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]


def argv_of(line: str):
    words = shlex.split(line)
    name = words[0]
    if name == "python":
        return [sys.executable] + words[1:]
    module, function = scripts()[name].split(":")
    return [sys.executable, "-c", "import sys; from %s import %s; sys.exit(%s())" % (module, function, function)] \
        + words[1:]


def write_corpus(path: str) -> None:
    from ipu_packing.data.text.corpus import default_documents

    with open(path, "w", encoding="utf-8") as f:
        for document in itertools.islice(default_documents(), 400):
            f.write("\n".join(document) + "\n\n")


def test_the_doc_has_the_seven_steps():
    names = [shlex.split(line)[0] for line in doc_commands()]
    for line in doc_commands():  # a run from a model directory takes its architecture: no model.* key to type
        if "checkpoint.init_from=" in line:
            assert not [word for word in shlex.split(line) if word.startswith("model.")], line
    assert names == ["ipu-packing-prepare", "ipu-packing-train", "ipu-packing-prepare", "ipu-packing-train",
                     "ipu-packing-train", "ipu-packing-compare", "python",
                     "ipu-packing-prepare", "ipu-packing-finetune", "ipu-packing-predict"]


def write_task(directory) -> None:
    """The embedded demo task as the user's my_task_train.tsv, my_task_dev.tsv and my_task_test.tsv."""
    from ipu_packing.data.finetune.demo import write_demo_task

    paths = write_demo_task(str(directory / "demo_task"))
    for split, name in (("train", "train"), ("validation", "dev"), ("test", "test")):
        os.rename(paths[split], str(directory / ("my_task_%s.tsv" % name)))


@pytest.mark.slow
def test_the_walkthrough_runs_as_written(tmp_path):
    write_corpus(str(tmp_path / "my_corpus.txt"))
    write_task(tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    outputs = []
    for line in doc_commands():
        proc = subprocess.run(argv_of(line), cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=900)
        print("$ " + line + "\n" + proc.stdout + proc.stderr)
        assert proc.returncode == 0, (line, proc.stderr[-3000:])
        outputs.append(proc.stdout)
    work = tmp_path / "walkthrough"
    # 1. a vocabulary of 2000 tokens trained on the corpus, recorded in the manifest with its casing
    manifest = json.loads((work / "phase1_data" / "packed" / "manifest.json").read_text())
    assert manifest["vocab_size"] == 2000 and manifest["do_lower_case"] is True
    # 2. phase 1's export: a Hugging Face directory with the tokenizer's files
    final1 = work / "phase1" / "final"
    assert sorted(os.listdir(str(final1))) == ["config.json", "model.safetensors", "special_tokens_map.json",
                                              "tokenizer_config.json", "vocab.txt"]
    # 3. phase-2 data tokenized with phase 1's vocabulary, byte for byte
    assert (work / "phase2_data" / "packed" / "vocab.txt").read_bytes() == (final1 / "vocab.txt").read_bytes()
    # 4. and 5. both phase-2 runs start from phase 1 (one line each), all weights loaded
    for out in (outputs[3], outputs[4]):
        (line,) = [x for x in out.splitlines() if x.startswith("phase-1 weights:")]
        assert line.startswith("phase-1 weights: 46 tensors from the Hugging Face directory walkthrough/phase1/final")
        assert "initialised fresh: none" in line
    config2 = json.loads((work / "phase2" / "final" / "config.json").read_text())
    config1 = json.loads((final1 / "config.json").read_text())
    for key in ("hidden_act", "layer_norm_eps", "hidden_size", "num_hidden_layers", "vocab_size"):
        assert config2[key] == config1[key], key
    # 6. compare: the packed run's accounting against the padded one's
    rows = {line.split()[0]: line.split()[1:] for line in outputs[5].splitlines() if line.split()}
    assert rows["steps"] == ["6", "6"] and rows["global_batch_sequences"] == ["58", "58"]
    packing_factor = float(rows["packing_factor"][0])
    assert 1.7 < packing_factor < 1.8 and rows["packing_factor"][1] == "1"  # at S=512, K=3 (1.766 on Python 3.11)
    # the packed step: 58 sequences / the packing factor in packs, one micro batch; the padded one 29 micro batches
    # of 2 (the corpus, and so the factor, depends on the Python)
    assert rows["micro_batch_size"] == [str(round(58 / packing_factor)), "2"]
    assert rows["gradient_accumulation"] == ["1", "29"]
    # 7. fill-mask's five tokens, each from the vocabulary
    predicted = ast.literal_eval(outputs[6].strip().splitlines()[-1])  # a printed list of strings
    vocab = set((final1 / "vocab.txt").read_text(encoding="utf-8").split("\n"))
    assert len(predicted) == 5 and all(token in vocab for token in predicted)
    # 8. the task's labels in the manifest; its vocabulary the export's
    task_manifest = json.loads((work / "task_data" / "train" / "packed" / "manifest.json").read_text())
    labels = task_manifest["task"]["labels"]
    assert len(labels) >= 2
    assert (work / "task_data" / "train" / "packed" / "vocab.txt").read_bytes() == (final1 / "vocab.txt").read_bytes()
    # 9. evaluated per example on the whole validation split; the export has the label names
    summary = json.loads((work / "finetune" / "summary.json").read_text())
    with open(str(tmp_path / "my_task_dev.tsv"), encoding="utf-8") as f:
        assert summary["evaluation"]["examples"] == len(f.read().splitlines()) - 1
    assert set(summary["evaluation"]["metrics"]) >= {"accuracy", "f1", "matthews_correlation"}
    exported = json.loads((work / "finetune" / "final" / "config.json").read_text())
    assert sorted(exported["id2label"].values()) == sorted(labels)
    # 10. one prediction per test input, in input order, each a label of the task
    with open(str(tmp_path / "my_task_test.tsv"), encoding="utf-8") as f:
        inputs = f.read().splitlines()[1:]
    predictions = [json.loads(x) for x in (work / "predictions.jsonl").read_text().splitlines()]
    assert [p["index"] for p in predictions] == list(range(len(inputs)))
    assert all(p["label"] in labels for p in predictions)

