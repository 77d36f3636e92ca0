"""`prepare`: corpus -> instances (worker processes over shards) -> one packing plan -> shards.

Order of work:

1. Check the output directory (refuse a non-empty one) and make a temporary sibling directory; the
   result is renamed into place only when everything succeeded, so a failure leaves nothing behind.
2. Load the tokenizer, or train the default vocabulary on the default corpus.
3. Stream documents from the input, group them into shards of about `shard_chars` characters, and
   build each shard's instances in a worker process (tokenize, choose segments, truncate, mask),
   each shard from its own generator seeded from (seed, shard index). At most two shards per worker
   are in flight, so memory is bounded by a few shards, not by the corpus. Each worker writes its
   instances to the temporary directory and returns only their lengths.
4. Merge the length histograms of all shards, make *one* packing plan for the whole corpus, and
   assign every sequence to a pack of it.
5. Write the packed dataset (K = max_sequences_per_pack) and the padded baseline (K = 1: every pack
   is one sequence, so the model has a single code path), each with its manifest and vocab.txt. The
   shards of both are built and written by the same worker processes, each shard hashed as it is
   written.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

import numpy as np

from ..packing.optimal import MAX_ROUNDS as LP_MAX_ROUNDS, TIME_LIMIT as LP_TIME_LIMIT
from .corpus import FORMATS, CorpusDigest, CorpusSpec, default_documents, shard_documents
from .errors import DataError
from .format import FORMAT_VERSION, VOCAB, mlm_slots, pack_statistics, sha256_file, write_manifest
from .instances import RecipeConfig, Vocabulary, create_instances, tokenize_documents
from .packs import InstanceStore, PackLayout, ShardTask, save_instances, shard_tasks, write_shard
from .vocab import DEFAULT_VOCAB_SIZE, LOWER_CASE_CHOICES, TokenizerSpec, load_tokenizer, train_default_vocab


@dataclass
class PrepareConfig:
    """Everything `python -m ipu_packing.data prepare` takes."""

    input: str
    """Corpus: a file, a directory, a glob, or "default" (embedded corpus from the CPython install)."""
    output: str
    """Output directory (must not exist or be empty); gets packed/ and padded/."""
    max_seq_length: int = 128
    """S."""
    max_sequences_per_pack: int = 3
    """K for the packed dataset (the padded baseline always has K = 1)."""
    vocab: Optional[str] = None
    """vocab.txt or Hugging Face tokenizer directory; None trains the default WordPiece vocabulary."""
    vocab_size: int = DEFAULT_VOCAB_SIZE
    """Size of the default vocabulary (only when vocab is None)."""
    lower_case: str = "auto"
    """For a bare vocab.txt: "auto" (uncased unless it has upper-case tokens), "yes" or "no"."""
    format: str = "auto"
    """Input format: "auto", "bert" or "text" (see corpus.py)."""
    seed: int = 12345
    """Seed of everything random; same seed and input -> byte-identical output."""
    workers: int = 0
    """Worker processes; 0 means min(4, CPUs). Does not change the output."""
    dupe_factor: int = 10
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: Optional[int] = None
    """None: ceil(masked_lm_prob * max_seq_length)."""
    whole_word_masking: bool = False
    packing_algorithm: str = "optimal"
    """Algorithm of ipu_packing.packing.plan_packing."""
    lp_max_rounds: int = LP_MAX_ROUNDS
    """optimal: rounds of column generation at most (its stopping rule; see packing/optimal.py)."""
    lp_time_limit: Optional[float] = LP_TIME_LIMIT
    """optimal: safety-net seconds, or None; a plan it cuts short depends on the machine's speed."""
    shard_chars: int = 1 << 17
    """Characters of text per instance-building shard (the unit of work and of RNG seeding)."""
    shard_bytes: int = 64 << 20
    """Approximate size of each output shard file."""
    padded: bool = True
    """Also write the padded baseline (padded/)."""
    progress: bool = True
    """Progress bars on stderr (only when it is a terminal)."""

    def __post_init__(self) -> None:
        if self.max_sequences_per_pack < 1:
            raise DataError("--max-sequences-per-pack must be >= 1, got %d" % self.max_sequences_per_pack)
        if self.workers < 0:
            raise DataError("--workers must be >= 0, got %d" % self.workers)
        if self.vocab_size < 100:
            raise DataError("--vocab-size must be >= 100, got %d" % self.vocab_size)
        if self.lower_case not in LOWER_CASE_CHOICES:
            raise DataError("--lower-case must be one of %s" % "/".join(LOWER_CASE_CHOICES))
        if self.format not in FORMATS:
            raise DataError("--format must be one of %s" % "/".join(FORMATS))
        if self.shard_chars < 1 or self.shard_bytes < 1:
            raise DataError("shard sizes must be >= 1")
        if not 0 <= self.seed < 2 ** 63:
            raise DataError("--seed must be in [0, 2**63), got %d" % self.seed)
        from ..packing import ALGORITHMS

        if self.packing_algorithm not in ALGORITHMS:
            raise DataError("--packing-algorithm must be one of %s, got %r" % ("/".join(ALGORITHMS), self.packing_algorithm))
        self.recipe  # validates the recipe fields

    @property
    def recipe(self) -> RecipeConfig:
        return RecipeConfig(max_seq_length=self.max_seq_length, masked_lm_prob=self.masked_lm_prob,
                            max_predictions_per_seq=self.max_predictions_per_seq,
                            short_seq_prob=self.short_seq_prob, dupe_factor=self.dupe_factor,
                            whole_word_masking=self.whole_word_masking)

    @property
    def num_workers(self) -> int:
        return self.workers or min(4, os.cpu_count() or 1)


