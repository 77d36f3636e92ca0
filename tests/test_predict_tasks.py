"""Serving every task the registry serves (python -m ipu_packing.predict on a model directory of the task; the
task's predictor hook: the classifier's Predictor, question answering's QuestionAnswerer), each task given by its
Case (a tiny model directory of the task, its inputs and input file, its own bad inputs). For each task: the command
writes one JSON line per input, in input order, the records the task's predictor gives those inputs, each input's
own whatever its place; a bad option or input, an input file without rows (naming it) and a model whose weights
hold NaN (naming the weight) are exactly one line ``error: <cause>`` on stderr, exit status 2 and no output file;
scores that are not finite numbers are one such line too, the last on stderr, and no output file; a forward pass
takes predict.packs_per_call's packs unless --batch-packs (``batch_packs``) says otherwise. A task the registry
serves without a Case here fails a test. Each task's own checks (the pipeline's scores, run_qa.py's answers, windows
and packs) are in test_predict.py and test_predict_qa.py."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np
import pytest
import torch

from app_fixtures import CLASSIFIER_WORDS as WORDS, hf_classifier, hf_question_answering
from ipu_packing import tasks
from ipu_packing.predict import main, model_architecture, packs_per_call

pytestmark = pytest.mark.usefixtures("one_thread")


def sentence(rng, low=3, high=30):
    return " ".join(rng.choice(WORDS, size=int(rng.integers(low, high))))


def questions(rng, n):
    """n (id, question, context) of the vocabulary's words, the ids out of order."""
    return [("q%02d" % i, sentence(rng, 2, 8), sentence(rng, 5, 60)) for i in rng.permutation(n)]


def questions_jsonl(examples):
    return "".join(json.dumps({"id": i, "question": q, "context": c}) + "\n" for i, q, c in examples)


def squad_json(articles):
    return json.dumps({"version": "1.1", "data": articles})


@dataclass(frozen=True)
class Case:
    """One served task: its tiny model, its inputs, and what its output and its refusals say."""

    make: Callable[[str], str]
    """Saves the task's tiny model (random weights, 128 positions, its tokenizer) at a path; returns it."""
    options: Tuple[str, ...]
    """The command's options the tiny model is served with (``from_pretrained``'s keywords, spelled as options)."""
    inputs: Callable[[Any, int], List[Any]]
    """(rng, n) -> n inputs, as the task's predictor's ``predict`` takes them."""
    text: Callable[[Sequence[Any]], str]
    """Inputs -> the text of an input file of them."""
    suffix: str
    """The input file's suffix."""
    key: str
    """The output record's field that names its input."""
    keys: Callable[[Sequence[Any]], List[Any]]
    """Inputs -> the key of each one's record, in input order."""
    one: Any
    """A valid input (the bad options' file holds it)."""
    bad: Tuple[Tuple[str, str, Tuple[str, ...], str], ...]
    """(id, input file text, options, words of the error) of the task's own bad inputs."""
    empty: Dict[str, Tuple[str, str]]
    """{id: (file name, text)}: input files without rows."""
    head: str
    """A weight of the task's head (refused by name when it holds NaN)."""
    what: str
    """What the refusal of scores that are not finite numbers counts."""

    def settings(self) -> Dict[str, int]:
        """``options`` as the predictor's from_pretrained keywords."""
        return {self.options[i][2:].replace("-", "_"): int(self.options[i + 1]) for i in range(0, len(self.options), 2)}


GOOD_QUESTION = ("a", "why?", "because.")

