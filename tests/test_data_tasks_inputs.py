"""`prepare --task classification` refuses bad input in one line, and writes nothing.

Each row of the table is a set of split files with one fault; the command must exit 2 with exactly one stderr line
`error: ...` naming the file, the line (or row) and, where a column is at fault, the column, and leave no output
directory, no lock file and no temporary directory behind. The label rules themselves (names sorted, integers
kept, floats as regression, lists as multi-hot) are checked on small tables through data/finetune/labels.py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ipu_packing.data.cli import main as data_main
from ipu_packing.data.format import IGNORE_INDEX, SPECIAL_TOKENS
from ipu_packing.data.finetune.rows import read_split
from ipu_packing.data.finetune.labels import encode_labels, infer_labels, text_columns
from ipu_packing.errors import DataError

WORDS = ["the", "a", "loop", "task", "mail", "header", "socket", "server", "test", "case", "##s", "."]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A tokenizer directory holding a bare vocab.txt (refusals come before any token is made)."""
    directory = tmp_path_factory.mktemp("tokenizer")
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in list(SPECIAL_TOKENS) + WORDS), encoding="utf-8")
    return str(directory)


def _write(path, content):
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(path, mode, **({} if mode == "wb" else {"encoding": "utf-8", "newline": ""})) as f:
        f.write(content)
    return str(path)


def _jsonl(rows):
    return "".join(json.dumps(row) + "\n" for row in rows)


GOOD_TSV = "sentence1\tlabel\nthe loop\tconcurrency\nthe mail\tmail\nthe socket\tnetworking\n"
GOOD_DEV = "sentence1\tlabel\nthe task\tconcurrency\nthe header\tmail\n"

