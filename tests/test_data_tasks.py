"""`prepare --task classification`: task data through the same `prepare`, into the same pack format.

- Round trip: every pack of every split (packed and padded) unpacked gives back each example's tokenization, as
  transformers' BertTokenizerFast.from_pretrained(DIR)(a, b, truncation=True, max_length=S) makes it (ids and token
  types), its label and its example id, and every example of a split appears exactly once. Three tasks: TSV pairs
  with class names and an unlabelled test split (an export-like tokenizer directory: vocab.txt and
  tokenizer_config.json, uncased); JSON Lines single sentences with lists of names (multi-label) and two
  regression targets (a cased tokenizer.json directory); CSV pairs with quoted commas and line breaks and a float
  label (regression), at an S short enough that most pairs are truncated longest-first.
- Same bytes: two runs (1 and 2 workers) into two directories write the same manifests and shards.
- The invariants: a task pack with an example id used twice, a label on an empty slot, a label out of range, ...
  is refused when opened (and by inspect), naming the pack and the field, after the shard is rehashed and the
  manifest recounted so that every checksum agrees.
- The embedded demo task: balanced, the same rows on every call, prepared in seconds.
- Parquet files and Hugging Face datasets directories (the datasets extra), and the one-line message without it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest

from ipu_packing.data import open_dataset
from ipu_packing.data.cli import main as data_main
from ipu_packing.data.format import IGNORE_INDEX, SPECIAL_TOKENS
from ipu_packing.errors import DataError
from ipu_packing.fsutil import sha256_file

pytestmark = pytest.mark.slow  # prepares real task data, about 15 s in all on the 2-core machine

PIECES = ["the", "event", "loop", "runs", "Tasks", "naïve", "Café", "東京", "emoji😀", "don't", "U.S.A.", "x" * 120,
          "MIME", "headers", "socket", "3.14", "(parens)", "«quotes»", "e\u0301te", "\ufb01le", "Straße", "İstanbul",
          "server", "Request", "HTTP/1.1", "tab-free", "semi;colon", "über", "ÅNGSTRÖM", "a", "of", "to", "and"]


def _text(rng, low, high, extra=()):
    words = [PIECES[i] for i in rng.integers(0, len(PIECES), size=int(rng.integers(low, high + 1)))]
    for piece in extra:  # CSV only: commas, quotes and line breaks inside a quoted field
        words.insert(int(rng.integers(0, len(words) + 1)), piece)
    return " ".join(words)


def _write_tokenizers(root, sentences):
    """An export-like uncased directory (vocab.txt, tokenizer_config.json, special_tokens_map.json, as a training
    run's export writes them) and a cased tokenizer.json directory (BertTokenizerFast.save_pretrained)."""
    from transformers import BertTokenizerFast

    from ipu_packing.data.vocab import hf_tokenizer_files, train_vocab, vocab_text

    uncased = os.path.join(root, "uncased")
    os.makedirs(uncased)
    spec = train_vocab(lambda: iter(sentences), 500, lower_case=True)
    with open(os.path.join(uncased, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write(vocab_text(spec.vocab))
    for name, content in hf_tokenizer_files(True, 512, strip_accents=True).items():
        with open(os.path.join(uncased, name), "w") as f:
            json.dump(content, f)
    cased = os.path.join(root, "cased")
    os.makedirs(cased)
    spec = train_vocab(lambda: iter(sentences), 500, lower_case=False)
    with open(os.path.join(root, "cased-vocab.txt"), "w", encoding="utf-8") as f:
        f.write(vocab_text(spec.vocab))
    BertTokenizerFast(vocab_file=os.path.join(root, "cased-vocab.txt"), do_lower_case=False).save_pretrained(cased)
    assert os.path.isfile(os.path.join(cased, "tokenizer.json"))
    return uncased, cased


def _manifest(path):
    with open(path) as f:
        return json.load(f)


def _write_rows(path, kind, columns, rows):
    import csv

    with open(path, "w", encoding="utf-8", newline="") as f:
        if kind == "jsonl":
            f.writelines(json.dumps(dict(zip(columns, row)), ensure_ascii=False) + "\n" for row in rows)
            return
        writer = csv.writer(f, delimiter="\t" if kind == "tsv" else ",", lineterminator="\n",
                            quoting=csv.QUOTE_NONE if kind == "tsv" else csv.QUOTE_MINIMAL)
        writer.writerow(columns)
        writer.writerows(rows)


class Task:
    """One task's inputs: per split its texts and the labels the packs must hold."""

    def __init__(self, name, kind, columns, splits, expected, tokenizer, max_seq_length, k, options=()):
        self.name, self.kind, self.columns, self.splits = name, kind, columns, splits
        self.expected, self.tokenizer, self.max_seq_length, self.k = expected, tokenizer, max_seq_length, k
        self.options = list(options)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    rng = np.random.default_rng(7)
    root = str(tmp_path_factory.mktemp("tasks"))
    sentences = [_text(rng, 1, 30) for _ in range(400)]
    uncased, cased = _write_tokenizers(root, sentences)
    made = {}

    # TSV pairs, class names, a test split without labels (no label column)
    names = ["neutral", "contradiction", "entailment"]
    splits = {}
    for split, n in (("train", 150), ("validation", 40), ("test", 30)):
        rows = [(_text(rng, 1, 50), _text(rng, 1, 40), names[int(rng.integers(3))]) for _ in range(n)]
        rows[:3] = [row[:2] + (name,) for row, name in zip(rows, names)]  # first seen: not the sorted order
        splits[split] = rows if split != "test" else [row[:2] for row in rows]
    expected = {split: [sorted(names).index(row[2]) for row in rows] if split != "test" else [IGNORE_INDEX] * len(rows)
                for split, rows in splits.items()}
    made["tsv-pairs-names"] = Task("tsv-pairs-names", "tsv", ["sentence1", "sentence2", "label"], splits, expected,
                                   uncased, 64, 8)

    # JSON Lines single sentences, lists of names (multi-label)
    tags = ["art", "news", "sports", "weather"]
    splits = {split: [(_text(rng, 1, 60), [t for t in tags if rng.random() < 0.4]) for _ in range(n)]
              for split, n in (("train", 120), ("validation", 30))}
    splits["train"][0] = (splits["train"][0][0], list(tags))  # every name in the train split
    expected = {split: [[float(t in row[1]) for t in tags] for row in rows] for split, rows in splits.items()}
    made["jsonl-multi-label"] = Task("jsonl-multi-label", "jsonl", ["text", "label"], splits, expected, cased, 48, 6,
                                     ["--sentence1-key", "text"])

    # JSON Lines, two regression targets
    splits = {split: [(_text(rng, 1, 40), [round(float(rng.normal()), 3), round(float(rng.random()), 3)])
                      for _ in range(n)] for split, n in (("train", 80), ("validation", 20))}
    expected = {split: [row[1] for row in rows] for split, rows in splits.items()}
    made["jsonl-regression-2"] = Task("jsonl-regression-2", "jsonl", ["sentence1", "label"], splits, expected, cased,
                                      40, 5)

    # CSV pairs with quoted commas, quotes and line breaks; one float label (regression); most pairs truncated
    extra = ["a, b", 'say "hi"', "two\nlines"]
    splits = {split: [(_text(rng, 1, 40, extra), _text(rng, 1, 40), "%.2f" % rng.uniform(0, 5)) for _ in range(n)]
              for split, n in (("train", 100), ("validation", 25), ("test", 25))}
    expected = {split: [float(row[2]) for row in rows] for split, rows in splits.items()}
    made["csv-pairs-regression"] = Task("csv-pairs-regression", "csv", ["sentence1", "sentence2", "label"], splits,
                                        expected, uncased, 24, 4)

    for task in made.values():
        directory = os.path.join(root, task.name)
        os.makedirs(directory)
        task.paths = {}
        for split, rows in task.splits.items():
            columns = task.columns if split != "test" or task.name != "tsv-pairs-names" else task.columns[:2]
            task.paths[split] = os.path.join(directory, "%s.%s" % (split, task.kind))
            _write_rows(task.paths[split], task.kind, columns, rows)
        task.output = os.path.join(root, task.name + "-out")
        assert _prepare(task, task.output) == 0
    return made


def _prepare(task, output, workers=1):
    argv = ["prepare", "--task", "classification", "--tokenizer", task.tokenizer, "--output", output,
            "--max-seq-length", str(task.max_seq_length), "--max-sequences-per-pack", str(task.k), "--workers",
            str(workers), "--quiet"] + task.options
    for split, path in task.paths.items():
        argv += ["--" + split, path]
    return data_main(argv)


def unpack(directory):
    """{example id: (input ids, token types, labels)} of every pack of a task dataset; refuses an id twice."""
    ds = open_dataset(directory, as_tensors=False)
    found = {}
    for i in range(len(ds)):
        pack = ds[i]
        assert list(pack) == ["input_ids", "token_type_ids", "position_ids", "sequence_ids", "cls_positions",
                              "labels", "example_ids"]
        for j, example in enumerate(pack["example_ids"].tolist()):
            if example == -1:
                continue
            start = int(pack["cls_positions"][j])
            end = start + int((pack["sequence_ids"] == j + 1).sum())
            assert example not in found, (directory, example)
            found[example] = (pack["input_ids"][start:end].tolist(), pack["token_type_ids"][start:end].tolist(),
                              pack["labels"][j].tolist())
    return ds, found


TASKS = ["tsv-pairs-names", "jsonl-multi-label", "jsonl-regression-2", "csv-pairs-regression"]


@pytest.mark.parametrize("name", TASKS)
def test_every_pack_unpacks_to_the_transformers_tokenization_label_and_example(name, tasks):
    from transformers import BertTokenizerFast

    task = tasks[name]
    tokenizer = BertTokenizerFast.from_pretrained(task.tokenizer)
    truncated = 0
    for split, rows in task.splits.items():
        pairs = isinstance(rows[0][1], str)
        reference = tokenizer([row[0] for row in rows], [row[1] for row in rows] if pairs else None,
                              truncation=True, max_length=task.max_seq_length)
        for kind in ("packed", "padded"):
            ds, found = unpack(os.path.join(task.output, split, kind))
            assert sorted(found) == list(range(len(rows)))  # every example exactly once
            for i in range(len(rows)):
                ids, types, label = found[i]
                assert ids == reference["input_ids"][i], (split, kind, i)
                assert types == reference["token_type_ids"][i], (split, kind, i)
                assert label == pytest.approx(task.expected[split][i]), (split, kind, i)
            manifest = ds.manifest
            assert manifest["task"]["split"] == split and manifest["num_sequences"] == len(rows)
            assert ds.max_sequences_per_pack == (task.k if kind == "packed" else 1)
        truncated += manifest["task"]["truncated"]
    if name in ("tsv-pairs-names", "csv-pairs-regression"):
        assert truncated > 0  # the longest-first truncation of pairs is exercised


def test_the_manifests_say_the_task(tasks):
    names = _manifest(os.path.join(tasks["tsv-pairs-names"].output, "train", "packed", "manifest.json"))
    assert names["task"]["labels"] == ["contradiction", "entailment", "neutral"]
    assert names["task"]["problem_type"] == "single_label_classification" and names["task"]["num_labels"] == 3
    assert names["task"]["text_columns"] == ["sentence1", "sentence2"] and names["field_dtypes"]["labels"] == "|i1"
    assert not {"mlm_slots", "num_masked_tokens", "recipe", "corpus"} & set(names)
    test = _manifest(os.path.join(tasks["tsv-pairs-names"].output, "test", "packed", "manifest.json"))
    assert (test["task"]["has_labels"], test["task"]["label_column"], test["task"]["label_counts"]) == (False, None,
                                                                                                         None)
    multi = open_dataset(os.path.join(tasks["jsonl-multi-label"].output, "train", "packed"))
    assert multi.manifest["task"]["labels"] == ["art", "news", "sports", "weather"]
    assert multi[0]["labels"].shape == (6, 4) and str(multi[0]["labels"].dtype) == "torch.float32"
    regression = open_dataset(os.path.join(tasks["csv-pairs-regression"].output, "train", "packed"))
    assert regression.manifest["task"]["problem_type"] == "regression" and regression[0]["labels"].shape == (4,)
    assert regression.manifest["task"]["num_labels"] == 1 and regression.manifest["field_dtypes"]["labels"] == "<f4"


def test_a_vocab_txt_directory_whose_config_keeps_accents_is_tokenized_as_transformers_does(tasks, tmp_path):
    """tokenizer_config.json beside a bare vocab.txt says do_lower_case true, strip_accents false: transformers'
    BertTokenizerFast keeps the accents, and so does prepare."""
    from transformers import BertTokenizerFast

    task = tasks["csv-pairs-regression"]
    directory = str(tmp_path / "keeps-accents")
    shutil.copytree(task.tokenizer, directory)
    with open(os.path.join(directory, "tokenizer_config.json")) as f:
        config = json.load(f)
    config.update(do_lower_case=True, strip_accents=False)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    keeps = Task(task.name, task.kind, task.columns, task.splits, task.expected, directory, 64, 4)
    keeps.paths = task.paths
    output = str(tmp_path / "out")
    assert _prepare(keeps, output) == 0
    rows = task.splits["validation"]
    reference = BertTokenizerFast.from_pretrained(directory)([r[0] for r in rows], [r[1] for r in rows],
                                                             truncation=True, max_length=64)
    stripped = BertTokenizerFast.from_pretrained(task.tokenizer)([r[0] for r in rows], [r[1] for r in rows],
                                                                 truncation=True, max_length=64)
    assert reference["input_ids"] != stripped["input_ids"]  # the accents make a difference here
    _, found = unpack(os.path.join(output, "validation", "packed"))
    assert [found[i][0] for i in range(len(rows))] == reference["input_ids"]
    assert _manifest(os.path.join(output, "validation", "packed", "manifest.json"))["strip_accents"] is False


def test_inspect_shows_the_task(tasks, capsys):
    assert data_main(["inspect", os.path.join(tasks["tsv-pairs-names"].output, "validation", "packed")]) == 0
    out = capsys.readouterr().out
    assert "single_label_classification, num_labels 3" in out and "label balance" in out and "validation split" in out
    assert data_main(["inspect", tasks["tsv-pairs-names"].output]) == 2
    assert "name one of them" in capsys.readouterr().err


def _digests(root):
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, root)] = sha256_file(path)
    return found


def test_the_same_inputs_give_the_same_bytes(tasks, tmp_path):
    task = tasks["tsv-pairs-names"]
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    assert _prepare(task, first, workers=1) == 0
    assert _prepare(task, second, workers=2) == 0
    a, b = _digests(first), _digests(second)
    assert len(a) == 18 and a == b  # 3 splits x 2 kinds x (manifest, shard, vocab.txt)
    assert a == _digests(task.output)


# -- the invariants of a task pack, checked wherever it is opened ----------------------------------------------


def _recount(directory, packs):
    """Save `packs` as the directory's one shard and make the manifest's sha256, counts and histograms agree with
    it, counted from the sequence ids (so that the manifest's own checks pass: only the packs' can refuse it)."""
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    path = os.path.join(directory, manifest["shards"][0]["file"])
    np.save(path, packs)
    s, k = manifest["max_seq_length"], manifest["max_sequences_per_pack"]
    sid = packs["sequence_ids"].astype(np.int64)
    per_sequence = np.stack([(sid == j).sum(axis=1) for j in range(1, k + 1)], axis=1)
    lengths = np.bincount(per_sequence[per_sequence > 0], minlength=s + 1)[1:s + 1]
    per_pack = np.bincount(sid.max(axis=1), minlength=k + 1)[1:k + 1]
    n, p = int(lengths.sum()), len(packs)
    tokens = int(np.dot(lengths, np.arange(1, s + 1)))
    manifest.update(num_sequences=n, num_packs=p, num_tokens=tokens, sequence_length_histogram=lengths.tolist(),
                    sequences_per_pack_histogram=per_pack.tolist(), packing_factor=n / float(p),
                    packing_efficiency=tokens / float(p * s),
                    shards=[{"file": manifest["shards"][0]["file"], "num_packs": p, "sha256": sha256_file(path)}])
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def _partial(packs):
    """A pack with an empty slot."""
    return int(np.flatnonzero((packs["example_ids"] == -1).any(axis=1))[0])


def example_twice(packs):
    p = int(np.flatnonzero((packs["example_ids"] != -1).sum(axis=1) >= 2)[-1])
    packs["example_ids"][p, 1] = packs["example_ids"][0, 0]
    return p


def example_twice_in_one_pack(packs):
    p = int(np.flatnonzero((packs["example_ids"] != -1).sum(axis=1) >= 2)[0])
    packs["example_ids"][p, 1] = packs["example_ids"][p, 0]
    return p


def example_on_an_empty_slot(packs):
    p = _partial(packs)
    packs["example_ids"][p, -1] = 0
    return p


def label_on_an_empty_slot(packs):
    p = _partial(packs)
    packs["labels"][p, -1] = 1
    return p


def example_slot_empty_under_a_sequence(packs):
    packs["example_ids"][3, 0] = -1
    return 3


def label_out_of_range(packs):
    packs["labels"][5, 0] = 3  # three classes: 0, 1, 2
    return 5


def label_missing_under_a_sequence(packs):
    packs["labels"][6, 0] = IGNORE_INDEX
    return 6


def example_id_past_the_split(packs):
    packs["example_ids"][2, 0] = 150  # the train split's rows are 0 .. 149
    return 2


ROWS = [
    ("example-twice", "tsv-pairs-names", example_twice, "'example_ids'", "already used by pack 0 slot 0"),
    ("example-twice-in-one-pack", "tsv-pairs-names", example_twice_in_one_pack, "'example_ids'", "already used"),
    ("example-on-an-empty-slot", "tsv-pairs-names", example_on_an_empty_slot, "'example_ids'", "used (example 0)"),
    ("example-slot-empty-under-a-sequence", "tsv-pairs-names", example_slot_empty_under_a_sequence, "'example_ids'",
     "unused (-1)"),
    ("label-on-an-empty-slot", "tsv-pairs-names", label_on_an_empty_slot, "'labels'", "is 1, but sequences"),
    ("label-out-of-range", "tsv-pairs-names", label_out_of_range, "'labels'", "is 3, outside [0, 3)"),
    ("label-missing-under-a-sequence", "tsv-pairs-names", label_missing_under_a_sequence, "'labels'", "is -100"),
    ("example-id-past-the-split", "tsv-pairs-names", example_id_past_the_split, "'example_ids'", "outside [0, 150)"),
    ("multi-hot-label-on-an-empty-slot", "jsonl-multi-label", label_on_an_empty_slot, "'labels'", "empty"),
]


@pytest.mark.parametrize("name, task_name, corrupt, field, words", ROWS, ids=[r[0] for r in ROWS])
def test_a_corrupt_task_pack_is_refused_naming_the_pack_and_field(name, task_name, corrupt, field, words, tasks,
                                                                  tmp_path, capsys):
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(tasks[task_name].output, "train", "packed"), directory)
    with open(os.path.join(directory, "manifest.json")) as f:
        shard = os.path.join(directory, json.load(f)["shards"][0]["file"])
    open_dataset(directory)  # clean before
    packs = np.load(shard)
    p = corrupt(packs)
    _recount(directory, packs)  # checksums and counts agree: only the invariant can refuse it
    with pytest.raises(DataError) as info:
        open_dataset(directory)
    message = str(info.value)
    assert "\n" not in message and directory in message, message
    assert "pack %d" % p in message and "field %s" % field in message and words in message, message
    assert data_main(["inspect", directory]) == 2
    assert capsys.readouterr().err == "error: %s\n" % message