CASES = {
    "classification": Case(
        make=lambda directory: hf_classifier(directory, 3, "single_label_classification"),
        options=("--max-seq-length", "64"),
        inputs=lambda rng, n: [sentence(rng) for _ in range(n)],
        text=lambda texts: "sentence1\tlabel\n" + "".join("%s\tx\n" % x for x in texts),
        suffix=".tsv", key="index", keys=lambda texts: list(range(len(texts))), one="the loop runs",
        bad=(("no such column", "sentence1\nthe loop runs\n", ("--sentence1-key", "nope"), "no column 'nope'"),),
        empty={"header": ("inputs.tsv", "sentence1\n"), "header-and-label": ("inputs.tsv", "sentence1\tlabel\n"),
               "empty": ("inputs.tsv", "")},
        head="classifier.weight", what="input"),
    "question_answering": Case(
        make=hf_question_answering,
        options=("--max-seq-length", "64", "--doc-stride", "16", "--max-query-length", "32"),
        inputs=questions, text=questions_jsonl,
        suffix=".jsonl", key="id", keys=lambda examples: [e[0] for e in examples], one=GOOD_QUESTION,
        bad=(("no context column", '{"id": "a", "question": "why?"}\n', (), "no column 'context'"),
             ("an empty question", '{"id": "a", "question": " ", "context": "because."}\n', (), "'question' should be"),
             ("an id twice", questions_jsonl([GOOD_QUESTION] * 2), (), "appears twice"),
             ("a stride leaving no context", questions_jsonl([GOOD_QUESTION]), ("--doc-stride", "200"),
              "--doc-stride 200 must be less than")),
        empty={"empty": ("questions.jsonl", ""), "blank lines": ("questions.jsonl", "\n\n"),
               "SQuAD without articles": ("squad.json", squad_json([])),
               "SQuAD without questions": ("squad.json", squad_json([{"title": "t", "paragraphs": [
                   {"context": "because.", "qas": []}]}]))},
        head="qa_outputs.weight", what="question"),
}
SERVED = [t.name for t in tasks.TASKS.values() if t.has_hook("predictor")]


def test_every_served_task_of_the_registry_has_a_case():
    assert sorted(CASES) == sorted(SERVED)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """name -> that task's tiny model directory, saved once a module on first use. Never written to: a test that
    changes one copies it first."""
    made: Dict[str, str] = {}

    def get(name):
        if name not in made:
            made[name] = CASES[name].make(str(tmp_path_factory.mktemp(name) / "model"))
        return made[name]

    return get


def command(directory, source, out, *options):
    """The command's argv on ``source``: the case's options, then ``options`` (a later option replaces one)."""
    given = {"--model": directory, "--input": source, "--output": out}
    for i in range(0, len(options), 2):
        given[options[i]] = options[i + 1]
    return [x for pair in given.items() for x in pair]


def on_each_model(monkeypatch, served, attach):
    """``attach(model)`` on the model of every predictor ``served.from_pretrained`` makes (the command's too)."""
    make = served.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        predictor = make(cls, *args, **kwargs)
        attach(predictor.model)
        return predictor

    monkeypatch.setattr(served, "from_pretrained", classmethod(from_pretrained))


def refused(err, words, out):
    """One line on stderr, "error: " and ``words`` in it, exit status 2 already checked; no output file."""
    assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err
    assert not os.path.exists(out)


def same(a, b):
    """Two records (or values) alike but for float rounding (1e-6)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return sorted(a) == sorted(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-6
    return a == b


@pytest.mark.parametrize("name", SERVED)
def test_the_command_writes_one_line_per_input_in_input_order(name, model_dir, tmp_path, capsys):
    """Each input's record, in input order: what the task's predictor gives the same inputs in that order, and the
    input's own whatever its place (the inputs reversed give the records reversed)."""
    case, directory = CASES[name], model_dir(name)
    served = tasks.get(name).hook("predictor")
    assert tasks.served(model_architecture(directory)).name == name  # the command serves the case's model as its task
    inputs = case.inputs(np.random.default_rng(3), 25)
    got = []
    for i, order in enumerate((inputs, inputs[::-1])):
        source, out = str(tmp_path / ("inputs%d%s" % (i, case.suffix))), str(tmp_path / ("out%d.jsonl" % i))
        with open(source, "w") as f:
            f.write(case.text(order))
        assert main(command(directory, source, out, *case.options)) == 0
        err = capsys.readouterr()[1]
        assert "25 " in err.splitlines()[-1] and err.splitlines()[-1].endswith("-> %s" % out), err
        lines = [json.loads(line) for line in open(out)]
        assert [r[case.key] for r in lines] == case.keys(order)
        got.append(lines)
    expected = served.from_pretrained(directory, **case.settings()).predict(inputs)
    assert got[0] == json.loads(json.dumps(expected))
    for a, b in zip(got[0], got[1][::-1]):
        a, b = dict(a), dict(b)
        if case.key == "index":  # an input's place
            a.pop("index"), b.pop("index")
        assert same(a, b), (a, b)


