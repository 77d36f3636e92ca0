"""`prepare --task question_answering`: the embedded demo task (reproducible, its questions answerable by matching,
prepared through `--input default`), the same bytes with one or two workers (windows numbered over chunks), the
invariants of a question-answering pack checked wherever it is opened and by the writer, the examples file
checksummed, and bad input refused in one line with nothing written."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil

import numpy as np
import pytest

from app_fixtures import line_breaks_in_contexts, qa_test_demo, rewrite_examples
from ipu_packing.data import open_dataset
from ipu_packing.data.cli import main as data_main
from ipu_packing.data.format import IGNORE_INDEX, SPECIAL_TOKENS
from ipu_packing.errors import DataError
from ipu_packing.fsutil import sha256_file

DEMO_ARGS = ["--task", "question_answering", "--input", "default", "--max-seq-length", "128", "--doc-stride", "32",
             "--max-query-length", "48", "--max-sequences-per-pack", "4", "--quiet"]


def _prepare(output, *extra):
    """The demo at its tests' size (app_fixtures.qa_test_demo: 3000 train questions, passages of 15 to 40 words)."""
    with contextlib.redirect_stdout(io.StringIO()) as out, qa_test_demo():
        code = data_main(["prepare", "--output", output] + DEMO_ARGS + list(extra))
    return code, out.getvalue()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("qa") / "demo")
    code, printed = _prepare(out, "--workers", "1")
    assert code == 0
    return out, printed


def test_the_demo_task_is_reproducible_and_answerable_by_matching():
    from ipu_packing.data.finetune.qa_demo import BLANK, TRAIN_QUESTIONS, VALIDATION_QUESTIONS, align, demo_questions

    first, second = demo_questions(), demo_questions()
    assert first == second
    assert {name: len(rows) for name, rows in first.items()} == {"train": 20000, "validation": 300}
    assert (TRAIN_QUESTIONS, VALIDATION_QUESTIONS) == (20000, 300)
    for rows in first.values():
        for q in rows:
            assert q["question"].count(BLANK) == 1 and q["answer"] not in q["question"].split()
            assert q["context"][q["answer_start"]:q["answer_start"] + len(q["answer"])] == q["answer"]
            assert align(q["question"], q["context"]) == q["answer"]
    contexts = {name: {q["context"] for q in rows} for name, rows in first.items()}
    assert not contexts["train"] & contexts["validation"]  # a passage is in one split only
    assert len({q["id"] for rows in first.values() for q in rows}) == 20300
    with qa_test_demo():  # the tests' size: 3000 train questions and the validation split, on longer passages
        small, again = demo_questions(), demo_questions()
    assert small == again and {name: len(rows) for name, rows in small.items()} == {"train": 3000, "validation": 300}
    for name, rows in small.items():
        for q in rows:
            assert align(q["question"], q["context"]) == q["answer"]
        words = [len(c.split()) for c in {q["context"] for q in rows}]
        assert 15 <= min(words) and max(words) <= 40 and max(words) > 24, name
    words = [len(q["context"].split()) for rows in first.values() for q in rows]
    assert 6 <= min(words) and max(words) <= 24


def test_the_demo_prepares_as_a_question_answering_task(demo):
    out, printed = demo
    assert "task question_answering; S = 128, K = 4, doc stride 32, max query length 48" in printed
    assert "train: 3000 questions" in printed and "validation: 300 questions" in printed
    for split, questions in (("train", 3000), ("validation", 300)):
        for kind in ("packed", "padded"):
            ds = open_dataset(os.path.join(out, split, kind), as_tensors=False)
            task = ds.manifest["task"]
            assert task["name"] == "question_answering" and task["num_examples"] == questions
            assert task["answered"] == questions and task["source"]["format"] == "squad"
            assert sorted(os.listdir(ds.directory)) == ["examples.jsonl", "manifest.json", "shard-00000.npy",
                                                        "vocab.txt"]
            features = np.concatenate([ds[i]["feature_ids"] for i in range(len(ds))])
            assert sorted(features[features >= 0].tolist()) == list(range(ds.manifest["num_sequences"]))
            examples = np.concatenate([ds[i]["example_ids"] for i in range(len(ds))])
            assert set(examples[examples >= 0].tolist()) == set(range(questions))  # every question has a window
    packed = open_dataset(os.path.join(out, "train", "packed"), as_tensors=False)
    assert packed.manifest["num_sequences"] > 3000 and packed.packing_factor > 1.0  # several windows, packed