# (id, {file name: content}, extra options, words the line must hold (besides "error: "))
ROWS = [
    ("missing-label-column", {"train.tsv": "sentence1\ttag\nthe loop\ta\nthe mail\tb\n", "dev.tsv": GOOD_DEV}, [],
     ["train.tsv:1", "no column 'label'"]),
    ("missing-text-column", {"train.tsv": GOOD_TSV, "dev.tsv": GOOD_DEV}, ["--sentence1-key", "text"],
     ["train.tsv:1", "no column 'text'"]),
    ("validation-lacks-text-column", {"train.tsv": GOOD_TSV, "dev.tsv": "sentence\tlabel\nthe task\tmail\n"}, [],
     ["dev.tsv:1", "no column 'sentence1'"]),
    ("empty-text", {"train.tsv": GOOD_TSV + " \tmail\n", "dev.tsv": GOOD_DEV}, [],
     ["train.tsv:5", "column 'sentence1'", "empty text"]),
    ("empty-text-json", {"train.jsonl": _jsonl([{"sentence1": "the loop", "label": "a"},
                                                {"sentence1": "", "label": "b"}]),
                         "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": "a"}])}, [],
     ["train.jsonl:2", "column 'sentence1'", "empty text"]),
    ("text-not-a-string", {"train.jsonl": _jsonl([{"sentence1": "the loop", "label": "a"},
                                                  {"sentence1": 7, "label": "b"}]),
                           "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": "a"}])}, [],
     ["train.jsonl:2", "column 'sentence1'", "not text"]),
    ("label-wrong-kind-json", {"train.jsonl": _jsonl([{"sentence1": "the loop", "label": "a"},
                                                      {"sentence1": "the mail", "label": 3}]),
                               "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": "a"}])}, [],
     ["train.jsonl:2", "column 'label'", "3 is a number", "first row's label is a name"]),
    ("label-name-among-numbers", {"train.csv": "sentence1,label\nthe loop,0.5\nthe mail,1.5\nthe task,n/a\n",
                                  "dev.csv": "sentence1,label\nthe mail,1.0\n"}, [],
     ["train.csv:4", "column 'label'", "'n/a' is not a number"]),
    ("label-a-bool", {"train.jsonl": _jsonl([{"sentence1": "the loop", "label": True}]),
                      "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": False}])}, [],
     ["train.jsonl:1", "column 'label'", "True is not a label"]),
    ("float-forced-single-label", {"train.csv": "sentence1,label\nthe loop,0.5\nthe mail,1\n",
                                   "dev.csv": "sentence1,label\nthe mail,1\n"},
     ["--problem-type", "single_label_classification"], ["train.csv:2", "column 'label'", "'0.5' is not a class"]),
    ("ragged-multi-hot-lists", {"train.jsonl": _jsonl([{"sentence1": "the loop", "label": [1, 0, 1]},
                                                       {"sentence1": "the mail", "label": [0, 1]}]),
                                "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": [0, 1, 0]}])},
     ["--problem-type", "multi_label_classification"], ["train.jsonl:2", "column 'label'", "ragged"]),
    ("ragged-regression-lists-in-validation", {
        "train.jsonl": _jsonl([{"sentence1": "the loop", "label": [0.5, 1.0]},
                               {"sentence1": "the mail", "label": [0.0, 2.0]}]),
        "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": [0.1, 0.2]}, {"sentence1": "a", "label": [0.1]}])},
     [], ["dev.jsonl:2", "column 'label'", "1 value,", "have 2", "ragged"]),
    ("multi-hot-not-0-or-1", {"train.jsonl": _jsonl([{"sentence1": "the loop", "label": [1, 2]}]),
                              "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": [0, 1]}])},
     ["--problem-type", "multi_label_classification"], ["train.jsonl:1", "column 'label'", "multi-hot"]),
    ("unknown-label-in-validation", {"train.tsv": GOOD_TSV, "dev.tsv": GOOD_DEV + "the case\ttesting\n"}, [],
     ["dev.tsv:4", "column 'label'", "'testing' is not one of the train split's 3 labels"]),
    ("unknown-multi-label-name-in-validation", {
        "train.jsonl": _jsonl([{"sentence1": "the loop", "label": ["a", "b"]}, {"sentence1": "x", "label": ["c"]}]),
        "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": ["a", "z"]}])}, [],
     ["dev.jsonl:1", "column 'label'", "'z' is not one of the train split's 3 label names"]),
    ("class-id-past-the-classes", {"train.csv": "sentence1,label\nthe loop,0\nthe mail,2\nthe task,1\n",
                                   "dev.csv": "sentence1,label\nthe mail,1\nthe task,3\n"}, [],
     ["dev.csv:3", "column 'label'", "class 3 is outside the train split's classes 0 .. 2"]),
    ("negative-class", {"train.csv": "sentence1,label\nthe loop,0\nthe mail,-2\n",
                        "dev.csv": "sentence1,label\nthe mail,1\n"}, [],
     ["train.csv:3", "column 'label'", "negative"]),
    ("regression-beyond-float32", {"train.csv": "sentence1,label\nthe loop,0.5\nthe mail,1e39\n",
                                   "dev.csv": "sentence1,label\nthe mail,1.0\n"}, [],
     ["train.csv:3", "column 'label'", "'1e39' is beyond float32's range"]),
    ("regression-list-beyond-float32-in-validation", {
        "train.jsonl": _jsonl([{"sentence1": "the loop", "label": [0.5, 1.0]}]),
        "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": [0.5, 1.0]}, {"sentence1": "a", "label": [-4e38, 0]}])},
     [], ["dev.jsonl:2", "column 'label'", "[-4e+38, 0] is beyond float32's range"]),
    ("name-where-numbers-in-validation", {"train.csv": "sentence1,label\nthe loop,0.5\nthe mail,1.5\n",
                                          "dev.csv": "sentence1,label\nthe mail,high\n"}, [],
     ["dev.csv:2", "column 'label'", "'high' is not a number"]),
    ("one-class", {"train.tsv": "sentence1\tlabel\nthe loop\ta\nthe mail\ta\n", "dev.tsv": GOOD_DEV}, [],
     ["train.tsv:2", "column 'label'", "one class"]),
    ("train-row-without-label", {"train.tsv": GOOD_TSV + "the case\t\n", "dev.tsv": GOOD_DEV}, [],
     ["train.tsv:5", "column 'label'", "no label"]),
    ("validation-row-without-label", {"train.tsv": GOOD_TSV, "dev.tsv": GOOD_DEV + "the case\t\n"}, [],
     ["dev.tsv:4", "column 'label'", "no label"]),
    ("test-labelled-on-some-rows", {"train.tsv": GOOD_TSV, "dev.tsv": GOOD_DEV,
                                    "test.tsv": "sentence1\tlabel\nthe task\tmail\nthe case\t\n"}, [],
     ["test.tsv:3", "column 'label'", "labels on every row or on none"]),
    ("bad-utf8", {"train.tsv": GOOD_TSV.encode() + b"the \xff loop\tmail\n", "dev.tsv": GOOD_DEV}, [],
     ["train.tsv:5", "not UTF-8", "byte 0xff at column 5"]),
    ("tsv-row-with-a-tab-in-its-text", {"train.tsv": GOOD_TSV + "the\tloop\tmail\n", "dev.tsv": GOOD_DEV}, [],
     ["train.tsv:5", "3 fields", "header (line 1) has 2"]),
    ("csv-unclosed-quote", {"train.csv": 'sentence1,label\n"the loop,a\n', "dev.csv": "sentence1,label\nx,a\n"}, [],
     ["train.csv:2", "not valid CSV"]),
    ("json-line-not-json", {"train.jsonl": '{"sentence1": "the loop", "label": "a"}\n{"sentence1": \n',
                            "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": "a"}])}, [],
     ["train.jsonl:2", "not valid JSON at column 15"]),
    ("json-line-not-an-object", {"train.jsonl": '["the loop", "a"]\n',
                                 "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": "a"}])}, [],
     ["train.jsonl:1", "object"]),
    ("json-row-without-the-text-key", {"train.jsonl": _jsonl([{"sentence1": "the loop", "label": "a"},
                                                              {"label": "b"}]),
                                       "dev.jsonl": _jsonl([{"sentence1": "the mail", "label": "a"}])}, [],
     ["train.jsonl:2", "column 'sentence1'", "missing"]),
    ("header-names-a-column-twice", {"train.tsv": "sentence1\tlabel\tlabel\nthe loop\ta\tb\n", "dev.tsv": GOOD_DEV},
     [], ["train.tsv:1", "column 'label' appears twice"]),
    ("empty-split", {"train.tsv": GOOD_TSV, "dev.tsv": "sentence1\tlabel\n"}, [],
     ["dev.tsv", "validation split holds no rows"]),
    ("unknown-format", {"train.txt": "the loop\n", "dev.tsv": GOOD_DEV}, [], ["train.txt", "unknown input format"]),
    ("missing-file", {"dev.tsv": GOOD_DEV}, [], ["train.tsv", "no such file"]),
]


