"""The packing phase of `prepare`, the same for every source of instances: instance files and their
lengths -> one plan -> the packed dataset and the padded baseline, shards and manifests.

The plan is made from the lengths alone (2 bytes an instance, the only corpus-sized arrays, held
once: by the caller), and
the instances move through the two streaming passes of data/write/packs.py (scatter groups of input
shards to spill files, then gather each output shard), each a task of the worker pool, so no
process holds more than a group or an output shard however large the corpus.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

from ...packing.optimal import MAX_ROUNDS as LP_MAX_ROUNDS, TIME_LIMIT as LP_TIME_LIMIT
from ...errors import DataError
from ..format import FORMAT_VERSION, PRETRAINING, FieldLayout, field_dtypes, pack_statistics, write_manifest
from ..limits import MAX_SEQUENCES_PER_PACK, MAX_WORKERS, check_at_most
from .packs import PackLayout, dataset_spec, gather_shard, scatter
from .workers import Workers, progress


# ---------------------------------------------------------------------------------------------------
# seeds: one root seed, independent streams for each use, identified by a fixed spawn key

def derived_seed(seed: int, purpose: int) -> int:
    return int(np.random.SeedSequence(seed, spawn_key=(1, purpose)).generate_state(1, np.uint64)[0] >> np.uint64(1))


@dataclass
class PackingOptions:
    """How the packs are planned and written: the options `prepare` and `pack` share (each command line's
    --max-sequences-per-pack, --seed, --workers, --packing-algorithm, --lp-*, --shard-mb, --no-padded,
    --quiet)."""

    max_sequences_per_pack: int = 3
    """K of the packed dataset (the padded baseline has K = 1)."""
    seed: int = 12345
    """Root seed of the assignment and the pack order (`prepare` also seeds its instances with it); same
    seed and input -> byte-identical output."""
    workers: int = 0
    """Worker processes; 0 means min(4, CPUs) (`num_workers`). Does not change the output."""
    packing_algorithm: str = "optimal"
    """Algorithm of ipu_packing.packing.plan_packing."""
    lp_max_rounds: int = LP_MAX_ROUNDS
    """optimal: rounds of column generation at most (its stopping rule; see packing/optimal.py)."""
    lp_time_limit: Optional[float] = LP_TIME_LIMIT
    """optimal: safety-net seconds, or None; a plan it cuts short depends on the machine's speed."""
    shard_bytes: int = 64 << 20
    """Approximate size of each output shard file."""
    padded: bool = True
    """Also write the padded baseline (padded/)."""
    progress: bool = True
    """Progress bars on stderr (only when it is a terminal)."""

    def __post_init__(self) -> None:
        if self.max_sequences_per_pack < 1:
            raise DataError("--max-sequences-per-pack must be >= 1, got %d" % self.max_sequences_per_pack)
        check_at_most("--max-sequences-per-pack", self.max_sequences_per_pack, MAX_SEQUENCES_PER_PACK,
                      "sequence ids are stored in one byte")
        if self.workers < 0:
            raise DataError("--workers must be >= 0, got %d" % self.workers)
        check_at_most("--workers", self.workers, MAX_WORKERS, "worker processes")
        if not 0 <= self.seed < 2 ** 63:
            raise DataError("--seed must be in [0, 2**63), got %d" % self.seed)
        if self.shard_bytes < 1:
            raise DataError("--shard-mb must be > 0 (got %r bytes)" % self.shard_bytes)
        from ...packing import ALGORITHMS

        if self.packing_algorithm not in ALGORITHMS:
            raise DataError("--packing-algorithm must be one of %s, got %r"
                            % ("/".join(ALGORITHMS), self.packing_algorithm))

    @property
    def num_workers(self) -> int:
        return self.workers or min(4, os.cpu_count() or 1)


@dataclass
class PackSettings:
    """What the packing phase (`write_datasets`) needs besides the instances; the same for every
    source of instances (text through `prepare`, or existing datasets)."""

    max_seq_length: int
    """S."""
    vocab_size: int
    """V: token ids lie in [0, V)."""
    mlm_slots: Callable[[int], int]
    """M for a dataset of K sequences per pack: mlm_slots(K)."""
    options: PackingOptions
    """K, the seed, the algorithm, the shard size, whether to write padded/."""
    group_tokens: int = 1 << 21
    """Tokens of instances per scatter task (consecutive input shards; bounds a worker's memory)."""
    cls_id: Optional[int] = None
    """The vocabulary's [CLS]: every shard written is checked to start each sequence with it (None: not)."""
    task: FieldLayout = PRETRAINING
    """The packs' field set (format.FIELD_SETS): a task's instances carry its per-sequence fields as extra columns,
    and its manifest has no MLM keys (`describe` gives its `task` key)."""


def _finish_dataset(directory: str, kind: str, layout: PackLayout, shards: List[dict], histogram: np.ndarray,
                    num_masked: int, pack_sizes: np.ndarray, algorithm: str, describe: Callable[[str, str], dict]
                    ) -> dict:
    """Write the manifest next to the shards: the source's fields (`describe(directory, kind)`, which
    also writes vocab.txt) with the layout's and the packs' counts."""
    k = layout.max_sequences_per_pack
    manifest = {"format_version": FORMAT_VERSION, "kind": kind, "max_seq_length": layout.max_seq_length,
                "max_sequences_per_pack": k}
    if layout.task.is_pretraining:
        manifest["mlm_slots"] = layout.mlm_slots
    manifest.update(describe(directory, kind))
    manifest["packing_algorithm"] = algorithm
    manifest["shards"] = shards
    manifest["field_dtypes"] = {name: dtype.str for name, dtype in field_dtypes(layout.max_seq_length, k,
                                                                                layout.vocab_size, layout.task).items()}
    # pack_statistics only sums the MLM counts, so their total stands in for them
    manifest.update(pack_statistics(None, np.array([num_masked], dtype=np.int64), None, layout.max_seq_length, k,
                                    sequences_per_pack_histogram=pack_sizes, sequence_length_histogram=histogram))
    if not layout.task.is_pretraining:
        del manifest["num_masked_tokens"]
    write_manifest(directory, manifest)
    return manifest