def _digests(root):
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            found[os.path.relpath(os.path.join(directory, name), root)] = sha256_file(os.path.join(directory, name))
    return found


def test_the_same_bytes_with_one_or_two_workers(demo, tmp_path):
    """The train split's 3000 questions are two chunks (windows.CHUNK_QUESTIONS): the second chunk's windows are
    numbered after the first's whichever worker made them."""
    code, _ = _prepare(str(tmp_path / "two"), "--workers", "2")
    assert code == 0
    a, b = _digests(demo[0]), _digests(str(tmp_path / "two"))
    assert len(a) == 16 and a == b  # 2 splits x 2 kinds x (manifest, shard, vocab.txt, examples.jsonl)


# -- the invariants of a question-answering pack -----------------------------------------------------------------


def _recount(directory, packs):
    """Save `packs` as the directory's one shard and make the manifest's checksum and counts agree with them, so
    that only the packs' invariants can refuse them."""
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    path = os.path.join(directory, manifest["shards"][0]["file"])
    np.save(path, packs)
    manifest["shards"][0]["sha256"] = sha256_file(path)
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def _two(packs):
    """A pack of two or more windows, the first with its answer inside."""
    return int(np.flatnonzero(((packs["feature_ids"] != -1).sum(axis=1) >= 2)
                              & (packs["start_positions"][:, 0] != packs["cls_positions"][:, 0]))[0])


def offsets_on_a_question_token(packs):
    p = _two(packs)
    packs["offsets"][p, 1] = (0, 3)  # the first window's first question token
    return p, "'offsets' slot 1", "not a context token"


def offsets_missing_on_a_context_token(packs):
    p = _two(packs)
    t = int(packs["start_positions"][p, 0])
    packs["offsets"][p, t] = (-1, -1)
    return p, "'offsets' slot %d" % t, "a context token of sequence 1"


def offsets_backwards(packs):
    p = _two(packs)
    t = int(packs["start_positions"][p, 0])
    packs["offsets"][p, t] = (9, 4)
    return p, "'offsets' slot %d" % t, "end is before its start"


def answer_on_another_sequence(packs):
    p = _two(packs)
    packs["start_positions"][p, 0] = packs["cls_positions"][p, 1] + packs["token_type_ids"][p].tolist().index(1, int(
        packs["cls_positions"][p, 1])) - packs["cls_positions"][p, 1]  # the second window's first context token
    return p, "'start_positions' slot 0", "a token of sequence 2"


def answer_on_the_question(packs):
    p = _two(packs)
    packs["end_positions"][p, 0] = 2
    packs["start_positions"][p, 0] = 1
    return p, "'start_positions' slot 0 is 1", "question, [CLS] or [SEP]"


def answer_backwards(packs):
    p = _two(packs)
    start = int(packs["start_positions"][p, 0])
    packs["end_positions"][p, 0] = start - 1 if packs["offsets"][p, start - 1, 0] != -1 else start
    packs["start_positions"][p, 0] = start + 1
    return p, "'start_positions' slot 0", "after field 'end_positions'"


def answer_on_an_empty_slot(packs):
    p = int(np.flatnonzero((packs["feature_ids"] == -1).any(axis=1))[0])
    packs["start_positions"][p, -1] = 0
    return p, "'start_positions' slot 3", "used (0)"


def window_twice(packs):
    p = _two(packs)
    packs["feature_ids"][p, 1] = packs["feature_ids"][0, 0]
    return p, "'feature_ids'", "already used by pack 0 slot 0"


def question_past_the_split(packs):
    packs["example_ids"][2, 0] = 300
    return 2, "'example_ids'", "outside [0, 300)"


ROWS = [offsets_on_a_question_token, offsets_missing_on_a_context_token, offsets_backwards, answer_on_another_sequence,
        answer_on_the_question, answer_backwards, answer_on_an_empty_slot, window_twice, question_past_the_split]


