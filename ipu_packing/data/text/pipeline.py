"""`prepare`: corpus -> instances (worker processes over shards) -> one packing plan -> shards.

Order of work:

1. Check the output directory (refuse a non-empty one) and make a temporary sibling directory; the
   result is renamed into place only when everything succeeded, so a failure leaves nothing behind.
2. Load the tokenizer (`--vocab`), or train a WordPiece vocabulary on the input (`--train-vocab N`;
   the embedded default corpus gets its default vocabulary without either). A corpus of the user's own
   without either is refused: its text would be cut into the default corpus' word pieces.
3. Stream documents from the input, group them into shards of about `shard_chars` characters, and
   build each shard's instances in a worker process (tokenize, choose segments, truncate, mask),
   each shard from its own generator seeded from (seed, shard index). At most two shards per worker
   are in flight, so memory is bounded by a few shards, not by the corpus. Each worker writes its
   instances to one file in the temporary directory and returns only their lengths.
4. data/write/datasets.py, the packing phase shared with every source of instances: make *one* packing plan for
   the whole corpus from the lengths, and write the packed dataset (K = max_sequences_per_pack) and
   the padded baseline (K = 1: every pack is one sequence, so the model has a single code path),
   each with its manifest and vocab.txt, in the two streaming passes of data/write/packs.py (scatter
   groups of input shards to spill files, placing each sequence by packing/slots.py's streaming
   assignment, then build each output shard from its blocks), so no process holds or opens more
   than a group or a shard at a time.

Faults: a full disk is one DataError line and the temporary directory is removed; worker processes
ignore Ctrl-C (the parent reports it once) and are killed when the parent dies; the temporary
directory of a killed run (its name holds the run's pid) is removed by the next run into the same
output.
"""

from __future__ import annotations

import os
import platform
import shutil
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .corpus import FORMATS, CorpusDigest, CorpusSpec, default_documents, shard_documents
from ... import tasks
from ...errors import DataError
from ..format import mlm_slots
from ..limits import MAX_DUPE_FACTOR, MAX_VOCAB_SIZE, check_at_most, check_pack_sizes
from .recipe import RecipeConfig
from ..vocab import DEFAULT_VOCAB_SIZE, LOWER_CASE_CHOICES, load_tokenizer, train_default_vocab, train_vocab
from ..write.output import claim_output, write_atomically
from ..write.workers import Phases, Workers, progress
from .shard_worker import build_shard, start_tokenizer
from ..write.datasets import PackingOptions, PackSettings, write_datasets  # the packing phase, shared with `pack`


TASKS = tasks.NAMES
"""`prepare --task`: pretraining (a corpus -> NSP/MLM instances, this module) or a fine-tuning task (split files
-> labelled examples, data/finetune/preparation.py; SQuAD questions -> question + context windows,
data/finetune/qa_preparation.py); all end in the same packing phase and pack format. Each task's recipe (tasks/)
checks its options and runs its preparation."""


