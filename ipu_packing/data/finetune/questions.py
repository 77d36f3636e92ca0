"""Question-answering examples: a split's SQuAD v1.1 JSON or run_qa.py's columns -> checked `QAExample` rows; and
the examples file beside the packs, whose one writer and one reader are here (`write_examples`, `read_examples`).

Inputs (`read_questions`), by the file's content and name:

    SQuAD JSON      a .json file holding one object {"data": [{"title", "paragraphs": [{"context", "qas": [{"id",
                    "question", "answers": [{"text", "answer_start"}]}]}]}]} (SQuAD v1.1's train-v1.1.json and
                    dev-v1.1.json): every question in file order (article, paragraph, question)
    JSON Lines      a .jsonl file, or a .json file that is not one such object: one object a line with "id",
                    "question", "context" and "answers" = {"text": [...], "answer_start": [...]}, the columns
                    transformers' run_qa.py reads (Hugging Face datasets' squad, saved with to_json)
    .parquet, a datasets directory  the same columns (the `datasets` extra), read by data/finetune/rows.py

Every example is checked before a token is made, each refusal one line naming the file and the line (JSON Lines),
row (Parquet, datasets) or question id (SQuAD JSON): a question or context that is not text or is empty, an id
that is not text or a number or appears twice, answers whose texts and starts differ in number, an answer start
that is not an integer, an empty answer text, an answer that is not the context's text at its start (SQuAD's
answer_start is a character offset in the context). Questions are left-stripped, as run_qa.py strips them (a
question starting with white space would otherwise take a window's tokens). A training question may have no
answer (run_qa.py labels its windows with [CLS]); an evaluated split's question may not: the SQuAD v1.1
evaluation takes the best match over its gold answers.

The examples file (EXAMPLES_FILE, JSON Lines, in every dataset directory of the split, named and checksummed by the
manifest's task key): line i is example i, {"id", "question", "context", "answers": {"text", "answer_start"}}, the
question as tokenized (left-stripped, and cut to --max-query-length tokens where it was longer). The packs'
example_ids index it, and their offsets index its contexts: post-processing (data/finetune/answers.py) cuts an
answer's text out of it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ... import jsonin, jsonout, tasks
from ...errors import DataError
from ...fsutil import contained_path, open_regular
from .rows import SplitTable, read_split, read_text, split_format

EXAMPLES_FILE = "examples.jsonl"
"""The examples file's name in a question-answering dataset directory."""

COLUMNS = ("id", "question", "context", "answers")
"""The columns run_qa.py reads (JSON Lines, Parquet, datasets)."""


@dataclass(frozen=True)
class QAExample:
    """One question on its context, with its gold answers."""

    id: str
    """The question's id (SQuAD's "id"; a number is kept as its decimal text)."""
    question: str
    """The question, left-stripped (and cut to --max-query-length tokens where it was longer)."""
    context: str
    """The context (a paragraph), as read."""
    answer_texts: Tuple[str, ...]
    """The gold answers' texts (SQuAD's dev set has up to 6 per question, train 1; none: no answer)."""
    answer_starts: Tuple[int, ...]
    """Each answer's first character in the context."""

    def to_json(self) -> Dict[str, Any]:
        return {"id": self.id, "question": self.question, "context": self.context,
                "answers": {"text": list(self.answer_texts), "answer_start": list(self.answer_starts)}}


@dataclass
class QuestionSplit:
    """One split's examples as read and checked."""

    path: str
    """The input as the user named it."""
    format: str
    """"squad", "jsonl", "parquet" or "datasets"."""
    sha256: str
    """sha256 of the file's bytes (a datasets directory: rows.py's digest of its files)."""
    examples: List[QAExample]


def read_questions(path: str, split: str, evaluated: bool, answers_column: bool = True) -> QuestionSplit:
    """Every example of the split input at `path` (module notes), checked; DataError naming the file and the line,
    row or question for anything wrong. `evaluated`: every question must have an answer. `answers_column` False:
    questions to answer (predict): their id, question and context are read, and answers, where the input has them,
    are ignored (neither read nor checked: a wrong answer_start is no fault of a question to answer)."""
    kind = split_format(path)
    if kind in ("csv", "tsv"):
        raise DataError("%s: a question-answering split is SQuAD JSON, JSON Lines (.jsonl), Parquet or a datasets "
                        "directory, not %s" % (path, kind.upper()))
    squad = None
    if kind == "jsonl" and path.lower().endswith(".json"):
        text, digest = read_text(path)
        if text.lstrip().startswith("{"):
            try:
                value = jsonin.loads(text)
            except ValueError:  # not one JSON value: JSON Lines, read below
                value = None
            if isinstance(value, dict) and "data" in value:
                squad = _squad_examples(path, value, answers_column)
                kind = "squad"
    if squad is None:
        table = read_split(path)
        examples = _table_examples(table, answers_column)
        digest = table.sha256
    else:
        examples = squad
    if not examples:
        raise DataError("%s: the %s split holds no questions" % (path, split))
    seen: Dict[str, int] = {}
    for i, example in enumerate(examples):
        if example.id in seen:
            raise DataError("%s: question id %r appears twice (questions %d and %d)"
                            % (path, example.id, seen[example.id], i))
        seen[example.id] = i
        if evaluated and not example.answer_texts:
            raise DataError("%s: question %r has no answer: the %s split is evaluated (SQuAD v1.1: the best match over "
                            "its gold answers), so every question needs one" % (path, example.id, split))
    return QuestionSplit(path, kind, digest, examples)