def test_a_regression_label_that_is_not_finite_is_refused(tasks, tmp_path):
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(tasks["csv-pairs-regression"].output, "train", "packed"), directory)
    with open(os.path.join(directory, "manifest.json")) as f:
        packs = np.load(os.path.join(directory, json.load(f)["shards"][0]["file"]))
    packs["labels"][4, 0] = np.nan
    _recount(directory, packs)
    with pytest.raises(DataError, match=r"field 'labels' pack 4 slot 0 is nan, not a finite number"):
        open_dataset(directory)


def test_the_writer_refuses_a_task_shard_that_breaks_an_invariant(tmp_path):
    """write_shard checks every pack it builds: two sequences claiming one example id."""
    from ipu_packing.data.format import FieldLayout
    from ipu_packing.data.instance_files import Instances
    from ipu_packing.data.write.packs import PackLayout, ShardTask, write_shard

    zeros = np.zeros(2, np.int32)
    ids = np.array([2, 7, 8, 3] * 2, dtype=np.int32)

    def instances(example_ids):
        return Instances(ids, np.array([4, 4], np.int32), np.array([4, 4], np.int32), zeros, zeros,
                         np.zeros(0, np.int32), np.zeros(0, np.int32),
                         {"labels": np.array([0, 1], np.int32), "example_ids": np.array(example_ids, np.int32)})

    task = FieldLayout("classification", "single_label_classification", 2)
    layout = PackLayout(16, 3, 0, 64, cls_id=2, task=task, num_sequences=2)
    path = str(tmp_path / "shard-00000.npy")
    write_shard(instances([0, 1]), ShardTask(path, np.array([0, 2]), 0), layout)
    os.remove(path)
    with pytest.raises(DataError, match="pack 0: field 'example_ids' slot 1 is 0, already used by pack 0 slot 0"):
        write_shard(instances([0, 0]), ShardTask(path, np.array([0, 2]), 0), layout)
    assert not os.path.exists(path)