@dataclass
class PrepareConfig:
    """Everything `python -m ipu_packing.data prepare` takes."""

    input: str
    """Corpus: a file, a directory, a glob, or "default" (embedded corpus from the CPython install). With a task:
    "default" for its embedded demo task (data/finetune/demo.py; question answering: data/finetune/qa_demo.py), else ""
    (the splits are train, validation and test)."""
    output: str
    """Output directory (must not exist or be empty); gets packed/ and padded/ (a task: train/, validation/ and
    test/, each with packed/ and padded/)."""
    max_seq_length: Optional[int] = None
    """S (None: 128; for question answering 384, run_qa.py's: data/finetune/windows.py MAX_SEQ_LENGTH)."""
    vocab: Optional[str] = None
    """vocab.txt or Hugging Face tokenizer directory, or "default" (the default corpus' vocabulary:
    DEFAULT_VOCAB_SIZE WordPiece tokens trained on it, lower-cased). None: see train_vocab."""
    train_vocab: Optional[int] = None
    """Train a WordPiece vocabulary of this many tokens (at most) on the input. With vocab None too:
    the default vocabulary for input "default", a refusal for any other input."""
    lower_case: str = "auto"
    """For a bare vocab.txt: "auto" (uncased unless it has upper-case tokens), "yes" or "no"; for a
    trained vocabulary: "auto" or "yes" lower-case, "no" keeps the case."""
    format: str = "auto"
    """Input format: "auto", "bert" or "text" (see corpus.py)."""
    dupe_factor: int = 10
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: Optional[int] = None
    """None: ceil(masked_lm_prob * max_seq_length)."""
    whole_word_masking: bool = False
    shard_chars: int = 1 << 17
    """Characters of text per instance-building shard (the unit of work and of RNG seeding)."""
    group_tokens: int = 1 << 21
    """Tokens of instances per scatter task (bounds a worker's memory; does not change the output)."""
    packing: PackingOptions = field(default_factory=PackingOptions)
    """K, the seed (of everything random here), workers, the algorithm, shard size, padded/ (shared with `pack`)."""
    task: str = tasks.PRETRAINING.name
    """One of TASKS. A task reads train/validation/test (below) and tokenizes with `vocab`, the model's own
    tokenizer; the recipe's options (dupe_factor ... whole_word_masking, shard_chars) do not apply to it."""
    train: Optional[str] = None
    """A task's train split: a .csv, .tsv, .jsonl, .parquet file or a datasets directory (data/finetune/rows.py)."""
    validation: Optional[str] = None
    """A task's validation split (required with train)."""
    test: Optional[str] = None
    """A task's test split (optional; may have no labels)."""
    sentence1_key: Optional[str] = None
    """The first text column (None: "sentence1", else run_glue's first non-label column; data/finetune/labels.py)."""
    sentence2_key: Optional[str] = None
    """The second text column (None: "sentence2" where the input has it)."""
    label_key: str = "label"
    """The label column."""
    problem_type: Optional[str] = None
    """Force single_label_classification, multi_label_classification or regression (None: inferred)."""
    doc_stride: Optional[int] = None
    """Question answering: context tokens two consecutive windows share (None: 128, run_qa.py's; windows.py)."""
    max_query_length: Optional[int] = None
    """Question answering: tokens a question is cut to, at a word boundary (None: 64, the legacy SQuAD scripts')."""

    def __post_init__(self) -> None:
        if self.task not in tasks.TASKS:
            raise DataError("--task must be one of %s, got %r" % ("/".join(tasks.TASKS), self.task))
        task = tasks.TASKS[self.task]
        if self.max_seq_length is None:
            self.max_seq_length = task.max_seq_length
        task.hook("check_prepare")(self)

    @property
    def recipe(self) -> RecipeConfig:
        return RecipeConfig(max_seq_length=self.max_seq_length, masked_lm_prob=self.masked_lm_prob,
                            max_predictions_per_seq=self.max_predictions_per_seq,
                            short_seq_prob=self.short_seq_prob, dupe_factor=self.dupe_factor,
                            whole_word_masking=self.whole_word_masking)


# ---------------------------------------------------------------------------------------------------
# seeds: one root seed, independent streams for each use, identified by a fixed spawn key

# ---------------------------------------------------------------------------------------------------
# workers

def _run_shards(config: PrepareConfig, workers: Workers, documents, work: str, digest: CorpusDigest,
                background=None):
    """Build every shard's instances; returns (instance files in shard order, their results).
    `background` (optional) runs in a thread of this process while the workers build the shards."""
    paths: List[str] = []

    def tasks():
        for index, docs in enumerate(shard_documents(documents, config.shard_chars, digest)):
            paths.append(os.path.join(work, "instances-%05d.npz" % index))
            yield index, docs, paths[-1]

    bar = progress("instances", config.packing.progress, " shards")
    thread = None
    if background is not None:
        workers.start()  # fork the worker processes first: never fork while a thread imports
        thread = threading.Thread(target=background, daemon=True)
        thread.start()
    results = workers.map_bounded(build_shard, tasks(), on_result=lambda _: bar.update(1))
    bar.close()
    if thread is not None:
        thread.join()
    return paths, results