@pytest.mark.parametrize("corrupt", ROWS, ids=[r.__name__ for r in ROWS])
def test_a_corrupt_question_answering_pack_is_refused_naming_the_pack_and_field(corrupt, demo, tmp_path, capsys):
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(demo[0], "validation", "packed"), directory)
    with open(os.path.join(directory, "manifest.json")) as f:
        shard = os.path.join(directory, json.load(f)["shards"][0]["file"])
    packs = np.load(shard)
    p, field, words = corrupt(packs)
    _recount(directory, packs)
    with pytest.raises(DataError) as info:
        open_dataset(directory)
    message = str(info.value)
    assert "\n" not in message and directory in message, message
    assert "pack %d" % p in message and "field %s" % field in message and words in message, message
    assert data_main(["inspect", directory]) == 2
    assert capsys.readouterr().err == "error: %s\n" % message


def test_a_changed_examples_file_is_refused(demo, tmp_path):
    from ipu_packing.data.finetune.questions import read_examples

    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(demo[0], "validation", "packed"), directory)
    assert len(read_examples(directory)) == 300
    with open(os.path.join(directory, "examples.jsonl"), "a") as f:
        f.write("\n")
    for call in (lambda: open_dataset(directory), lambda: read_examples(directory)):
        with pytest.raises(DataError, match="examples.jsonl: sha256 does not match manifest field 'task' entry"):
            call()
    os.remove(os.path.join(directory, "examples.jsonl"))
    with pytest.raises(DataError, match="examples.jsonl: missing"):
        open_dataset(directory)


def test_contexts_holding_line_separators_are_read_back_whole(demo, tmp_path, capsys):
    from ipu_packing.data.finetune.questions import read_examples

    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(demo[0], "validation", "packed"), directory)
    rewrite_examples(directory, line_breaks_in_contexts)
    examples = read_examples(directory)
    assert len(examples) == 300
    assert [ch in examples[i].context for i, ch in enumerate(["\u2028", "\u0085", "\u2029", "\x1c"])] == [True] * 4
    assert data_main(["inspect", directory]) == 0
    assert "every row checked" in capsys.readouterr().out


def _without(key, row_index=7):
    def edit(rows):
        del rows[row_index][key]
        return rows
    return edit


def _answers_as_a_list(rows):
    rows[3]["answers"] = [rows[3]["answers"]]
    return rows


def _answer_elsewhere(rows):
    rows[5]["answers"]["answer_start"] = [rows[5]["answers"]["answer_start"][0] + 1]
    return rows


def _answers_emptied(rows):
    rows[4]["answers"] = {"text": [], "answer_start": []}
    return rows


EXAMPLE_ROWS = [
    ("no-answers", _without("answers"), "examples.jsonl:8: has no 'answers'"),
    ("answers-emptied", _answers_emptied, "examples.jsonl:5: has no answer, but its split was prepared with one for "
     "every question"),
    ("no-context", _without("context"), "examples.jsonl:8: has no 'context'"),
    ("answers-a-list", _answers_as_a_list, "examples.jsonl:4: 'answers' should be"),
    ("answer-not-at-its-start", _answer_elsewhere, "examples.jsonl:6: answer"),
]