def _squad_examples(path: str, value: Dict[str, Any], with_answers: bool = True) -> List[QAExample]:
    """SQuAD JSON -> its questions in file order (without `with_answers`, each without its answers)."""
    data = value["data"]
    if not isinstance(data, list):
        raise DataError("%s: 'data' should be a list of articles, got %s" % (path, type(data).__name__))
    out = []
    for a, article in enumerate(data):
        where = "%s: article %d" % (path, a)
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise DataError("%s: should be an object with a list 'paragraphs'" % where)
        for p, paragraph in enumerate(paragraphs):
            here = "%s paragraph %d" % (where, p)
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                raise DataError("%s: should be an object with 'context' and a list 'qas'" % here)
            context = paragraph.get("context")
            for q, qa in enumerate(paragraph["qas"]):
                if not isinstance(qa, dict):
                    raise DataError("%s question %d: should be an object with id, question, answers" % (here, q))
                name = "%s: question %r (article %d paragraph %d)" % (path, qa.get("id", q), a, p)
                answers = qa.get("answers") if with_answers else []
                if not isinstance(answers, list) or not all(isinstance(x, dict) for x in answers):
                    raise DataError("%s: 'answers' should be a list of {text, answer_start}" % name)
                texts = [x.get("text") for x in answers]
                starts = [x.get("answer_start") for x in answers]
                out.append(_example(name, qa.get("id"), qa.get("question"), context, texts, starts))
    return out


def _table_examples(table: SplitTable, answers_column: bool = True) -> List[QAExample]:
    """run_qa.py's columns of a JSON Lines, Parquet or datasets split -> its questions in row order (without
    `answers_column`, questions without answers: an answers column is not read)."""
    with_answers = answers_column
    for column in COLUMNS if with_answers else COLUMNS[:3]:
        if column not in table.columns:
            raise DataError("%s: no column %r (columns: %s): a question-answering split has %s (run_qa.py's, as "
                            "Hugging Face datasets' squad has them), or is SQuAD JSON"
                            % (table.header_where(), column, ", ".join(table.columns), ", ".join(COLUMNS)))
    out = []
    values = table.values
    for row in range(table.rows):
        answers = values["answers"][row] if with_answers else {"text": [], "answer_start": []}
        if not isinstance(answers, dict) or not isinstance(answers.get("text"), list) or not isinstance(
                answers.get("answer_start"), list):
            raise DataError("%s: should be {\"text\": [...], \"answer_start\": [...]}, got %s"
                            % (table.where(row, "answers"), _shown(answers)))
        out.append(_example(table.where(row), values["id"][row], values["question"][row], values["context"][row],
                            answers["text"], answers["answer_start"]))
    return out


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _example(where: str, qid: Any, question: Any, context: Any, texts: Sequence[Any], starts: Sequence[Any]
             ) -> QAExample:
    """One checked example (module notes); DataError starting with `where`."""
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or (isinstance(qid, str) and not qid.strip()):
        raise DataError("%s: 'id' should be a non-empty text or a number, got %s" % (where, _shown(qid)))
    if not isinstance(question, str) or not question.strip():
        raise DataError("%s: 'question' should be a non-empty text, got %s" % (where, _shown(question)))
    if not isinstance(context, str) or not context.strip():
        raise DataError("%s: 'context' should be a non-empty text, got %s" % (where, _shown(context)))
    if len(texts) != len(starts):
        raise DataError("%s: 'answers' has %d texts but %d answer_start values" % (where, len(texts), len(starts)))
    for text, start in zip(texts, starts):
        if not isinstance(text, str) or not text:
            raise DataError("%s: an answer's text should be a non-empty text, got %s" % (where, _shown(text)))
        if isinstance(start, bool) or not isinstance(start, int):
            raise DataError("%s: answer_start should be an integer, got %s" % (where, _shown(start)))
        if not 0 <= start <= len(context) - len(text) or context[start:start + len(text)] != text:
            found = context[max(0, start):max(0, start) + len(text)]
            raise DataError("%s: answer %s is not the context's text at its answer_start %d (there: %s)"
                            % (where, _shown(text), start, _shown(found)))
    return QAExample(str(qid), question.lstrip(), context, tuple(texts), tuple(int(s) for s in starts))