def _preload_planner() -> None:
    """Import the planner's LP solver (highspy) while the workers build instances, so it is not on
    the critical path between the instance and the planning phases."""
    try:
        import highspy  # noqa: F401
    except ImportError:  # the planner reports it, if it needs the LP
        pass


# ---------------------------------------------------------------------------------------------------
# the whole preparation


@dataclass
class PrepareResult:
    packed: dict
    """Manifest of packed/ (a task: of train/packed)."""
    padded: Optional[dict]
    """Manifest of padded/ (None with padded=False; a task: of train/padded)."""
    seconds: Dict[str, float]
    """Wall-clock seconds per phase: vocab, instances, plan, scatter, write, total (a task: vocab, read,
    tokenize, plan, scatter, write, total; each summed over the splits)."""
    splits: Dict[str, Dict[str, dict]] = field(default_factory=dict)
    """A task: {split: {"packed": manifest, "padded": manifest}} in the order train, validation, test."""


def refuse_other_tasks_options(config: "PrepareConfig") -> None:
    """Another task's own options (its recipe's ``prepare_options``), given with ``config.task``, refused."""
    task = tasks.get(config.task)
    for other in tasks.TASKS.values():
        for name, unset in other.prepare_options.items():
            if other is not task and name not in task.prepare_options and getattr(config, name) != unset:
                raise DataError("--%s is an option of --task %s (--task %s reads %s)"
                                % (name.replace("_", "-"), other.name, task.name, task.inputs))


def check_corpus_options(config: "PrepareConfig") -> None:
    """Pretraining's options on their own (tasks/pretraining.py)."""
    refuse_other_tasks_options(config)
    for name in ("train", "validation", "test"):
        if getattr(config, name) is not None:
            raise DataError("--%s is an option of a fine-tuning task (--task %s)" % (
                name.replace("_", "-"), " or ".join(t.name for t in tasks.TASKS.values() if t.fine_tuning)))
    if not config.input:
        raise DataError("--input is required: a corpus (file, directory or glob) or default")
    if config.train_vocab is not None and config.vocab is not None:
        raise DataError("--vocab %s and --train-vocab %d exclude each other: give one"
                        % (config.vocab, config.train_vocab))
    if config.train_vocab is not None and config.train_vocab < 100:
        raise DataError("--train-vocab must be >= 100 tokens, got %d" % config.train_vocab)
    if config.lower_case not in LOWER_CASE_CHOICES:
        raise DataError("--lower-case must be one of %s" % "/".join(LOWER_CASE_CHOICES))
    if config.format not in FORMATS:
        raise DataError("--format must be one of %s" % "/".join(FORMATS))
    if config.shard_chars < 1:
        raise DataError("shard_chars must be >= 1, got %r" % config.shard_chars)
    if config.group_tokens < 1:
        raise DataError("group_tokens must be >= 1, got %r" % config.group_tokens)
    check_pack_sizes(config.max_seq_length, config.packing.max_sequences_per_pack)
    check_at_most("--dupe-factor", config.dupe_factor, MAX_DUPE_FACTOR, "passes over the corpus")
    if config.train_vocab is not None:
        check_at_most("--train-vocab", config.train_vocab, MAX_VOCAB_SIZE, "token ids are int32")
    config.recipe  # validates the recipe fields