def write_datasets(paths: List[str], shard_lengths: List[np.ndarray], num_masked: int, settings: PackSettings,
                   temp: str, workers: Workers, describe: Callable[[str, str], dict],
                   lap: Callable[[str], None] = lambda name: None) -> Dict[str, dict]:
    """The packing phase, the same for every source of instances: instance files (`paths`, written
    with packs.save_instances, in order; each is removed once read) and their lengths -> one plan
    -> temp/packed (and temp/padded) with shards and manifests. Returns the manifests by kind.

    `describe(directory, kind)` gives the manifest's source fields (vocab_file, vocab_size,
    vocab_checksum, do_lower_case, special_token_ids, seed, and recipe and corpus for pretraining or task for a
    task) and writes the vocabulary file into `directory`. `lap(phase)` is called after the plan, scatter and
    write phases.
    """
    from ...packing import plan_packing
    from ...packing.permutation import KeyedPermutation
    from ...packing.slots import SlotMap

    options = settings.options
    s, k = settings.max_seq_length, options.max_sequences_per_pack
    # the lengths (2 bytes an instance, held by the caller) are all the plan needs: their histogram
    groups, histogram = _groups(shard_lengths, settings.group_tokens, s)
    num_sequences = int(histogram.sum())
    plan = plan_packing(histogram, s, k, algorithm=options.packing_algorithm,
                        max_rounds=options.lp_max_rounds, time_limit=options.lp_time_limit)
    slot_map = SlotMap(plan, derived_seed(options.seed, 0))
    datasets = [("packed", k, slot_map.num_packs, slot_map, None, plan.algorithm,
                 slot_map.sequences_per_pack_histogram(k))]
    if options.padded:
        # K = 1: every pack is one sequence, written in a seeded random order
        datasets.append(("padded", 1, num_sequences, None, KeyedPermutation(num_sequences, options.seed, 2),
                         "none (one sequence per row)", np.array([num_sequences], dtype=np.int64)))
    jobs = []  # (kind, layout, DatasetSpec, sequences-per-pack histogram, algorithm)
    for kind, kind_k, num_packs, kind_map, order, algorithm, pack_sizes in datasets:
        os.makedirs(os.path.join(temp, kind))
        layout = PackLayout(s, kind_k, settings.mlm_slots(kind_k), settings.vocab_size, settings.cls_id,
                            settings.task, num_sequences)
        spec = dataset_spec(kind, layout, options.shard_bytes, num_packs, kind_map, order)
        jobs.append((kind, layout, spec, pack_sizes, algorithm))
    lap("plan")

    # scatter: each group of input shards to one spill file per dataset, by output shard
    spill_dir = os.path.join(temp, "work", "spill")
    os.makedirs(spill_dir)

    def spill(kind: str, g: int) -> str:
        return os.path.join(spill_dir, "%s-%05d.bin" % (kind, g))

    workers.map_bounded(scatter, ((paths[a:b], first, before, [(spill(kind, g), spec) for kind, _, spec, _, _ in jobs],
                                    settings.vocab_size) for g, (a, b, first, before) in enumerate(groups)))
    lap("scatter")

    # gather: every output shard from its blocks of the spill files
    bar = progress("writing", options.progress, " packs", total=sum(spec.num_packs for _, _, spec, _, _ in jobs))
    entries = workers.map_bounded(
        gather_shard, (([spill(kind, g) for g in range(len(groups))], j, spec, layout,
                        os.path.join(temp, kind, "shard-%05d.npy" % j))
                       for kind, layout, spec, _, _ in jobs for j in range(spec.num_shards)),
        on_result=lambda entry: bar.update(entry["num_packs"]))
    bar.close()
    manifests = {}
    for kind, layout, spec, pack_sizes, algorithm in jobs:
        shards, entries = entries[:spec.num_shards], entries[spec.num_shards:]
        manifests[kind] = _finish_dataset(os.path.join(temp, kind), kind, layout, shards, histogram, num_masked,
                                          pack_sizes, algorithm, describe)
    lap("write")
    shutil.rmtree(spill_dir)
    return manifests


def _groups(shard_lengths: List[np.ndarray], group_tokens: int, max_seq_length: int):
    """Consecutive input shards in groups of about `group_tokens` tokens (the scatter's unit), and
    the histogram of all the lengths (each shard's checked against 1..S), in one pass: ([(first
    shard, end shard, first instance, (S,) instances of each length before the group)], (S,))."""
    from ...packing import histogram_from_lengths

    groups, before, first, a, tokens = [], np.zeros(max_seq_length, dtype=np.int64), 0, 0, 0
    start_before, start_first = before.copy(), 0
    for i, lengths in enumerate(shard_lengths):
        tokens += int(np.sum(lengths, dtype=np.int64))
        before += histogram_from_lengths(lengths, max_seq_length)
        first += len(lengths)
        if tokens >= group_tokens or i == len(shard_lengths) - 1:
            groups.append((a, i + 1, start_first, start_before))
            a, tokens, start_before, start_first = i + 1, 0, before.copy(), first
    return groups, before
