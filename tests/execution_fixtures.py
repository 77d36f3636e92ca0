"""Shared pieces of the execution tests: a tiny ipu_packing.model.PackedBertForPreTraining, synthetic packs and
a free TCP port for a pair of gloo processes.

There is no stand-in: when the model package is broken, every execution test that runs a model fails.
tests/test_model_stages.py checks what the pipeline split relies on: forward = embeddings ->
get_attention_mask -> layers -> pretraining_heads, with the MLM decoder tied to the word embeddings.
"""

from __future__ import annotations

import socket

import numpy as np
import torch
import transformers
from torch import nn

from synthetic_packs import synthetic_packs
from ipu_packing.model import PackedBertForPreTraining

SEQ_LEN, MAX_SEQ, MAX_MASKED = 32, 3, 6


def tiny_bert_config(num_layers: int = 2) -> transformers.BertConfig:
    # Dropout off: distributed runs draw different random streams, equivalence needs determinism.
    return transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=SEQ_LEN,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def build_model(num_layers: int = 2, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return PackedBertForPreTraining(tiny_bert_config(num_layers))


def make_packs(num_packs: int, seed: int = 0, max_sequences_per_pack: int = MAX_SEQ):
    return synthetic_packs(
        num_packs, SEQ_LEN, max_sequences_per_pack, MAX_MASKED, tiny_bert_config().vocab_size,
        np.random.default_rng(seed),
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on (for torch.distributed's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