@pytest.mark.parametrize("name, edit, words", EXAMPLE_ROWS, ids=[r[0] for r in EXAMPLE_ROWS])
def test_inspect_checks_every_row_of_the_examples_file(name, edit, words, demo, tmp_path, capsys):
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(demo[0], "validation", "packed"), directory)
    rewrite_examples(directory, edit)
    assert data_main(["inspect", directory]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: %s" % os.path.join(directory, words)) and err.count("\n") == 1, err


def test_the_writer_refuses_a_question_answering_shard_that_breaks_an_invariant(tmp_path):
    """write_shard checks every pack it builds: an answer that points into the question."""
    from ipu_packing.data.format import FieldLayout
    from ipu_packing.data.instance_files import Instances
    from ipu_packing.data.write.packs import PackLayout, ShardTask, write_shard

    zeros = np.zeros(2, np.int32)
    ids = np.array([2, 7, 3, 8, 9, 3] * 2, dtype=np.int32)  # [CLS] q [SEP] c c [SEP], twice
    offsets = np.array([[-1, -1], [-1, -1], [-1, -1], [0, 2], [3, 5], [-1, -1]] * 2, dtype=np.int32)

    def instances(start):
        extra = {"start_positions": np.array([start, 0], np.int32), "end_positions": np.array([4, 0], np.int32),
                 "example_ids": np.array([0, 0], np.int32), "feature_ids": np.array([0, 1], np.int32)}
        return Instances(ids, np.array([6, 6], np.int32), np.array([3, 3], np.int32), zeros, zeros,
                         np.zeros(0, np.int32), np.zeros(0, np.int32), extra, {"offsets": offsets})

    layout = PackLayout(16, 3, 0, 64, cls_id=2, task=FieldLayout("question_answering", num_examples=1), num_sequences=2)
    path = str(tmp_path / "shard-00000.npy")
    write_shard(instances(3), ShardTask(path, np.array([0, 2]), 0), layout)
    packs = np.load(path)
    assert packs["start_positions"][0].tolist() == [3, 6, IGNORE_INDEX]  # the second window's [CLS], in the pack
    assert packs["offsets"][0, 9].tolist() == [0, 2] and packs["offsets"][0, 12].tolist() == [-1, -1]
    os.remove(path)
    with pytest.raises(DataError, match="pack 0: field 'start_positions' slot 0 is 1, sequence 1's question"):
        write_shard(instances(1), ShardTask(path, np.array([0, 2]), 0), layout)
    assert not os.path.exists(path)


# -- bad input: one line, nothing written ------------------------------------------------------------------------

CONTEXT = "the loop runs the task on the server"


def _row(qid="a", question="what runs?", context=CONTEXT, text="the loop", start=0):
    return {"id": qid, "question": question, "context": context, "answers": {"text": [text], "answer_start": [start]}}


def _jsonl(*rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


GOOD = _jsonl(_row(), _row("b", "where?", text="the server", start=CONTEXT.index("the server")))

# (id, {file: content}, extra options, words)
BAD = [
    ("validation-without-answer", {"train.jsonl": GOOD, "dev.jsonl": _jsonl(dict(_row(), answers={
        "text": [], "answer_start": []}))}, [], ["dev.jsonl", "question 'a' has no answer"]),
    ("answer-not-at-its-start", {"train.jsonl": _jsonl(_row(start=4)), "dev.jsonl": GOOD}, [],
     ["train.jsonl:1", "is not the context's text at its answer_start 4"]),
    ("id-twice", {"train.jsonl": _jsonl(_row(), _row()), "dev.jsonl": GOOD}, [],
     ["train.jsonl", "question id 'a' appears twice"]),
    ("no-answers-column", {"train.jsonl": _jsonl({"id": "a", "question": "q", "context": "c"}), "dev.jsonl": GOOD},
     [], ["no column 'answers'"]),
    ("empty-question", {"train.jsonl": _jsonl(_row(question="  ")), "dev.jsonl": GOOD}, [],
     ["train.jsonl:1", "'question' should be a non-empty text"]),
    ("texts-and-starts-differ", {"train.jsonl": _jsonl(dict(_row(), answers={"text": ["the loop"],
                                                                             "answer_start": [0, 4]})),
                                 "dev.jsonl": GOOD}, [], ["'answers' has 1 texts but 2 answer_start values"]),
    ("start-not-an-integer", {"train.jsonl": _jsonl(_row(start="0")), "dev.jsonl": GOOD}, [],
     ["answer_start should be an integer"]),
    ("squad-without-paragraphs", {"train.json": json.dumps({"data": [{"title": "x"}]}), "dev.jsonl": GOOD}, [],
     ["train.json: article 0", "'paragraphs'"]),
    ("squad-answer-elsewhere", {"train.json": json.dumps({"data": [{"paragraphs": [{"context": CONTEXT, "qas": [
        {"id": "q1", "question": "what?", "answers": [{"text": "server", "answer_start": 0}]}]}]}]}),
        "dev.jsonl": GOOD}, [], ["train.json: question 'q1' (article 0 paragraph 0)", "'server'"]),
    ("csv", {"train.csv": "id,question\n", "dev.jsonl": GOOD}, [], ["train.csv", "not CSV"]),
    ("bad-json-line", {"train.jsonl": GOOD + "{oops\n", "dev.jsonl": GOOD}, [], ["train.jsonl:3", "not valid JSON"]),
    ("stride-too-long", {"train.jsonl": GOOD, "dev.jsonl": GOOD}, ["--doc-stride", "13"],
     ["--doc-stride 13 must be less than --max-seq-length 32 - --max-query-length 16 - 3 = 13"]),
    ("classification-option", {"train.jsonl": GOOD, "dev.jsonl": GOOD}, ["--sentence1-key", "question"],
     ["--sentence1-key is an option of --task classification"]),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    words = ["the", "loop", "runs", "task", "on", "server", "what", "where", "?"]
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in list(SPECIAL_TOKENS) + words), encoding="utf-8")
    return str(directory)


@pytest.mark.parametrize("name, files, options, words", BAD, ids=[r[0] for r in BAD])
def test_bad_input_is_one_line_exit_2_and_nothing_written(name, files, options, words, tokenizer, tmp_path, capsys):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for file_name, content in files.items():
        (inputs / file_name).write_text(content, encoding="utf-8")
    train = next(n for n in files if n.startswith("train"))
    dev = next(n for n in files if n.startswith("dev"))
    output = tmp_path / "out" / "task"
    argv = ["prepare", "--task", "question_answering", "--train", str(inputs / train), "--validation",
            str(inputs / dev), "--tokenizer", tokenizer, "--output", str(output), "--max-seq-length", "32",
            "--doc-stride", "4", "--max-query-length", "16", "--workers", "1", "--quiet"] + options
    assert data_main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("error: "), captured.err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not (tmp_path / "out").exists()


def test_the_good_files_of_the_table_are_prepared(tokenizer, tmp_path):
    for name in ("train.jsonl", "dev.jsonl"):
        (tmp_path / name).write_text(GOOD, encoding="utf-8")
    output = str(tmp_path / "task")
    assert data_main(["prepare", "--task", "question_answering", "--train", str(tmp_path / "train.jsonl"),
                      "--validation", str(tmp_path / "dev.jsonl"), "--tokenizer", tokenizer, "--output", output,
                      "--max-seq-length", "32", "--doc-stride", "4", "--max-query-length", "16", "--workers", "1",
                      "--quiet"]) == 0
    ds = open_dataset(os.path.join(output, "validation", "packed"))
    assert ds.manifest["task"]["source"]["format"] == "jsonl" and ds.manifest["num_sequences"] == 2
    assert hashlib.sha256(open(os.path.join(output, "validation", "packed", "examples.jsonl"), "rb").read()
                          ).hexdigest() == ds.manifest["task"]["examples_sha256"]


@pytest.mark.parametrize("argv, words", [
    (["--task", "classification", "--input", "default", "--doc-stride", "8"],
     "--doc-stride is an option of --task question_answering"),
    (["--input", "default", "--max-query-length", "8"], "--max-query-length is an option of --task question_answering"),
    (["--task", "question_answering", "--input", "default", "--max-query-length", "0"],
     "--max-query-length must be >= 1"),
])
def test_option_faults_are_one_line(argv, words, tmp_path, capsys):
    assert data_main(["prepare", "--output", str(tmp_path / "out")] + argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    assert not (tmp_path / "out").exists()


def test_guess_levels_count_what_a_guess_can_pick():
    from ipu_packing.data.finetune.qa_demo import guess_levels

    questions = [
        # content words of the passage: Parse, header, fields, strictly (4); not in the question: header
        {"context": "Parse the header fields strictly.", "question": "Parse the ___ fields strictly.",
         "answer": "header"},
        # content words: Return, value, cache (3), none absent from the question but the answer
        {"context": "Return the value from a cache.", "question": "Return the value from a ___.", "answer": "cache"},
    ]
    anywhere, absent = guess_levels(questions)
    assert anywhere == pytest.approx((100 / 4 + 100 / 3) / 2)
    assert absent == pytest.approx(100.0)