# ---------------------------------------------------------------------------------------------------
# the examples file


def examples_text(examples: Sequence[QAExample]) -> bytes:
    """The examples file's bytes: one JSON object a line, keys sorted, UTF-8 (jsonout.jsonl_text)."""
    return jsonout.jsonl_text((e.to_json() for e in examples), ensure_ascii=False).encode()


def write_examples(directory: str, examples: Sequence[QAExample]) -> Dict[str, str]:
    """Write DIRECTORY/examples.jsonl; returns the manifest task key's {examples_file, examples_sha256}."""
    data = examples_text(examples)
    with open(os.path.join(directory, EXAMPLES_FILE), "wb") as f:
        f.write(data)
    return {"examples_file": EXAMPLES_FILE, "examples_sha256": hashlib.sha256(data).hexdigest()}


def _stored_example(where: str, line: str) -> QAExample:
    """One line of an examples file, checked as a split's row is (``_example``): DataError starting with
    `where` (the file and line)."""
    try:
        row = jsonin.loads(line)
    except ValueError as error:  # JSONDecodeError, TooDeep
        raise DataError("%s: not valid JSON (%s)" % (where, getattr(error, "msg", error)))
    if not isinstance(row, dict):
        raise DataError("%s: should be an object with id, question, context, answers, got %s"
                        % (where, type(row).__name__))
    missing = [key for key in COLUMNS if key not in row]
    if missing:
        raise DataError("%s: has no %s (every example holds %s)" % (where, ", ".join(map(repr, missing)),
                                                                      ", ".join(COLUMNS)))
    answers = row["answers"]
    if not isinstance(answers, dict) or not isinstance(answers.get("text"), list) or not isinstance(
            answers.get("answer_start"), list):
        raise DataError("%s: 'answers' should be {\"text\": [...], \"answer_start\": [...]}, got %s"
                        % (where, _shown(answers)))
    return _example(where, row["id"], row["question"], row["context"], answers["text"], answers["answer_start"])


def read_examples(directory: str, manifest: Optional[Mapping[str, Any]] = None) -> List[QAExample]:
    """The examples of a question-answering dataset directory (its manifest's task.examples_file), checked against
    the manifest's sha256 and counts (its examples, and those with answers: a split prepared with an answer to
    every question keeps one on every row), and every row as a split's row is checked: DataError naming the file
    (and line) otherwise. `manifest`: the directory's, already read
    (else it is read here)."""
    if manifest is None:
        from ..format import read_manifest

        manifest = read_manifest(directory)
    task = manifest.get("task") or {}
    if task.get("name") != tasks.QUESTION_ANSWERING.name:
        raise DataError("%s: not a question-answering dataset (no examples file)" % directory)
    path = contained_path(directory, task["examples_file"])
    try:
        with open_regular(path, "rb", error=DataError) as f:
            data = f.read()
    except FileNotFoundError:
        raise DataError("%s: missing (named by manifest field 'task' entry 'examples_file')" % path)
    if hashlib.sha256(data).hexdigest() != task["examples_sha256"]:
        raise DataError("%s: sha256 does not match manifest field 'task' entry 'examples_sha256'" % path)
    examples = []
    answered = task.get("answered")
    every = answered is not None and answered == task["num_examples"]  # a split prepared with answers throughout
    for number, line in jsonin.jsonl_lines(data.decode("utf-8")):  # at "\n" only: a context may hold U+2028
        examples.append(_stored_example("%s:%d" % (path, number), line))
        if every and not examples[-1].answer_texts:
            raise DataError("%s:%d: has no answer, but its split was prepared with one for every question (manifest "
                            "field 'task' entry 'answered' is %d)" % (path, number, answered))
    if len(examples) != task["num_examples"]:
        raise DataError("%s: holds %d examples, manifest field 'task' entry 'num_examples' says %d"
                        % (path, len(examples), task["num_examples"]))
    with_answers = sum(1 for example in examples if example.answer_texts)
    if answered is not None and with_answers != answered:
        raise DataError("%s: holds %d examples with answers, manifest field 'task' entry 'answered' says %d"
                        % (path, with_answers, answered))
    return examples


__all__ = ["EXAMPLES_FILE", "QAExample", "QuestionSplit", "read_examples", "read_questions", "write_examples"]
