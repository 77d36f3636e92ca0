"""The QA task's `prepare` (tasks/extractive_qa.py): SQuAD splits -> checked questions -> windows -> the packing
phase `prepare` and `pack` share -> OUT/train, OUT/validation (and OUT/test), each with packed/ and padded/.

Order of work (the same claiming, temporary directory, worker processes and write phase as every `prepare`):

1. Claim the output (write/output.py `claim_output`) and check that every split's input exists, before anything
   is created.
2. Load the model's tokenizer (preparation.py `task_tokenizer`: --tokenizer DIR; the demo task, `--input default`,
   without one gets the default corpus' vocabulary).
3. Read every split whole and check every question (data/finetune/questions.py): any refusal happens here, before a
   token is made, and leaves nothing behind.
4. Per split: cut the questions to --max-query-length and tokenize question + context into windows in the worker
   processes (data/finetune/windows.py), as run_qa.py's BertTokenizerFast call makes its features, into instance files
   with the task's columns (answer positions, example and feature ids, token offsets); number the windows over the
   split (`shift_feature_ids`); then one plan over their lengths and the packed and padded datasets
   (write/datasets.py `write_datasets`, the one packing phase), each with its manifest (its `task` key:
   tasks/extractive_qa.py MANIFEST_KEYS), the tokenizer's vocab.txt and the split's examples file (questions.py
   `write_examples`: the questions as tokenized, the contexts, the gold answers).

Same inputs, options and seed give the same bytes, whatever --workers is.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ... import tasks
from ..format import SPLITS, FieldLayout
from ..vocab import TokenizerSpec
from ..write.workers import Workers, progress
from .preparation import TaskResult, packs_summary, prepare_into_output, start_splits, write_split
from .questions import QuestionSplit, read_examples, read_questions, write_examples
from .windows import CHUNK_QUESTIONS, shift_feature_ids, start_windows, window_chunk

EVALUATED = ("validation",)
"""Splits whose every question needs a gold answer (the evaluation's)."""


def prepare_questions(config) -> TaskResult:
    """Run the whole preparation (the module notes). `config` is text/pipeline.py's PrepareConfig of this task."""
    return prepare_into_output(config, _prepare_into)


def _prepare_into(config, temp: str) -> TaskResult:
    from .qa_demo import write_qa_demo

    lap, spec, work, paths, shown = start_splits(config, temp, write_qa_demo)
    splits = {name: read_questions(paths[name], name, name in EVALUATED) for name in SPLITS if name in paths}
    lap("read")
    workers = Workers(config.packing.num_workers, start_windows,
                      (spec, config.max_seq_length, config.doc_stride, config.max_query_length))
    done: Dict[str, Dict[str, dict]] = {}
    try:
        for name, split in splits.items():
            done[name] = _write_split(config, spec, name, split, shown[name], workers, temp, work, lap)
    except BaseException:
        workers.abort()
        raise
    workers.close()
    shutil.rmtree(work)
    return TaskResult(done, lap.total())


def _write_split(config, spec: TokenizerSpec, name: str, split: QuestionSplit, shown: str, workers: Workers,
                 temp: str, work: str, lap) -> Dict[str, dict]:
    """One split: windows made in chunks by the workers, numbered, then packed and written into temp/<split>; its
    manifests."""
    examples = split.examples
    n = len(examples)
    paths: List[str] = []

    def chunks():
        for index, first in enumerate(range(0, n, CHUNK_QUESTIONS)):
            paths.append(os.path.join(work, "%s-instances-%05d.npz" % (name, index)))
            part = examples[first:first + CHUNK_QUESTIONS]
            yield (index, first, [e.question for e in part], [e.context for e in part],
                   [(e.answer_starts[0], e.answer_texts[0]) if e.answer_texts else (None, None) for e in part],
                   ["%s: question %r" % (split.path, e.id) for e in part], paths[-1])

    bar = progress("windows %s" % name, config.packing.progress, " chunks")
    results: List[Tuple[np.ndarray, List[Tuple[int, str]], int]] = workers.map_bounded(
        window_chunk, chunks(), on_result=lambda _: bar.update(1))
    bar.close()
    lengths = [lengths for lengths, _, _ in results]
    firsts = np.cumsum([0] + [len(x) for x in lengths[:-1]]).tolist()
    workers.map_bounded(shift_feature_ids, ((path, first, len(spec.vocab)) for path, first in zip(paths, firsts)
                                            if first))
    examples = list(examples)
    cut = [item for _, items, _ in results for item in items]
    for row, question in cut:  # the question as tokenized: its text is what the windows hold
        examples[row] = dataclasses.replace(examples[row], question=question)
    lap("tokenize")
    entry = {
        "name": tasks.QUESTION_ANSWERING.name, "split": name, "num_examples": n,
        "answered": sum(1 for e in examples if e.answer_texts), "max_query_length": config.max_query_length,
        "doc_stride": config.doc_stride, "questions_truncated": len(cut),
        "windows_without_answer": int(sum(without for _, _, without in results)), "tokenizer": spec.source,
        "source": {"file": shown, "format": split.format, "rows": n, "sha256": split.sha256},
    }

    return write_split(config, spec, name, FieldLayout(tasks.QUESTION_ANSWERING.name, num_examples=n), paths, lengths,
                       lambda directory: dict(entry, **write_examples(directory, examples)), workers, temp, lap)


def qa_split_summary(name: str, output: str, packed: dict, padded: Optional[dict]) -> str:
    """The command's line for one split: questions, windows, packs, packing factor, efficiency (and the padded
    baseline's)."""
    task = packed["task"]
    return "%s: %d questions (%d cut to %d tokens) -> %d windows (%d without the answer) -> %s" % (
        os.path.join(output, name), task["num_examples"], task["questions_truncated"], task["max_query_length"],
        packed["num_sequences"], task["windows_without_answer"], packs_summary(packed, padded))


def check_options(config: Any) -> None:
    """The QA task's `prepare` options on their own; the window settings' defaults filled."""
    from .windows import DOC_STRIDE, MAX_QUERY_LENGTH, check_window_settings
    from ..text.pipeline import check_task_inputs, refuse_other_tasks_options

    check_task_inputs(config)
    refuse_other_tasks_options(config)
    if config.doc_stride is None:
        config.doc_stride = DOC_STRIDE
    if config.max_query_length is None:
        config.max_query_length = MAX_QUERY_LENGTH
    check_window_settings(config.max_seq_length, config.doc_stride, config.max_query_length)


def inspect_lines(directory: str, manifest: Dict[str, Any]) -> List[str]:
    """`inspect`'s lines on a question-answering dataset's task; its examples file read, every row checked, as
    its evaluation reads it."""
    task, n = manifest["task"], manifest["num_sequences"]
    read_examples(directory, manifest)
    return ["  %-24s %s, %s split, %d questions (%d with an answer) in %d windows from %s (%s, "
            "sha256 %s)" % ("task", task["name"], task["split"], task["num_examples"], task["answered"], n,
                            task["source"]["file"], task["source"]["format"], task["source"]["sha256"][:12]),
            "  %-24s doc stride %d, max query length %d (%d questions cut to it)"
            % ("windows", task["doc_stride"], task["max_query_length"], task["questions_truncated"]),
            "  %-24s %d (%.2f%%) point at their [CLS]: the answer is not wholly inside"
            % ("windows without answer", task["windows_without_answer"],
               100.0 * task["windows_without_answer"] / max(1, n)),
            "  %-24s %s (sha256 %s; every row checked)" % ("examples file", task["examples_file"],
                                                           task["examples_sha256"][:12])]


def prepared_lines(output: str, result: Any) -> List[str]:
    """What `prepare` prints on the question-answering splits it wrote."""
    packed, seconds = result.packed, result.seconds
    task = packed["task"]
    return (["prepared %s in %.1f s: task %s; S = %d, K = %d, doc stride %d, max query length %d"
             % (output, seconds["total"], task["name"], packed["max_seq_length"], packed["max_sequences_per_pack"],
                task["doc_stride"], task["max_query_length"])]
            + ["  " + qa_split_summary(name, output, m["packed"], m.get("padded"))
               for name, m in result.splits.items()])

__all__ = ["check_options", "inspect_lines", "prepare_questions", "prepared_lines", "qa_split_summary"]