# ---------------------------------------------------------------------------------------------------
# seeds: one root seed, independent streams for each use, identified by a fixed spawn key

def shard_rng(seed: int, shard: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, shard)))


def derived_seed(seed: int, purpose: int) -> int:
    return int(np.random.SeedSequence(seed, spawn_key=(1, purpose)).generate_state(1, np.uint64)[0] >> np.uint64(1))


# ---------------------------------------------------------------------------------------------------
# workers

_WORKER: Dict[str, object] = {}


def _init_worker(spec: TokenizerSpec, recipe: RecipeConfig, seed: int) -> None:
    _WORKER.clear()
    _WORKER.update(spec=spec, recipe=recipe, seed=seed, tokenizer=None)


def _build_shard(index: int, documents: List[List[str]], directory: str) -> np.ndarray:
    """Worker: one shard's documents -> instance files in `directory`; returns the lengths."""
    spec = _WORKER["spec"]
    if _WORKER["tokenizer"] is None:
        ids = spec.special_token_ids
        _WORKER["tokenizer"] = spec.encoder()
        _WORKER["vocab"] = Vocabulary(cls_id=ids["[CLS]"], sep_id=ids["[SEP]"], mask_id=ids["[MASK]"],
                                      continuation=spec.continuation_mask(), replacement_ids=spec.replacement_ids())
    shard = tokenize_documents(documents, _WORKER["tokenizer"])
    instances = create_instances(shard, _WORKER["recipe"], _WORKER["vocab"], shard_rng(_WORKER["seed"], index))
    save_instances(directory, instances)
    return instances.lengths


def _write_shard(directories: List[str], task: ShardTask, layout: PackLayout) -> dict:
    """Worker: build and write one output shard (the instance store is loaded once per process)."""
    key = tuple(directories)
    if _WORKER.get("store_key") != key:
        _WORKER.update(store=InstanceStore(directories), store_key=key)
    return write_shard(_WORKER["store"], task, layout)


class _Immediate:
    """A finished 'future' for work run in this process."""

    def __init__(self, value) -> None:
        self.value = value

    def result(self):
        return self.value


class Workers:
    """The worker processes of one preparation (or this process alone when workers == 1).

    `map_bounded` keeps at most two tasks per worker in flight, so memory holds a few shards,
    never the corpus, while the results come back in submission order.
    """

    def __init__(self, count: int, spec: TokenizerSpec, recipe: RecipeConfig, seed: int) -> None:
        self.count = count
        self.pool = None
        _init_worker(spec, recipe, seed)
        if count > 1:
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers are the parallelism
            import tokenizers  # noqa: F401  (imported once here, inherited by the forked workers)
            self.pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context(method),
                                            initializer=_init_worker, initargs=(spec, recipe, seed))

    def start(self) -> None:
        """Start the worker processes now (the pool would start them at the first task)."""
        if self.pool is not None:
            self.pool.submit(os.getpid).result()

    def map_bounded(self, fn, argument_tuples: Iterable[tuple], on_result=None) -> list:
        results, pending = [], []
        for args in argument_tuples:
            pending.append(self.pool.submit(fn, *args) if self.pool else _Immediate(fn(*args)))
            while len(pending) >= 2 * self.count:
                results.append(pending.pop(0).result())
                if on_result:
                    on_result(results[-1])
        for future in pending:
            results.append(future.result())
            if on_result:
                on_result(results[-1])
        return results

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(desc: str, enabled: bool, unit: str, total: Optional[int] = None):
    """A tqdm bar on stderr (shown only when it is a terminal); without progress, tqdm is not even
    imported."""
    if not enabled or not sys.stderr.isatty():
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(desc=desc, total=total, unit=unit, disable=None if enabled else True, file=sys.stderr,
                leave=False)


