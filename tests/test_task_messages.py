"""Messages that name what fits the task: a fine-tuning config pointed at missing data suggests the fine-tuning
`prepare --task` command (with the config's directory, S, K and the model's tokenizer), not pretraining's;
question-answering predict ignores the answers of the questions it answers (a wrong answer_start is no fault of
its input); the TensorBoard note names the package and the extra that installs it."""

from __future__ import annotations

import json
import re
import sys

import pytest

import app_fixtures as fx
from ipu_packing.data.finetune.questions import read_questions
from ipu_packing.errors import DataError
from ipu_packing.train.cli import finetune_main, main as pretrain_main

# (script, config, the command the refusal suggests)
MISSING = [
    (finetune_main, "finetune_demo", "prepare it with: python -m ipu_packing.data prepare --task classification "
     "--train FILE --validation FILE --tokenizer output/runs/demo/final --output {} --max-seq-length 128 "
     "--max-sequences-per-pack 8)"),
    (finetune_main, "finetune_qa_demo", "prepare it with: python -m ipu_packing.data prepare --task "
     "question_answering --train FILE --validation FILE --tokenizer output/runs/demo/final --output {} "
     "--max-seq-length 128 --doc-stride 30 --max-sequences-per-pack 4)"),
    (pretrain_main, "demo", "prepare it with: python -m ipu_packing.data prepare --input default --output DIR "
     "--max-seq-length S --max-sequences-per-pack K)"),
]


@pytest.mark.parametrize("script, name, words", MISSING, ids=[m[1] for m in MISSING])
def test_missing_data_suggests_the_prepare_command_of_the_task(script, name, words, tmp_path):
    missing = str(tmp_path / "nowhere")
    code, out, err = fx.captured(script, ["--config", name, "data.dir=%s" % missing,
                                          "checkpoint.output_dir=%s" % str(tmp_path / "run")])
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: dataset not found: "), err
    assert words.format(missing) in err, err


@pytest.mark.parametrize("S, stride", [(384, 128), (256, 128), (196, 128), (195, 64), (128, 30), (72, 2)])
def test_the_suggested_doc_stride_fits_the_windows_of_S(S, stride):
    """run_qa.py's 128 where a window beside the longest question (64 tokens) leaves room for it, else half that
    room: what prepare then accepts (at S=128 the old suggestion, 128, is refused)."""
    from ipu_packing.data.finetune.windows import MAX_QUERY_LENGTH, check_window_settings, hint_options

    assert hint_options(S) == " --doc-stride %d" % stride
    check_window_settings(S, stride, MAX_QUERY_LENGTH)
    if stride < 128:
        with pytest.raises(DataError, match="--doc-stride 128 must be less than"):
            check_window_settings(S, 128, MAX_QUERY_LENGTH)


def _questions(path, squad):
    context = "The loop runs the task."
    if squad:
        value = {"data": [{"paragraphs": [{"context": context, "qas": [
            {"id": "q1", "question": "What runs?", "answers": [{"text": "loop", "answer_start": 0}]}]}]}]}
        path.write_text(json.dumps(value))
    else:
        path.write_text(json.dumps({"id": "q1", "question": "What runs?", "context": context,
                                    "answers": {"text": ["loop"], "answer_start": [0]}}) + "\n")
    return str(path)


@pytest.mark.parametrize("squad", [False, True], ids=["json-lines", "squad-json"])
def test_questions_to_answer_ignore_their_answers(tmp_path, squad):
    """A wrong answer_start (0, where 'loop' starts at 4) is refused in a split that trains or evaluates, and
    ignored in questions to answer (predict)."""
    path = _questions(tmp_path / ("q.json" if squad else "q.jsonl"), squad)
    with pytest.raises(DataError, match="answer 'loop' is not the context's text at its answer_start 0"):
        read_questions(path, "validation", True)
    (example,) = read_questions(path, "input", False, answers_column=False).examples
    assert (example.id, example.question, example.context, example.answer_texts) == (
        "q1", "What runs?", "The loop runs the task.", ())


# (id, what `import tensorboard` finds, the note as a regular expression)
TENSORBOARDS = [
    ("not-installed", None, re.escape(
        "note: TensorBoard logging off (logging.tensorboard needs tensorboard, which is not installed (importing "
        "torch.utils.tensorboard): pip install 'ipu-packing[tensorboard]'; or set logging.tensorboard=false)")),
    ("too-old", "1.0", re.escape("note: TensorBoard logging off (logging.tensorboard: importing "
                                 "torch.utils.tensorboard failed (") + "[^()]*TensorBoard version 1.15[^()]*"
     + re.escape("): pip install 'ipu-packing[tensorboard]'; or set logging.tensorboard=false)")),
]


@pytest.mark.parametrize("version, note", [t[1:] for t in TENSORBOARDS], ids=[t[0] for t in TENSORBOARDS])
def test_the_tensorboard_note_names_the_package_and_the_extra(tmp_path, monkeypatch, version, note):
    """The note names what failed: a package that is absent, or one that is there and whose import fails (torch
    refuses a tensorboard older than 1.15 with an ImportError that names no module: torch itself is installed)."""
    import types

    from ipu_packing.train.metrics import MetricsLogger
    from ipu_packing.train.sections import LoggingConfig

    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    old = types.ModuleType("tensorboard")
    old.__version__ = version
    monkeypatch.setitem(sys.modules, "tensorboard", None if version is None else old)  # None: not installed
    lines = []
    MetricsLogger(str(tmp_path / "m.jsonl"), str(tmp_path / "tb"), 1, 0,
                  LoggingConfig(progress_bar=False, tensorboard=True), log=lines.append)
    assert len(lines) == 1 and re.fullmatch(note, lines[0]), lines