# -- the embedded demo task -------------------------------------------------------------------------------------


def test_the_demo_task_is_balanced_and_the_same_on_every_call(tmp_path):
    from ipu_packing.data.finetune.demo import FAMILIES, PER_CLASS, demo_rows, family_sentences, write_demo_task

    rows = demo_rows()
    labels = [label for label, _ in FAMILIES]
    sizes = {split: len(split_rows) for split, split_rows in rows.items()}
    per_class = min(PER_CLASS, min(len(sentences) for _, sentences in family_sentences()))
    assert sum(sizes.values()) == len(labels) * per_class
    assert sizes["train"] == len(labels) * round(0.8 * per_class)  # 80/10/10 of each family
    if per_class == PER_CLASS:  # CPython 3.11's standard library; another's may have fewer for some family
        assert sizes == {"train": 2880, "validation": 360, "test": 360}
    for split, split_rows in rows.items():
        counts = [sum(1 for _, label in split_rows if label == name) for name in labels]
        assert len(set(counts)) == 1, (split, counts)  # balanced
    texts = [text for split_rows in rows.values() for text, _ in split_rows]
    assert len(set(texts)) == len(texts)  # no sentence in two places
    a = write_demo_task(str(tmp_path / "a"))
    b = write_demo_task(str(tmp_path / "b"))
    assert [sha256_file(a[s]) for s in a] == [sha256_file(b[s]) for s in b]
    with open(a["train"], encoding="utf-8") as f:
        assert f.readline() == "sentence1\tlabel\n"