COMMON = [
    ("no model", ("--model", "missing-dir"), "is not a directory"),
    ("K", ("--max-sequences-per-pack", "0"), "--max-sequences-per-pack must be in [1, 255]"),
    ("S", ("--max-seq-length", "1000"), "exceeds the model's max_position_embeddings"),
    ("no input", ("--input", "nowhere"), "nowhere"),  # the case's suffix added to both
    ("batch 0", ("--batch-packs", "0"), "--batch-packs must be a positive integer, got 0"),
    ("batch -1", ("--batch-packs", "-1"), "--batch-packs must be a positive integer, got -1"),
    ("S -5", ("--max-seq-length", "-5"), "--max-seq-length must be a positive integer, got -5"),
    ("S 0", ("--max-seq-length", "0"), "--max-seq-length must be a positive integer, got 0"),
    ("S 2", ("--max-seq-length", "2"), "--max-seq-length must be at least 3"),
]
"""(id, options, words of the error) of the bad options every task refuses, on a valid input file."""


def bad_inputs():
    """(test id, (task, input file text, options, words of the error)): the common bad options on the case's valid
    input, then the task's own bad inputs."""
    out = []
    for name in (n for n in SERVED if n in CASES):  # a task without a case fails the registry's test
        case = CASES[name]
        valid = case.text([case.one])
        for label, args, words in COMMON:
            if args[0] == "--input":
                args, words = (args[0], args[1] + case.suffix), words + case.suffix
            out.append(("%s-%s" % (name, label), (name, valid, args, words)))
        out += [("%s-%s" % (name, label), (name, text, args, words)) for label, text, args, words in case.bad]
    return out


@pytest.mark.parametrize("name, text, args, words", [v for _, v in bad_inputs()], ids=[i for i, _ in bad_inputs()])
def test_a_bad_option_or_input_is_one_line(name, text, args, words, model_dir, tmp_path, capsys):
    case = CASES[name]
    source, out = str(tmp_path / ("inputs" + case.suffix)), str(tmp_path / "out.jsonl")
    with open(source, "w") as f:
        f.write(text)
    assert main(command(model_dir(name), source, out, *case.options, *args)) == 2
    refused(capsys.readouterr()[1], words, out)


def empty_inputs():
    return [("%s-%s" % (name, label), (name, file_name, text)) for name in SERVED if name in CASES
            for label, (file_name, text) in CASES[name].empty.items()]


@pytest.mark.parametrize("name, file_name, text", [v for _, v in empty_inputs()], ids=[i for i, _ in empty_inputs()])
def test_an_input_without_rows_is_one_line_naming_it(name, file_name, text, model_dir, tmp_path, capsys):
    case = CASES[name]
    source, out = tmp_path / file_name, str(tmp_path / "out.jsonl")
    source.write_text(text)
    assert main(command(model_dir(name), str(source), out, *case.options)) == 2
    err = capsys.readouterr()[1]
    refused(err, "", out)
    assert err.startswith("error: %s" % source), err


@pytest.mark.parametrize("name", SERVED)
def test_a_model_whose_weights_hold_nan_is_refused_and_nothing_written(name, model_dir, tmp_path, capsys):
    """NaN weights give NaN scores, which JSON cannot hold: one line naming a weight, no output file."""
    from safetensors.torch import load_file, save_file

    case = CASES[name]
    directory = str(tmp_path / "model")
    shutil.copytree(model_dir(name), directory)
    weights = os.path.join(directory, "model.safetensors")
    state = load_file(weights)
    state[case.head] = torch.full_like(state[case.head], float("nan"))
    save_file(state, weights, metadata={"format": "pt"})
    source, out = str(tmp_path / ("inputs" + case.suffix)), str(tmp_path / "out.jsonl")
    with open(source, "w") as f:
        f.write(case.text([case.one]))
    assert main(command(directory, source, out, *case.options)) == 2
    err = capsys.readouterr()[1]
    refused(err, "", out)
    assert err.startswith("error: --model %s: 1 weights hold inf or NaN (first: %s)" % (directory, case.head)), err


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("name", SERVED)
def test_scores_that_are_not_finite_are_refused_and_nothing_written(name, value, model_dir, tmp_path, capsys,
                                                                    monkeypatch, recwarn):
    """A model whose logits are NaN or infinite (finite weights that overflow, say): one error line naming the first
    input, the last line on stderr and the only one that says anything is wrong (no numpy warning before it), and no
    output file."""
    case = CASES[name]
    served = tasks.get(name).hook("predictor")

    def nan_logits(module, args, kwargs, output):
        for field in output._fields:
            if field.endswith("logits"):
                getattr(output, field).fill_(float(value))

    on_each_model(monkeypatch, served, lambda model: model.register_forward_hook(nan_logits, with_kwargs=True))
    inputs = case.inputs(np.random.default_rng(4), 3)
    source, out = str(tmp_path / ("inputs" + case.suffix)), str(tmp_path / "out.jsonl")
    with open(source, "w") as f:
        f.write(case.text(inputs))
    assert main(command(model_dir(name), source, out, *case.options)) == 2
    lines = capsys.readouterr()[1].splitlines()
    assert lines[-1] == ("error: the model's scores of 3 %ss are not finite numbers (first: %s 0): nothing was written"
                         % (case.what, case.what)), lines
    assert sum(line.startswith("error: ") for line in lines) == 1 and not os.path.exists(out)
    assert not [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)]  # numpy's, on stderr