def check_task_inputs(config: "PrepareConfig") -> None:
    """A fine-tuning task's inputs and shared options on their own (the inputs are read, and refused, by
    data/finetune/preparation.py and qa_preparation.py)."""
    from ..format import MIN_SEQ_LENGTH, PROBLEM_TYPES

    if config.train_vocab is not None:
        raise DataError("--train-vocab: a task is tokenized with the model's own tokenizer: --tokenizer DIR")
    if config.input and config.train:
        raise DataError("--input %s and --train %s exclude each other: --input default is the demo task, "
                        "--train/--validation/--test your own" % (config.input, config.train))
    if not config.train:
        if config.input != "default":
            raise DataError("--task %s needs --train FILE --validation FILE [--test FILE], or --input default "
                            "(the demo task)" % config.task if not config.input else
                            "--input %s: a task's input is --train/--validation/--test (or --input default, the "
                            "demo task)" % config.input)
        if config.validation or config.test:
            raise DataError("--validation and --test go with --train, not with --input default")
    elif not config.validation:
        raise DataError("--train needs --validation FILE (and optionally --test FILE)")
    if config.problem_type is not None and config.problem_type not in PROBLEM_TYPES:
        raise DataError("--problem-type must be one of %s, got %r" % ("/".join(PROBLEM_TYPES), config.problem_type))
    if config.max_seq_length < MIN_SEQ_LENGTH:
        raise DataError("--max-seq-length must be >= %d ([CLS] A [SEP] B [SEP]), got %d"
                        % (MIN_SEQ_LENGTH, config.max_seq_length))
    if config.lower_case not in LOWER_CASE_CHOICES:
        raise DataError("--lower-case must be one of %s" % "/".join(LOWER_CASE_CHOICES))
    check_pack_sizes(config.max_seq_length, config.packing.max_sequences_per_pack)


def prepare(config: PrepareConfig) -> PrepareResult:
    """Run the whole preparation of ``config``'s task (its ``prepare`` hook, tasks/); a fine-tuning task's splits
    (data/finetune/preparation.py TaskResult) come back with the train split's manifests first."""
    done = tasks.TASKS[config.task].hook("prepare")(config)
    if isinstance(done, PrepareResult):
        return done
    train = done.splits["train"]
    return PrepareResult(train["packed"], train.get("padded"), done.seconds, done.splits)


def prepared_lines(output: str, result: PrepareResult) -> List[str]:
    """What `prepare` prints on a pretraining dataset it wrote."""
    packed, padded, seconds = result.packed, result.padded, result.seconds
    return ["prepared %s in %.1f s: %d sequences (%.0f/s) -> %d packs (packing factor %.3f, efficiency %.1f%%)%s"
            % (output, seconds["total"], packed["num_sequences"], packed["num_sequences"] / seconds["total"],
               packed["num_packs"], packed["packing_factor"], 100 * packed["packing_efficiency"],
               "; padded baseline %d rows (efficiency %.1f%%)"
               % (padded["num_packs"], 100 * padded["packing_efficiency"]) if padded else "")]


def prepare_corpus(config: PrepareConfig) -> PrepareResult:
    """Pretraining's preparation (the module notes)."""
    output = os.path.abspath(config.output)
    reading = [path for path in (config.input, config.vocab) if path not in (None, "default")]  # not the embedded
    with claim_output(output, "prepare", reading):  # the output is checked and held before any input is read
        corpus_spec = CorpusSpec(config.input, config.format)
        files = corpus_spec.files()  # checks that the input exists before anything is created
        if not corpus_spec.is_default and config.vocab is None and config.train_vocab is None:
            raise DataError("%s: a corpus of your own needs a vocabulary: --vocab PATH (a vocab.txt or Hugging Face "
                            "tokenizer directory) or --train-vocab N (WordPiece with N tokens trained on this input)"
                            % config.input)
        return write_atomically(output, lambda temp: _prepare_into(config, corpus_spec, files, temp), "preparing")


DEFAULT_VOCAB = "default"
"""`--vocab default`: the default corpus' vocabulary, whatever the input."""


