"""Loading the PopTorch stand-in (tests/fake_poptorch/poptorch) and the tiny models and batches its tests use.

The stand-in is loaded from its file under the name ``poptorch`` and put in ``sys.modules`` for one test
(fresh each time); it is never on sys.path outside such a test, so tests/test_execution_ipu.py only ever
imports the real one. ``install`` also puts STAND_IN_DIR on sys.path for the test, as an installed poptorch
would be there: the worker process of an asynchronous DataLoader (started by forkserver or spawn) imports
poptorch to unpickle the loader. A subprocess gets it with ``PYTHONPATH=STAND_IN_DIR``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Dict, Sequence

import numpy as np
import torch
import transformers

from synthetic_packs import collate, synthetic_packs
from ipu_packing.model import PackedBertForPreTraining

STAND_IN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_poptorch")
S, K, M, V = 32, 3, 6, 64


def load_stand_in():
    """A fresh copy of the stand-in package (its modules loaded again from their files); sys.modules is left as
    it was (the package's modules are in it only while they load)."""
    package_dir = os.path.join(STAND_IN_DIR, "poptorch")
    ours = [n for n in sys.modules if n == "poptorch" or n.startswith("poptorch.")]
    saved = {n: sys.modules.pop(n) for n in ours}
    spec = importlib.util.spec_from_file_location("poptorch", os.path.join(package_dir, "__init__.py"),
                                                  submodule_search_locations=[package_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules["poptorch"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        for name in [n for n in sys.modules if n == "poptorch" or n.startswith("poptorch.")]:
            del sys.modules[name]
        sys.modules.update(saved)
    return module


def install(monkeypatch):
    """A fresh stand-in as ``poptorch`` for one test: in sys.modules and importable from sys.path (by the
    DataLoader's worker processes), both undone after the test. The fixture calls ``end_workers`` after it."""
    module = load_stand_in()
    monkeypatch.setitem(sys.modules, "poptorch", module)
    monkeypatch.syspath_prepend(STAND_IN_DIR)
    # Speed only: the forkserver (started once, by the first worker) imports torch, so each worker it forks
    # has it; every worker still re-imports the test process's __main__ and the stand-in itself.
    torch.multiprocessing.set_forkserver_preload(["torch"])
    return module


def end_workers(module) -> None:
    """End the worker of every asynchronous DataLoader the stand-in ``module`` made (PopTorch's atexit hook
    would keep each alive until the interpreter exits)."""
    for accessor in module.accessors:
        accessor.terminate()


def tiny_model(num_layers: int, seed: int = 0, attention: str = "dense",
               dropout: float = 0.1) -> PackedBertForPreTraining:
    """A BERT of ``num_layers`` layers, hidden 16: a shipped config's split at a size a test can trace."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=V, hidden_size=16, num_hidden_layers=num_layers, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=S, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )
    return PackedBertForPreTraining(config, attention=attention)


def packs(n: int, seed: int = 0):
    return synthetic_packs(n, S, K, M, V, np.random.default_rng(seed))


def host_call_batch(packs_per_call: int, seed: int = 0, distinct: int = 8) -> Dict[str, torch.Tensor]:
    """One host call's combined batch: ``distinct`` random packs repeated to ``packs_per_call`` rows."""
    base = collate(packs(min(distinct, packs_per_call), seed))
    reps = -(-packs_per_call // len(base["input_ids"]))
    return {k: torch.as_tensor(np.concatenate([v] * reps)[:packs_per_call]) for k, v in base.items()}


def splits(num_layers: int, max_ipus: int) -> Sequence[list]:
    """Every ``layers_per_ipu`` of ``num_layers`` layers over 1..max_ipus IPUs (empty IPUs included)."""
    out = []

    def rec(prefix, left, slots):
        if slots == 1:
            out.append(prefix + [left])
            return
        for n in range(left + 1):
            rec(prefix + [n], left - n, slots - 1)

    for ipus in range(1, max_ipus + 1):
        rec([], num_layers, ipus)
    return out