@pytest.mark.parametrize("name", SERVED)
def test_scores_that_are_not_finite_are_refused(name):
    from ipu_packing.errors import UserError
    from ipu_packing.predict import check_finite_scores

    what = CASES[name].what
    check_finite_scores(np.array([[0.5, 0.5], [1.0, 0.0]]), what)
    with pytest.raises(UserError, match=r"scores of 2 %ss are not finite numbers \(first: %s 1\)" % (what, what)):
        check_finite_scores(np.array([[0.5, 0.5], [np.nan, 0.5], [0.1, np.inf]]), what)


def test_packs_per_call_follows_the_models_sizes_on_cpu():
    """predict.packs_per_call: a call's feed-forward activation within 1 MiB, or within one layer's weights where
    those are larger (the measurements behind it: predict.SERVING_CALL_BYTES); 64 on CUDA."""
    import transformers

    sizes = {"demo": (64, 256), "tiny": (128, 512), "small": (256, 1024), "base": (768, 3072), "large": (1024, 4096)}
    got = {name: packs_per_call(transformers.BertConfig(hidden_size=h, intermediate_size=ff), 128, "cpu")
           for name, (h, ff) in sizes.items()}
    assert got == {"demo": 8, "tiny": 4, "small": 6, "base": 18, "large": 24}
    base = transformers.BertConfig(hidden_size=768, intermediate_size=3072)
    assert packs_per_call(base, 384, "cpu") == 6 and packs_per_call(base, 128, "cuda") == 64


@pytest.mark.parametrize("name", SERVED)
def test_serving_takes_packs_per_call_packs_a_call_unless_given(name, model_dir, tmp_path, capsys, monkeypatch):
    """The predictor's batch_packs is packs_per_call's for its model at S on the CPU, or the one given; the command's
    forward passes take that many packs each (the last one fewer), or --batch-packs."""
    import transformers

    case, directory = CASES[name], model_dir(name)
    served = tasks.get(name).hook("predictor")
    settings = dict(case.settings(), max_seq_length=128)
    default = packs_per_call(transformers.BertConfig.from_pretrained(directory), 128, "cpu")
    assert default != served.batch_packs  # the class's own default: the check below tells them apart
    assert served.from_pretrained(directory, **settings).batch_packs == default
    assert served.from_pretrained(directory, batch_packs=3, **settings).batch_packs == 3
    calls: List[int] = []
    on_each_model(monkeypatch, served, lambda model: model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(int(kwargs["input_ids"].shape[0])), with_kwargs=True))
    source = str(tmp_path / ("inputs" + case.suffix))
    with open(source, "w") as f:
        f.write(case.text(case.inputs(np.random.default_rng(5), 70)))
    options = case.options + ("--max-seq-length", "128", "--max-sequences-per-pack", "1")  # a pack per sequence
    for given, out in ((None, "out.jsonl"), (16, "given.jsonl")):
        calls.clear()
        extra = () if given is None else ("--batch-packs", str(given))
        assert main(command(directory, source, str(tmp_path / out), *options, *extra)) == 0, capsys.readouterr()[1]
        per_call, packs = given or default, sum(calls)
        assert packs >= 70 and calls == [per_call] * (packs // per_call) + [packs % per_call] * (packs % per_call > 0)
        assert len(calls) > 1