def _tokenizer(config: PrepareConfig, corpus_spec: CorpusSpec, default_docs: Optional[List[List[str]]]):
    """The TokenizerSpec `config` asks for (prepare() has refused a user corpus without a vocabulary)."""
    lower = config.lower_case != "no"
    if config.vocab is not None and config.vocab != DEFAULT_VOCAB:
        return load_tokenizer(config.vocab, config.lower_case)
    if config.train_vocab is None or corpus_spec.is_default:
        size = DEFAULT_VOCAB_SIZE if config.train_vocab is None else config.train_vocab
        sentences = [s for d in default_docs for s in d]
        if lower:  # the default vocabulary, byte for byte (tests/test_data_hashes.py)
            return train_default_vocab(sentences, size)
        return train_vocab(lambda: iter(sentences), size, lower_case=False,
                           source="WordPiece trained on the default corpus, %d tokens, cased")

    def sentences():
        return (s for d in corpus_spec.documents() for s in d)

    return train_vocab(sentences, config.train_vocab, lower_case=lower,
                       source="WordPiece trained on %s, %%d tokens, %s" % (config.input, "lower-cased" if lower
                                                                             else "cased"))


def _prepare_into(config: PrepareConfig, corpus_spec: CorpusSpec, files: List[str], temp: str) -> PrepareResult:
    lap = Phases()

    default_docs = list(default_documents()) if (corpus_spec.is_default or config.vocab == DEFAULT_VOCAB) else None
    spec = _tokenizer(config, corpus_spec, default_docs)
    lap("vocab")
    documents = iter(default_docs) if corpus_spec.is_default else corpus_spec.documents()
    del default_docs
    digest = CorpusDigest()
    work = os.path.join(temp, "work")
    os.makedirs(work)
    workers = Workers(config.packing.num_workers, start_tokenizer, (spec, config.recipe, config.packing.seed))
    try:
        paths, results = _run_shards(config, workers, documents, work, digest,
                                     _preload_planner if workers.pool is not None else None)
        shard_lengths = [r[0] for r in results]
        num_masked = sum(r[1] for r in results)
        del results
        if sum(len(lengths) for lengths in shard_lengths) == 0:
            raise DataError("%s: the corpus produced no instances (no non-empty documents)" % config.input)
        corpus = {"input": config.input, "format": config.format, "files": len(files),
                  "documents": digest.num_documents, "sentences": digest.num_sentences,
                  "characters": digest.num_chars, "sha256": digest.hexdigest(), "shards": len(paths),
                  "python": platform.python_version()}
        lap("instances")
        recipe = config.recipe

        def describe(directory: str, kind: str) -> dict:
            return {
                **spec.write_vocab(directory),
                "seed": config.packing.seed,
                "recipe": {
                    "masked_lm_prob": recipe.masked_lm_prob,
                    "max_predictions_per_seq": recipe.max_predictions,
                    "short_seq_prob": recipe.short_seq_prob,
                    "dupe_factor": recipe.dupe_factor,
                    "whole_word_masking": recipe.whole_word_masking,
                    "random_next_prob": 0.5,
                    "vocab_source": spec.source,
                },
                "corpus": corpus,
            }

        settings = PackSettings(
            max_seq_length=config.max_seq_length, vocab_size=len(spec.vocab),
            mlm_slots=lambda k: mlm_slots(config.max_seq_length, k, recipe.masked_lm_prob, recipe.max_predictions),
            options=config.packing, group_tokens=config.group_tokens, cls_id=spec.special_token_ids["[CLS]"])
        manifests = write_datasets(paths, shard_lengths, num_masked, settings, temp, workers, describe, lap)
    except BaseException:
        workers.abort()
        raise
    workers.close()
    shutil.rmtree(work)
    seconds = lap.total()
    return PrepareResult(manifests["packed"], manifests.get("padded"), seconds)