def _run_shards(config: PrepareConfig, workers: Workers, documents, work: str, digest: CorpusDigest,
                background=None) -> List[str]:
    """Build every shard's instances; returns the instance directories in shard order. `background`
    (optional) runs in a thread of this process while the workers build the shards."""
    directories: List[str] = []

    def tasks():
        for index, docs in enumerate(shard_documents(documents, config.shard_chars, digest)):
            directories.append(os.path.join(work, "instances-%05d" % index))
            yield index, docs, directories[-1]

    bar = _progress("instances", config.progress, " shards")
    thread = None
    if background is not None:
        workers.start()  # fork the worker processes first: never fork while a thread imports
        thread = threading.Thread(target=background, daemon=True)
        thread.start()
    workers.map_bounded(_build_shard, tasks(), on_result=lambda _: bar.update(1))
    bar.close()
    if thread is not None:
        thread.join()
    return directories


def _preload_planner() -> None:
    """Load what the planner needs (scipy's HiGHS and NNLS extension modules, without importing
    scipy.optimize) while the workers build instances, so it is not on the critical path between
    the instance and the planning phases."""
    try:
        from ..packing._solvers import highs_core, nnls_solver

        highs_core()
        nnls_solver()
    except ImportError:  # the planner reports it, if it needs scipy
        pass


# ---------------------------------------------------------------------------------------------------
# the whole preparation


def _check_output(path: str) -> None:
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise DataError("%s: exists and is not a directory (refusing to overwrite)" % path)
        if os.listdir(path):
            raise DataError("%s: directory exists and is not empty (refusing to overwrite)" % path)


def _dataset_tasks(directory: str, members: np.ndarray, offsets: np.ndarray, pack_order: np.ndarray, k: int,
                   config: PrepareConfig):
    os.makedirs(directory)
    recipe = config.recipe
    layout = PackLayout(config.max_seq_length, k, mlm_slots(config.max_seq_length, k, recipe.masked_lm_prob,
                                                            recipe.max_predictions))
    return layout, shard_tasks(members, offsets, pack_order, layout, directory, config.shard_bytes)


def _finish_dataset(directory: str, kind: str, layout: PackLayout, shards: List[dict], store: InstanceStore,
                    offsets: np.ndarray, algorithm: str, config: PrepareConfig, spec: TokenizerSpec,
                    corpus: dict) -> dict:
    """Write vocab.txt and manifest.json next to the shards."""
    k = layout.max_sequences_per_pack
    recipe = config.recipe
    with open(os.path.join(directory, VOCAB), "w", encoding="utf-8", newline="\n") as f:
        f.write(spec.vocab_text())
    manifest = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "max_seq_length": config.max_seq_length,
        "max_sequences_per_pack": k,
        "mlm_slots": layout.mlm_slots,
        "vocab_file": VOCAB,
        "vocab_size": len(spec.vocab),
        "vocab_checksum": sha256_file(os.path.join(directory, VOCAB)),
        "do_lower_case": bool(spec.do_lower_case),
        "special_token_ids": spec.special_token_ids,
        "packing_algorithm": algorithm,
        "seed": config.seed,
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
        "shards": shards,
    }
    manifest.update(pack_statistics(store.lengths, store.mlm_counts, np.diff(offsets), config.max_seq_length, k))
    write_manifest(directory, manifest)
    return manifest


@dataclass
class PrepareResult:
    packed: dict
    """Manifest of packed/."""
    padded: Optional[dict]
    """Manifest of padded/ (None with padded=False)."""
    seconds: Dict[str, float]
    """Wall-clock seconds per phase: vocab, instances, plan, write, total."""


