"""Loading the PopTorch stand-in (tests/fake_poptorch/poptorch) and the tiny models and batches its tests use.

The stand-in is loaded from its file under the name ``poptorch`` and put in ``sys.modules`` for one test
(fresh each time); it is never on sys.path, so tests/test_execution_ipu.py only ever imports the real one.
A subprocess gets it with ``PYTHONPATH=STAND_IN_DIR``.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Dict, Sequence

import numpy as np
import torch
import transformers

from ipu_packing.execution.synthetic import collate, synthetic_packs
from ipu_packing.model import PackedBertForPreTraining

STAND_IN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_poptorch")
S, K, M, V = 32, 3, 6, 64


def load_stand_in():
    spec = importlib.util.spec_from_file_location("poptorch", os.path.join(STAND_IN_DIR, "poptorch", "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_model(num_layers: int, seed: int = 0, attention: str = "dense", dropout: float = 0.1) -> PackedBertForPreTraining:
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
