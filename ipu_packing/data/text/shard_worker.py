"""`prepare`'s work in the worker processes (write/workers.py): one shard's documents -> its instance file.

Each worker loads the tokenizer once (`start_tokenizer` sets what it needs; the tokenizer itself is made
at the first shard) and builds every shard from its own generator, seeded from (seed, shard index), so a
shard's instances do not depend on which worker builds it or on how many workers there are.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from ..instance_files import save_instances
from ..vocab import TokenizerSpec
from .recipe import RecipeConfig, Vocabulary, create_instances, tokenize_documents


def shard_rng(seed: int, shard: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, shard)))


_WORKER: Dict[str, object] = {}


def start_tokenizer(spec: TokenizerSpec, recipe: RecipeConfig, seed: int) -> None:
    """A worker's state for `build_shard` (the tokenizer is made at the first shard)."""
    _WORKER.clear()
    _WORKER.update(spec=spec, recipe=recipe, seed=seed, tokenizer=None)


def build_shard(index: int, documents: List[List[str]], path: str):
    """Worker: one shard's documents -> its instance file; returns (lengths, MLM predictions)."""
    spec = _WORKER["spec"]
    if _WORKER["tokenizer"] is None:
        ids = spec.special_token_ids
        _WORKER["tokenizer"] = spec.encoder()
        _WORKER["vocab"] = Vocabulary(cls_id=ids["[CLS]"], sep_id=ids["[SEP]"], mask_id=ids["[MASK]"],
                                      continuation=spec.continuation_mask(), replacement_ids=spec.replacement_ids())
    shard = tokenize_documents(documents, _WORKER["tokenizer"])
    instances = create_instances(shard, _WORKER["recipe"], _WORKER["vocab"], shard_rng(_WORKER["seed"], index))
    save_instances(path, instances, len(spec.vocab))
    return instances.lengths.astype(_length_dtype(_WORKER["recipe"].max_seq_length)), int(instances.mlm_counts.sum())


def _length_dtype(max_seq_length: int) -> np.dtype:
    return np.dtype(np.uint16 if max_seq_length < 1 << 16 else np.int32)
