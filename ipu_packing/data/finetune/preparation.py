"""`prepare --task classification`: split files -> labelled, tokenized examples -> the packing phase `prepare` and
`pack` share -> OUT/train, OUT/validation, OUT/test, each with packed/ and padded/.

Order of work (the same claiming, temporary directory, worker processes and write phase as `prepare`):

1. Claim the output (data/write/output.py `claim_output`: refused when it is not empty or another command
   writes it) and check that every split's input exists, before anything is created.
2. Load the model's tokenizer (`--tokenizer DIR`: data/vocab.py `load_tokenizer`; the demo task, `--input default`,
   without one gets the default corpus' vocabulary, the demo BERT's).
3. Read every split whole (data/finetune/rows.py), choose the text columns and the labels on the train split and
   check every row of every split against them (data/finetune/labels.py): any refusal happens here, before a
   token is made, and leaves nothing behind.
4. Per split: tokenize chunks of rows in the worker processes (data/finetune/encode.py) into instance files with
   the task's columns (labels, example_ids), then one plan over their lengths and the packed and padded
   datasets (data/write/datasets.py `write_datasets`, the one packing phase), each with its manifest (its
   `task` key: tasks/sequence_classification.py MANIFEST_KEYS) and the tokenizer's vocab.txt.

Same inputs, options and seed give the same bytes (the rows are read in file order, the tokenizer is
deterministic, and the plan and assignment are `prepare`'s), whatever --workers is.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ... import tasks
from ...errors import DataError
from ..format import SPLITS, FieldLayout
from ..vocab import TokenizerSpec, load_tokenizer, train_default_vocab
from ..write.datasets import PackSettings, write_datasets
from ..write.output import claim_output, write_atomically
from ..write.workers import Phases, Workers, progress
from .encode import CHUNK_ROWS, encode_chunk, start_encoder
from .rows import SplitTable, check_split_path, read_split
from .labels import LabelMap, SplitLabels, check_columns, encode_labels, infer_labels, text_columns, texts

DEMO_INPUT = "default"
"""`--input default` with a task: the embedded demo task (data/finetune/demo.py)."""


@dataclass
class TaskResult:
    """What a task's preparation wrote (text/pipeline.py's `prepare` returns it as its PrepareResult)."""

    splits: Dict[str, Dict[str, dict]]
    """{split: {"packed": manifest, "padded": manifest (absent with --no-padded)}} in the order of format.SPLITS."""
    seconds: Dict[str, float]
    """Wall-clock seconds per phase (vocab, read, tokenize, plan, scatter, write: each summed over the splits) and
    total."""


def prepare_task(config) -> TaskResult:
    """Run a task's whole preparation (the module notes). `config` is text/pipeline.py's PrepareConfig with task
    set."""
    return prepare_into_output(config, _prepare_into)


def prepare_into_output(config, prepare_into) -> TaskResult:
    """Claim the output and check that every split's input exists, before anything is created; then
    ``prepare_into(config, temp)`` writes the task's splits into a temporary directory that becomes the output
    whole (or is removed)."""
    output = os.path.abspath(config.output)
    reading = list(split_paths(config).values()) + ([config.vocab] if config.vocab not in (None, DEMO_INPUT) else [])
    with claim_output(output, "prepare", reading):  # the output is checked and held before any input is read
        for path in split_paths(config).values():
            check_split_path(path)
        return write_atomically(output, lambda temp: prepare_into(config, temp), "preparing")


def split_paths(config) -> Dict[str, str]:
    """{split: input path} of a config with --train (the demo's are written later, into the work directory)."""
    if config.input == DEMO_INPUT:
        return {}
    given = {"train": config.train, "validation": config.validation, "test": config.test}
    return {name: given[name] for name in SPLITS if given[name]}


def task_tokenizer(config) -> TokenizerSpec:
    """The model's tokenizer: --tokenizer (--vocab); "default", or the demo task without one: the default
    vocabulary (the demo BERT's)."""
    if config.vocab is not None and config.vocab != DEMO_INPUT:
        return load_tokenizer(config.vocab, config.lower_case)
    if config.vocab is None and config.input != DEMO_INPUT:
        raise DataError("--task %s needs the model's own tokenizer: --tokenizer DIR (a Hugging Face tokenizer "
                        "directory with tokenizer.json and/or vocab.txt, e.g. a training run's export "
                        "output/runs/demo/final; or default, the default corpus' vocabulary)" % config.task)
    from ..text.corpus import default_documents

    return train_default_vocab([sentence for document in default_documents() for sentence in document])


def start_splits(config, temp: str, write_demo) -> Tuple[Phases, TokenizerSpec, str, Dict[str, str], Dict[str, str]]:
    """How a task's preparation starts: (the phase timer, the model's tokenizer (timed as "vocab"), the work
    directory temp/work, {split: input path}, {split: how the manifest names it}): the config's split files, or with
    ``--input default`` the demo task that ``write_demo(directory)`` writes into the work directory."""
    lap = Phases()
    spec = task_tokenizer(config)
    lap("vocab")
    work = os.path.join(temp, "work")
    os.makedirs(work)
    paths = split_paths(config)
    if config.input != DEMO_INPUT:
        return lap, spec, work, paths, dict(paths)
    paths = write_demo(os.path.join(work, "demo"))
    return lap, spec, work, paths, {name: "default (%s)" % os.path.basename(path) for name, path in paths.items()}


def _prepare_into(config, temp: str) -> TaskResult:
    from .demo import write_demo_task

    lap, spec, work, paths, shown = start_splits(config, temp, write_demo_task)
    tables = {name: read_split(paths[name]) for name in SPLITS if name in paths}
    for name, table in tables.items():
        if table.rows == 0:
            raise DataError("%s: the %s split holds no rows" % (table.path, name))
    train = tables["train"]
    columns = text_columns(train, config.sentence1_key, config.sentence2_key, config.label_key)
    if config.label_key in columns:
        raise DataError("%s: --label-key %s is also a text column" % (train.header_where(), config.label_key))
    if config.label_key not in train.columns:
        raise DataError("%s: no column %r (columns: %s): the train split needs labels (--label-key)"
                        % (train.header_where(), config.label_key, ", ".join(train.columns)))
    label_map = infer_labels(train, config.label_key, config.problem_type)
    examples = {}
    for name, table in tables.items():
        check_columns(table, columns)
        split_texts = [texts(table, column) for column in columns]
        examples[name] = (split_texts, encode_labels(table, config.label_key, label_map, name))
    lap("read")

    workers = Workers(config.packing.num_workers, start_encoder, (spec, config.max_seq_length))
    splits: Dict[str, Dict[str, dict]] = {}
    try:
        for name, table in tables.items():
            split_texts, labels = examples.pop(name)
            splits[name] = _write_split(config, spec, name, table, shown[name], columns, split_texts, labels,
                                        label_map, workers, temp, work, lap)
    except BaseException:
        workers.abort()
        raise
    workers.close()
    shutil.rmtree(work)
    return TaskResult(splits, lap.total())


def _write_split(config, spec: TokenizerSpec, name: str, table: SplitTable, shown: str, columns: List[str],
                 split_texts: List[List[str]], labels: SplitLabels, label_map: LabelMap, workers: Workers, temp: str,
                 work: str, lap) -> Dict[str, dict]:
    """One split: tokenized in chunks by the workers, then packed and written into temp/<split>; its manifests."""
    n = table.rows
    paths: List[str] = []

    def chunks():
        for index, first in enumerate(range(0, n, CHUNK_ROWS)):
            paths.append(os.path.join(work, "%s-instances-%05d.npz" % (name, index)))
            end = min(n, first + CHUNK_ROWS)
            yield (index, first, split_texts[0][first:end], split_texts[1][first:end] if len(split_texts) > 1
                   else None, labels.labels[first:end], paths[-1])

    bar = progress("tokenizing %s" % name, config.packing.progress, " chunks")
    results: List[Tuple[np.ndarray, int]] = workers.map_bounded(encode_chunk, chunks(),
                                                                 on_result=lambda _: bar.update(1))
    bar.close()
    lengths = [lengths for lengths, _ in results]
    truncated = sum(count for _, count in results)
    lap("tokenize")
    task = FieldLayout(tasks.CLASSIFICATION.name, label_map.problem_type, label_map.num_labels, labels.has_labels)
    entry = {
        "name": task.name, "problem_type": task.problem_type, "num_labels": task.num_labels,
        "labels": label_map.names, "label_counts": labels.counts, "split": name, "has_labels": labels.has_labels,
        "text_columns": list(columns), "label_column": config.label_key if labels.has_labels else None,
        "truncated": int(truncated), "tokenizer": spec.source,
        "source": {"file": shown, "format": table.format, "rows": n, "sha256": table.sha256},
    }

    return write_split(config, spec, name, task, paths, lengths, lambda directory: entry, workers, temp, lap)


def write_split(config, spec: TokenizerSpec, name: str, task: FieldLayout, paths: List[str], lengths: List[np.ndarray],
                entry_for, workers: Workers, temp: str, lap) -> Dict[str, dict]:
    """A task split's instance files (``paths``, their sequences' ``lengths``) packed and written into
    temp/<name> by the shared write phase, with ``task``'s field layout; each dataset's manifest gets the
    tokenizer's files and ``entry_for(directory)``, its `task` entry. Its manifests."""

    def describe(directory: str, kind: str) -> dict:
        return {**spec.write_vocab(directory), "seed": config.packing.seed, "task": entry_for(directory)}

    settings = PackSettings(max_seq_length=config.max_seq_length, vocab_size=len(spec.vocab),
                            mlm_slots=lambda k: 0, options=config.packing, group_tokens=config.group_tokens,
                            cls_id=spec.special_token_ids["[CLS]"], task=task)
    directory = os.path.join(temp, name)
    manifests = write_datasets(paths, lengths, 0, settings, directory, workers, describe, lap)
    shutil.rmtree(os.path.join(directory, "work"))
    return manifests


def packs_summary(packed: dict, padded: Optional[dict]) -> str:
    """A split's packs, packing factor and efficiency, and the padded baseline's rows and efficiency."""
    return ("%d packs (packing factor %.3f, efficiency %.1f%%)" % (
        packed["num_packs"], packed["packing_factor"], 100 * packed["packing_efficiency"])
        + ("; padded baseline %d rows (efficiency %.1f%%)" % (padded["num_packs"], 100 * padded["packing_efficiency"])
           if padded else ""))


def split_summary(name: str, output: str, packed: dict, padded: Optional[dict]) -> str:
    """The command's line for one split: sequences, packs, packing factor, efficiency (and the padded baseline's)."""
    return "%s: %d sequences (%d truncated to %d) -> %s" % (
        os.path.join(output, name), packed["num_sequences"], packed["task"]["truncated"], packed["max_seq_length"],
        packs_summary(packed, padded))


def check_options(config: Any) -> None:
    """`prepare --task classification`'s options on their own (its inputs are read, and refused, below)."""
    from ..text.pipeline import check_task_inputs, refuse_other_tasks_options

    refuse_other_tasks_options(config)
    check_task_inputs(config)


def inspect_lines(directory: str, manifest: Dict[str, Any]) -> List[str]:
    """`inspect`'s lines on a classification dataset's task: its problem, labels and their balance, source and
    truncation."""
    task, n = manifest["task"], manifest["num_sequences"]
    lines = ["  %-24s %s, %s split, %d examples from %s (%s, sha256 %s)"
             % ("task", task["name"], task["split"], n, task["source"]["file"], task["source"]["format"],
                task["source"]["sha256"][:12]),
             "  %-24s %s, num_labels %d%s" % ("problem type", task["problem_type"], task["num_labels"],
                                             "" if task["has_labels"] else "; this split has no labels"),
             "  %-24s %s" % ("text columns", ", ".join(task["text_columns"])),
             "  %-24s %d (%.2f%%) cut to %d tokens" % ("truncated", task["truncated"],
                                                      100.0 * task["truncated"] / max(1, n),
                                                      manifest["max_seq_length"])]
    counts = task["label_counts"]
    if counts is not None:
        names = task["labels"] or [str(i) for i in range(task["num_labels"])]
        lines.append("label balance (%s):" % ("examples of each class" if task["problem_type"] ==
                                               "single_label_classification" else "examples with each label"))
        top = max(1, max(counts))
        for name, count in list(zip(names, counts))[:32]:
            lines.append("  %-24s %7d %5.1f%% %s" % (name[:24], count, 100.0 * count / max(1, n),
                                                      "#" * int(round(30 * count / top))))
        if len(counts) > 32:
            lines.append("  ... %d labels more" % (len(counts) - 32))
    return lines


def prepared_lines(output: str, result: Any) -> List[str]:
    """What `prepare` prints on the classification splits it wrote."""
    from .labels import describe_columns

    packed, seconds = result.packed, result.seconds
    task = packed["task"]
    return (["prepared %s in %.1f s: task %s, %s, %d labels%s; S = %d, K = %d" % (
                output, seconds["total"], task["name"], task["problem_type"], task["num_labels"],
                " (%s)" % ", ".join(task["labels"]) if task["labels"] and len(task["labels"]) <= 8 else "",
                packed["max_seq_length"], packed["max_sequences_per_pack"]),
             "  " + describe_columns(task["text_columns"], task["label_column"])]
            + ["  " + split_summary(name, output, m["packed"], m.get("padded"))
               for name, m in result.splits.items()])
