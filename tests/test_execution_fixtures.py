"""Shared pieces of the execution tests: a tiny packed BERT and synthetic packs.

The model is ipu_packing.model.PackedBertForPreTraining when that package provides it; until then a small
stand-in written to the same contract (forward = embeddings -> get_attention_mask -> layers ->
pretraining_heads, transformers' BertForPreTraining module names, tied MLM decoder). The test in this file
checks that contract on whichever model is in use, since the pipeline split relies on it.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import torch
import transformers
from torch import nn

from ipu_packing.execution.runner_common import BATCH_FIELDS
from ipu_packing.execution.synthetic import collate, synthetic_packs

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


StandInOutput = namedtuple(
    "StandInOutput",
    "loss mlm_loss nsp_loss mlm_logits nsp_logits mlm_accuracy nsp_accuracy mlm_count nsp_count",
)


class _Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, input_ids, token_type_ids, position_ids):
        h = (
            self.word_embeddings(input_ids.long())
            + self.position_embeddings(position_ids.long())
            + self.token_type_embeddings(token_type_ids.long())
        )
        return self.LayerNorm(h)  # (B, S, H)


class _Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.num_attention_heads
        self.qkv = nn.Linear(c.hidden_size, 3 * c.hidden_size)
        self.out = nn.Linear(c.hidden_size, c.hidden_size)
        self.ln1 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.ffn = nn.Sequential(
            nn.Linear(c.hidden_size, c.intermediate_size), nn.GELU(), nn.Linear(c.intermediate_size, c.hidden_size)
        )
        self.ln2 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, h, mask):  # h (B, S, H), mask (B, 1, S, S) additive
        B, S, H = h.shape
        q, k, v = self.qkv(h).view(B, S, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (H // self.heads) ** 0.5 + mask, -1)
        a = (att @ v).transpose(1, 2).reshape(B, S, H)
        h = self.ln1(h + self.out(a))
        return self.ln2(h + self.ffn(h))


class _Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([_Layer(c) for _ in range(c.num_hidden_layers)])


class _Bert(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = _Embeddings(c)
        self.encoder = _Encoder(c)
        self.pooler = nn.Sequential(nn.Linear(c.hidden_size, c.hidden_size), nn.Tanh())

    @staticmethod
    def get_attention_mask(sequence_ids):  # (B, S) -> (B, 1, S, S): attend within one's own sequence only
        same = sequence_ids[:, None, :] == sequence_ids[:, :, None]
        return torch.where(same, 0.0, -1e4)[:, None].float()


class _Predictions(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transform = nn.Sequential(nn.Linear(c.hidden_size, c.hidden_size), nn.GELU(), nn.LayerNorm(c.hidden_size))
        self.decoder = nn.Linear(c.hidden_size, c.vocab_size)


class _Cls(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.predictions = _Predictions(c)
        self.seq_relationship = nn.Linear(c.hidden_size, 2)


class StandInPackedBert(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.bert = _Bert(c)
        self.cls = _Cls(c)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied

    def pretraining_heads(self, h, mlm_positions, mlm_labels, cls_positions, nsp_labels):
        H = h.shape[-1]
        masked = h.gather(1, mlm_positions.long()[..., None].expand(-1, -1, H))  # (B, M, H)
        mlm_logits = self.cls.predictions.decoder(self.cls.predictions.transform(masked))  # (B, M, V)
        cls_h = h.gather(1, cls_positions.long()[..., None].expand(-1, -1, H))  # (B, K, H)
        nsp_logits = self.cls.seq_relationship(self.bert.pooler(cls_h))  # (B, K, 2)
        mlm_labels, nsp_labels = mlm_labels.long(), nsp_labels.long()
        mlm_valid, nsp_valid = mlm_labels != -100, nsp_labels != -100
        mlm_count, nsp_count = mlm_valid.sum(), nsp_valid.sum()
        mlm_loss = nn.functional.cross_entropy(mlm_logits.flatten(0, 1).float(), mlm_labels.flatten(), ignore_index=-100)
        nsp_loss = nn.functional.cross_entropy(nsp_logits.flatten(0, 1).float(), nsp_labels.flatten(), ignore_index=-100)
        mlm_acc = ((mlm_logits.argmax(-1) == mlm_labels) & mlm_valid).sum() / mlm_count.clamp(min=1)
        nsp_acc = ((nsp_logits.argmax(-1) == nsp_labels) & nsp_valid).sum() / nsp_count.clamp(min=1)
        return StandInOutput(
            mlm_loss + nsp_loss, mlm_loss, nsp_loss, mlm_logits, nsp_logits, mlm_acc, nsp_acc, mlm_count, nsp_count
        )

    def forward(self, input_ids, token_type_ids, position_ids, sequence_ids, mlm_positions, mlm_labels, cls_positions, nsp_labels):
        h = self.bert.embeddings(input_ids, token_type_ids, position_ids)
        mask = self.bert.get_attention_mask(sequence_ids)
        for layer in self.bert.encoder.layer:
            h = layer(h, mask)
        return self.pretraining_heads(h, mlm_positions, mlm_labels, cls_positions, nsp_labels)


def model_class():
    try:
        from ipu_packing.model import PackedBertForPreTraining

        return PackedBertForPreTraining
    except ImportError:
        return StandInPackedBert


def build_model(num_layers: int = 2, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return model_class()(tiny_bert_config(num_layers))


def make_packs(num_packs: int, seed: int = 0, max_sequences_per_pack: int = MAX_SEQ):
    return synthetic_packs(
        num_packs, SEQ_LEN, max_sequences_per_pack, MAX_MASKED, tiny_bert_config().vocab_size, np.random.default_rng(seed)
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
