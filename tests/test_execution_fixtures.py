"""Shared pieces of the execution tests: a tiny ipu_packing.model.PackedBertForPreTraining and synthetic packs.

There is no stand-in: when the model package is broken, every execution test that runs a model fails. The
test in this file checks what the pipeline split relies on: forward = embeddings -> get_attention_mask ->
layers -> pretraining_heads, with the MLM decoder tied to the word embeddings.
"""

from __future__ import annotations

import numpy as np
import torch
import transformers
from torch import nn

from ipu_packing.execution.runner_common import BATCH_FIELDS
from synthetic_packs import collate, synthetic_packs
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


def test_forward_is_the_composition_the_pipeline_splits():
    model = build_model()
    batch = {k: torch.as_tensor(v) for k, v in collate(make_packs(4)).items()}
    whole = model(**batch)
    h = model.bert.embeddings(batch["input_ids"], batch["token_type_ids"], batch["position_ids"])
    mask = model.bert.get_attention_mask(batch["sequence_ids"])
    for layer in model.bert.encoder.layer:
        h = layer(h, mask)
    parts = model.pretraining_heads(h, *(batch[k] for k in BATCH_FIELDS[4:]))
    assert torch.equal(whole.loss, parts.loss)
    assert torch.equal(whole.mlm_logits, parts.mlm_logits)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