def prepare(config: PrepareConfig) -> PrepareResult:
    """Run the whole preparation (see the module notes)."""
    from ..packing import PackAssignment, assign_sequences, histogram_from_lengths, plan_packing

    output = os.path.abspath(config.output)
    _check_output(output)
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    seconds: Dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        seconds[name] = now - clock[0]
        clock[0] = now

    start = clock[0]
    temp = tempfile.mkdtemp(prefix="." + os.path.basename(output) + ".tmp-", dir=parent)
    try:
        corpus_spec = CorpusSpec(config.input, config.format)
        files = corpus_spec.files()  # checks that the input exists before any work
        default_docs = list(default_documents()) if (corpus_spec.is_default or config.vocab is None) else None
        if config.vocab is not None:
            spec = load_tokenizer(config.vocab, config.lower_case)
        else:
            spec = train_default_vocab([s for d in default_docs for s in d], config.vocab_size)
        lap("vocab")
        documents = iter(default_docs) if corpus_spec.is_default else corpus_spec.documents()
        digest = CorpusDigest()
        work = os.path.join(temp, "work")
        os.makedirs(work)
        workers = Workers(config.num_workers, spec, config.recipe, config.seed)
        try:
            directories = _run_shards(config, workers, documents, work, digest,
                                      _preload_planner if workers.pool is not None else None)
            store = InstanceStore(directories)
            if len(store) == 0:
                raise DataError("%s: the corpus produced no instances (no non-empty documents)" % config.input)
            corpus = {"input": config.input, "format": config.format, "files": len(files),
                      "documents": digest.num_documents, "sentences": digest.num_sentences,
                      "characters": digest.num_chars, "sha256": digest.hexdigest(), "shards": len(directories),
                      "python": platform.python_version()}
            lap("instances")

            histogram = histogram_from_lengths(store.lengths, config.max_seq_length)
            k = config.max_sequences_per_pack
            plan = plan_packing(histogram, config.max_seq_length, k, algorithm=config.packing_algorithm,
                                max_rounds=config.lp_max_rounds, time_limit=config.lp_time_limit)
            assignment = assign_sequences(plan, store.lengths, derived_seed(config.seed, 0))
            members = np.asarray(assignment.indices, dtype=np.int64)
            offsets = np.asarray(assignment.offsets, dtype=np.int64)
            if len(members) != len(store) or np.bincount(members, minlength=len(store)).max() != 1:
                raise RuntimeError("packing assignment does not place every sequence exactly once")
            lap("plan")

            rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(2,)))
            datasets = [("packed", members, offsets, rng.permutation(len(offsets) - 1), k, plan.algorithm)]
            if config.padded:
                # K = 1: every plan is one sequence per pack, so the assignment is written directly.
                single = PackAssignment(indices=np.arange(len(store), dtype=np.int64),
                                        offsets=np.arange(len(store) + 1, dtype=np.int64))
                datasets.append(("padded", single.indices, single.offsets, rng.permutation(len(store)), 1,
                                 "none (one sequence per row)"))
            jobs = []  # (kind, layout, tasks) ; all shards of both datasets go through the workers together
            for kind, kind_members, kind_offsets, order, kind_k, _ in datasets:
                layout, tasks = _dataset_tasks(os.path.join(temp, kind), kind_members, kind_offsets, order, kind_k,
                                               config)
                jobs.append((kind, layout, tasks))
            bar = _progress("writing", config.progress, " packs", total=sum(len(d[3]) for d in datasets))
            entries = workers.map_bounded(
                _write_shard, ((directories, task, layout) for _, layout, tasks in jobs for task in tasks),
                on_result=lambda entry: bar.update(entry["num_packs"]))
            bar.close()
            manifests = {}
            for (kind, layout, tasks), (_, _, kind_offsets, _, _, algorithm) in zip(jobs, datasets):
                shards, entries = entries[:len(tasks)], entries[len(tasks):]
                manifests[kind] = _finish_dataset(os.path.join(temp, kind), kind, layout, shards, store, kind_offsets,
                                                  algorithm, config, spec, corpus)
            lap("write")
        finally:
            workers.close()
        del store
        shutil.rmtree(work)
        if os.path.isdir(output):
            os.rmdir(output)  # empty (checked above)
        os.rename(temp, output)
        seconds["total"] = time.perf_counter() - start
        return PrepareResult(manifests["packed"], manifests.get("padded"), seconds)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