@pytest.mark.parametrize("name, files, options, words", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_exit_2_and_nothing_written(name, files, options, words, tokenizer, tmp_path, capsys):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for file_name, content in files.items():
        _write(inputs / file_name, content)
    names = sorted(files) + (["train.tsv"] if name == "missing-file" else [])
    train = next(n for n in names if n.startswith("train"))
    dev = next(n for n in names if n.startswith("dev"))
    test = [n for n in names if n.startswith("test")]
    output = tmp_path / "out" / "task"
    argv = ["prepare", "--task", "classification", "--train", str(inputs / train), "--validation", str(inputs / dev),
            "--tokenizer", tokenizer, "--output", str(output), "--max-seq-length", "16", "--workers", "1",
            "--quiet"] + (["--test", str(inputs / test[0])] if test else []) + options
    assert data_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not (tmp_path / "out").exists(), sorted(os.listdir(tmp_path / "out"))  # no output, lock or temporary


def test_the_good_files_of_the_table_are_prepared(tokenizer, tmp_path, capsys):
    """The table's faults are what is refused: the same files without them are prepared."""
    _write(tmp_path / "train.tsv", GOOD_TSV)
    _write(tmp_path / "dev.tsv", GOOD_DEV)
    _write(tmp_path / "test.tsv", "sentence1\nthe case\n")
    output = str(tmp_path / "task")
    assert data_main(["prepare", "--task", "classification", "--train", str(tmp_path / "train.tsv"), "--validation",
                      str(tmp_path / "dev.tsv"), "--test", str(tmp_path / "test.tsv"), "--tokenizer", tokenizer,
                      "--output", output, "--max-seq-length", "16", "--workers", "1", "--quiet"]) == 0, \
        capsys.readouterr().err
    assert sorted(os.listdir(output)) == ["test", "train", "validation"]
    assert sorted(os.listdir(os.path.join(output, "test"))) == ["packed", "padded"]


@pytest.mark.parametrize("argv, words", [
    (["--train", "a.tsv"], "--validation"),
    (["--validation", "a.tsv"], "--train"),
    ([], "--train FILE --validation FILE"),
    (["--input", "corpus.txt"], "--input corpus.txt"),
    (["--input", "default", "--train", "a.tsv", "--validation", "b.tsv"], "exclude each other"),
    (["--input", "default", "--train-vocab", "500"], "--train-vocab"),
    (["--input", "default", "--max-seq-length", "4"], "--max-seq-length must be >= 5"),
])
def test_option_faults_are_one_line(argv, words, tmp_path, capsys):
    assert data_main(["prepare", "--task", "classification", "--output", str(tmp_path / "out")] + argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    assert not (tmp_path / "out").exists()


def test_task_options_are_refused_for_pretraining(tmp_path, capsys):
    assert data_main(["prepare", "--input", "default", "--train", "a.tsv", "--output", str(tmp_path / "o")]) == 2
    assert "--train is an option of a fine-tuning task" in capsys.readouterr().err


# -- the label rules, on small tables ---------------------------------------------------------------------------


def _table(tmp_path, name, content):
    return read_split(_write(tmp_path / name, content))


def test_class_names_are_sorted_as_run_glue_sorts_them(tmp_path):
    train = _table(tmp_path, "train.tsv", "sentence1\tlabel\na\tneutral\nb\tcontradiction\nc\tentailment\nd\tneutral\n")
    labels = infer_labels(train, "label")
    assert (labels.problem_type, labels.names) == ("single_label_classification",
                                                    ["contradiction", "entailment", "neutral"])
    encoded = encode_labels(train, "label", labels, "train")
    assert encoded.labels.tolist() == [2, 0, 1, 2] and encoded.counts == [1, 1, 2]


def test_integer_classes_are_kept_as_they_are(tmp_path):
    train = _table(tmp_path, "train.csv", "sentence1,label\na,2\nb,0\nc,1\nd,2\n")
    labels = infer_labels(train, "label")
    assert (labels.problem_type, labels.num_labels, labels.names) == ("single_label_classification", 3, None)
    assert encode_labels(train, "label", labels, "train").labels.tolist() == [2, 0, 1, 2]


def test_numbers_in_text_are_names_where_names_are_most(tmp_path):
    """A CSV column of names with a number among them is names (pandas reads it as strings)."""
    train = _table(tmp_path, "train.csv", "sentence1,label\na,cat\nb,dog\nc,7\n")
    labels = infer_labels(train, "label")
    assert labels.names == ["7", "cat", "dog"]


def test_floats_are_regression_and_lists_of_floats_have_l_targets(tmp_path):
    train = _table(tmp_path, "train.csv", "sentence1,label\na,1\nb,0.25\nc,3e-1\n")
    labels = infer_labels(train, "label")
    assert (labels.problem_type, labels.num_labels, labels.shape) == ("regression", 1, ())
    encoded = encode_labels(train, "label", labels, "train")
    assert encoded.labels.dtype == np.float32 and encoded.labels.tolist() == pytest.approx([1.0, 0.25, 0.3])
    train = _table(tmp_path, "vec.jsonl", _jsonl([{"sentence1": "a", "label": [1, 2.5]},
                                                  {"sentence1": "b", "label": [0.5, 0]}]))
    labels = infer_labels(train, "label")
    assert (labels.problem_type, labels.num_labels, labels.shape) == ("regression", 2, (2,))
    assert encode_labels(train, "label", labels, "train").labels.tolist() == [[1.0, 2.5], [0.5, 0.0]]


def test_lists_of_names_are_multi_hot_over_the_sorted_union(tmp_path):
    train = _table(tmp_path, "train.jsonl", _jsonl([{"sentence1": "a", "label": ["sports", "art"]},
                                                    {"sentence1": "b", "label": []},
                                                    {"sentence1": "c", "label": ["news"]}]))
    labels = infer_labels(train, "label")
    assert (labels.problem_type, labels.names) == ("multi_label_classification", ["art", "news", "sports"])
    encoded = encode_labels(train, "label", labels, "train")
    assert encoded.labels.tolist() == [[1, 0, 1], [0, 0, 0], [0, 1, 0]] and encoded.counts == [1, 1, 1]
    csv_train = _table(tmp_path, "train.csv", 'sentence1,label\na,"[""x"", ""y""]"\nb,"[""y""]"\n')
    assert infer_labels(csv_train, "label").names == ["x", "y"]  # a JSON list in a CSV cell


def test_problem_type_forces_the_kind(tmp_path):
    train = _table(tmp_path, "train.csv", "sentence1,label\na,0\nb,1\nc,2\n")
    assert infer_labels(train, "label", "regression").problem_type == "regression"
    single = _table(tmp_path, "one.tsv", "sentence1\tlabel\na\tx\nb\ty\n")
    multi = infer_labels(single, "label", "multi_label_classification")
    assert (multi.names, encode_labels(single, "label", multi, "train").labels.tolist()) == (["x", "y"],
                                                                                             [[1, 0], [0, 1]])


def test_a_test_split_without_labels(tmp_path):
    train = _table(tmp_path, "train.tsv", GOOD_TSV)
    labels = infer_labels(train, "label")
    no_column = _table(tmp_path, "test.tsv", "sentence1\nthe task\nthe case\n")
    encoded = encode_labels(no_column, "label", labels, "test")
    assert not encoded.has_labels and encoded.labels.tolist() == [IGNORE_INDEX] * 2 and encoded.counts is None
    empty = _table(tmp_path, "test2.tsv", "sentence1\tlabel\nthe task\t\nthe case\t\n")
    assert not encode_labels(empty, "label", labels, "test").has_labels
    with pytest.raises(DataError, match="validation split needs labels"):
        encode_labels(no_column, "label", labels, "validation")


def test_run_glue_takes_the_first_two_non_label_columns_without_sentence1(tmp_path):
    table = _table(tmp_path, "t.tsv", "question\tlabel\tpassage\tidx\nq\tyes\tp\t0\n")
    assert text_columns(table, None, None, "label") == ["question", "passage"]
    table = _table(tmp_path, "u.tsv", "label\ttext\nyes\tp\n")
    assert text_columns(table, None, None, "label") == ["text"]
    table = _table(tmp_path, "v.tsv", "sentence1\tsentence2\tlabel\na\tb\tyes\n")
    assert text_columns(table, None, None, "label") == ["sentence1", "sentence2"]
    assert text_columns(table, "sentence2", None, "label") == ["sentence2"]


def test_integer_classes_that_are_not_0_to_l_are_mapped_in_sorted_order(tmp_path):
    """run_glue.py's label_list: the distinct integers sorted; 0 and 2 are two classes, not three."""
    train = _table(tmp_path, "train.csv", "sentence1,label\na,2\nb,0\nc,2\n")
    labels = infer_labels(train, "label")
    assert (labels.num_labels, labels.names) == (2, ["0", "2"])
    assert encode_labels(train, "label", labels, "train").labels.tolist() == [1, 0, 1]
    dev = _table(tmp_path, "dev.csv", "sentence1,label\na,1\n")
    with pytest.raises(DataError, match=r"dev.csv:2: column 'label': class 1 is not one of the train split's "
                                        r"classes \('0', '2'\)"):
        encode_labels(dev, "label", labels, "validation")


# (header, the text columns read): run_glue.py's task_to_keys for each GLUE task's columns, an id/idx column never
# a text, and run_glue's first-two rule otherwise
COLUMNS = [
    ("id\ttext", ["text"]),
    ("ID\ttext", ["text"]),
    ("sentence\tlabel\tidx", ["sentence"]),  # SST-2, CoLA
    ("idx\tsentence\tlabel", ["sentence"]),
    ("premise\thypothesis\tlabel\tidx", ["premise", "hypothesis"]),  # MNLI
    ("hypothesis\tpremise\tlabel\tidx", ["premise", "hypothesis"]),
    ("question1\tquestion2\tlabel\tidx", ["question1", "question2"]),  # QQP
    ("question\tsentence\tlabel\tidx", ["question", "sentence"]),  # QNLI
    ("sentence\tquestion\tlabel\tidx", ["question", "sentence"]),
    ("idx\tsentence1\tsentence2\tlabel", ["sentence1", "sentence2"]),  # MRPC, STS-B, RTE, WNLI
    ("label\tsentence", ["sentence"]),
    ("id\tquery\tdocument\tlabel", ["query", "document"]),
]


@pytest.mark.parametrize("header, expected", COLUMNS, ids=[c[0].replace("\t", ",") for c in COLUMNS])
def test_text_columns_follow_run_glues_task_keys_and_never_take_an_id(header, expected, tmp_path):
    row = "\t".join("1" if name.lower() in ("id", "idx", "label") else "some text" for name in header.split("\t"))
    table = _table(tmp_path, "t.tsv", header + "\n" + row + "\n")
    assert text_columns(table, None, None, "label") == expected


def test_only_id_columns_are_no_text(tmp_path):
    table = _table(tmp_path, "t.tsv", "idx\tlabel\n1\tx\n")
    with pytest.raises(DataError, match=r"t.tsv:1: no text column \(columns: idx, label; the label column is "
                                        r"'label', and id/idx columns number the rows\)"):
        text_columns(table, None, None, "label")


def test_prepare_says_which_columns_it_read(tokenizer, tmp_path, capsys):
    train = "sentence\tlabel\tidx\nthe loop\ta\t0\nthe mail\tb\t1\n"
    _write(tmp_path / "train.tsv", train)
    _write(tmp_path / "dev.tsv", train)
    assert data_main(["prepare", "--task", "classification", "--train", str(tmp_path / "train.tsv"), "--validation",
                      str(tmp_path / "dev.tsv"), "--tokenizer", tokenizer, "--output", str(tmp_path / "task"),
                      "--max-seq-length", "16", "--workers", "1", "--quiet"]) == 0
    assert "  columns: text 'sentence', pair none, label 'label'" in capsys.readouterr().out.splitlines()