def test_the_demo_task_prepares_as_a_task(tmp_path, capsys):
    output = str(tmp_path / "demo")
    assert data_main(["prepare", "--task", "classification", "--input", "default", "--output", output,
                      "--max-seq-length", "128", "--max-sequences-per-pack", "8", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "4 labels (concurrency, mail, networking, testing)" in out and "/train: " in out
    for split in ("train", "validation", "test"):
        ds, found = unpack(os.path.join(output, split, "packed"))
        task = ds.manifest["task"]
        assert task["labels"] == ["concurrency", "mail", "networking", "testing"] and task["has_labels"]
        assert len(set(task["label_counts"])) == 1 and sorted(found) == list(range(ds.manifest["num_sequences"]))
        assert task["source"]["file"] == "default (%s.tsv)" % split
        assert ds.manifest["packing_factor"] > 4


# -- Parquet and datasets directories (the datasets extra) ------------------------------------------------------


def test_datasets_directories_and_parquet_files(tasks, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets", reason="the datasets extra: pip install 'ipu-packing[datasets]'")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["yes", "no"]), "idx": datasets.Value("int32")})
    rng = np.random.default_rng(3)
    data = {}
    for split, n in (("train", 60), ("validation", 20), ("test", 10)):
        data[split] = {"premise": [_text(rng, 1, 20) for _ in range(n)],
                       "hypothesis": [_text(rng, 1, 20) for _ in range(n)],
                       "label": [int(rng.integers(2)) if split != "test" else -1 for _ in range(n)],
                       "idx": list(range(n))}
    whole = datasets.DatasetDict({split: datasets.Dataset.from_dict(columns, features=features)
                                  for split, columns in data.items()})
    whole.save_to_disk(str(tmp_path / "glue"))
    for split in data:
        whole[split].to_parquet(str(tmp_path / ("%s.parquet" % split)))
    task = tasks["tsv-pairs-names"]
    for source in ("glue", "parquet"):
        output = str(tmp_path / ("out-" + source))
        paths = {split: str(tmp_path / "glue" / split) if source == "glue" else str(tmp_path / ("%s.parquet" % split))
                 for split in data}
        argv = ["prepare", "--task", "classification", "--tokenizer", task.tokenizer, "--output", output,
                "--max-seq-length", "32", "--max-sequences-per-pack", "4", "--workers", "1", "--quiet"]
        for split, path in paths.items():
            argv += ["--" + split, path]
        assert data_main(argv) == 0
        from transformers import BertTokenizerFast

        tokenizer = BertTokenizerFast.from_pretrained(task.tokenizer)
        for split, columns in data.items():
            ds, found = unpack(os.path.join(output, split, "packed"))
            reference = tokenizer(columns["premise"], columns["hypothesis"], truncation=True, max_length=32)
            assert sorted(found) == list(range(len(columns["label"])))
            for i, label in enumerate(columns["label"]):
                assert found[i][0] == reference["input_ids"][i]
                assert found[i][2] == (label if label != -1 else IGNORE_INDEX)
            task_entry = ds.manifest["task"]
            assert task_entry["text_columns"] == ["premise", "hypothesis"]  # run_glue: the first two non-label
            assert task_entry["labels"] == ["yes", "no"]  # a ClassLabel's names, by id (Parquet: its metadata)
            assert task_entry["source"]["format"] == ("datasets" if source == "glue" else "parquet")
            assert task_entry["has_labels"] == (split != "test")


def test_a_datasets_dict_directory_is_named_by_split(tmp_path, capsys):
    datasets = pytest.importorskip("datasets", reason="the datasets extra: pip install 'ipu-packing[datasets]'")
    whole = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"sentence1": ["a"], "label": [0]})})
    whole.save_to_disk(str(tmp_path / "d"))
    capsys.readouterr()  # datasets' progress bars
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in list(SPECIAL_TOKENS) + ["a", "b"]))
    assert data_main(["prepare", "--task", "classification", "--train", str(tmp_path / "d"), "--validation",
                      str(tmp_path / "d"), "--tokenizer", str(vocab), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "a datasets DatasetDict (splits train): name one split's directory" in err and err.count("\n") == 1


def test_without_the_datasets_extra_a_parquet_input_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError, as when not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "train.parquet").write_bytes(b"PAR1")
    (tmp_path / "dev.parquet").write_bytes(b"PAR1")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in list(SPECIAL_TOKENS) + ["a", "b"]))
    assert data_main(["prepare", "--task", "classification", "--train", str(tmp_path / "train.parquet"),
                      "--validation", str(tmp_path / "dev.parquet"), "--tokenizer", str(vocab), "--output",
                      str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'ipu-packing[datasets]'" in err and "train.parquet" in err, err
    assert not (tmp_path / "o").exists()


def test_a_pretraining_manifest_is_as_it_was(tasks):
    """A pretraining dataset's manifest keys are MANIFEST_KEYS, its identity covers the same facts: the task key
    and its checks touch only task datasets (tests/test_data_hashes.py pins the bytes)."""
    from ipu_packing.data.format import MANIFEST_KEYS, dataset_identity, manifest_keys

    assert manifest_keys({}) is MANIFEST_KEYS and "task" not in MANIFEST_KEYS
    manifest = _manifest(os.path.join(tasks["tsv-pairs-names"].output, "train", "packed", "manifest.json"))
    assert "task" in manifest_keys(manifest) and "mlm_slots" not in manifest_keys(manifest)
    other = dict(manifest, task=dict(manifest["task"], split="validation"))
    assert dataset_identity(manifest) != dataset_identity(other)
    moved = dict(manifest, task=dict(manifest["task"], tokenizer="/elsewhere/tokenizer",
                                      source=dict(manifest["task"]["source"], file="/elsewhere/train.tsv")))
    assert dataset_identity(manifest) == dataset_identity(moved)  # paths left out, as for pretraining
