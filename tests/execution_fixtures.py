"""Shared pieces of the execution tests: a tiny ipu_packing.model.PackedBertForPreTraining, synthetic packs and
a free TCP port for a pair of gloo processes; and for fine-tuning, a tiny PackedBertForSequenceClassification
with packs in the classification field set (tests/test_execution_distributed_tasks.py).

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
from ipu_packing.data.format import FIELD_SETS, IGNORE_INDEX
from ipu_packing.model import PackedBertForPreTraining, PackedBertForSequenceClassification

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


def build_classifier(problem_type: str = "single_label_classification", num_labels: int = 3, num_layers: int = 2,
                     seed: int = 0) -> nn.Module:
    """The tiny classifier (dropout off, as build_model) from a fixed seed."""
    torch.manual_seed(seed)
    config = tiny_bert_config(num_layers)
    config.num_labels = num_labels
    config.problem_type = problem_type
    return PackedBertForSequenceClassification(config)


def make_classification_packs(num_packs: int, problem_type: str = "single_label_classification",
                              num_labels: int = 3, seed: int = 0):
    """make_packs' packs (1..MAX_SEQ sequences each, so some slots empty) in the classification field set
    (data/format.py): cls_positions, labels (random; an empty slot's IGNORE_INDEX for classes, 0 for reals),
    example_ids (a running count; -1 in an empty slot)."""
    rng = np.random.default_rng(seed + 1000)
    out, example = [], 0
    for pack in make_packs(num_packs, seed):
        used = pack["nsp_labels"] != IGNORE_INDEX  # (K,): slot j holds a sequence exactly when j < k
        k = int(used.sum())
        if problem_type == "single_label_classification":
            labels = np.where(used, rng.integers(0, num_labels, size=used.shape), IGNORE_INDEX).astype(np.int64)
        else:  # regression: (K,) for one label, (K, L) for more
            shape = used.shape if num_labels == 1 else used.shape + (num_labels,)
            values = rng.normal(size=shape).astype(np.float32)
            labels = np.where(used.reshape(used.shape + (1,) * (values.ndim - 1)), values, 0).astype(np.float32)
        example_ids = np.where(used, example + np.arange(len(used)), -1).astype(np.int32)
        example += k
        fields = {name: pack[name] for name in FIELD_SETS["classification"] if name in pack}
        fields.update(labels=labels, example_ids=example_ids)
        out.append(fields)
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on (for torch.distributed's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_with_sgd(model: nn.Module, config, packs, steps: int, counts=None):
    """``steps`` optimizer steps of ``model`` on ``packs`` through the runner ``config`` asks for, with SGD and
    momentum (linear in the gradient: the distributed tests' reason) and a decaying schedule; returns (the
    synced state dict, the per-step losses). ``counts``: a list that gets each step's (sequences, tokens, packs)."""
    from ipu_packing.execution import make_runner
    from synthetic_packs import PackDataset

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    runner = make_runner(model, optimizer, config, scheduler=scheduler)
    losses = []
    for batch in runner.dataloader(PackDataset(packs)):
        metrics = runner.train_step(batch)
        losses.append(metrics.loss)
        if counts is not None:
            counts.append((metrics.sequences, metrics.tokens, metrics.packs))
    assert len(losses) == steps
    runner.sync_model()
    return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}, losses
