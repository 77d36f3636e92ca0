"""Self-attention of one encoder layer: the query, key and value projections as three Linear(H, H) under
transformers' names, or (``config.fused_qkv``) as one Linear(H, 3H), then attention (``attention.attend``).

Fused (``BertFusedSelfAttention``): one (B, S, H) x (H, 3H) matmul instead of three, whose output is sliced
into q, k, v (views, no copy); in the backward the input's gradient is one (B, S, 3H) x (3H, H) matmul
instead of three (B, S, H) partial gradients and their sum. Graphcore's app fuses the same way for speed
(``BertFusedSelfAttention``, nlp/bert/pytorch/bert_fused_attention.py:24-42, installed by
``parallelize``, modeling.py:155-159), with two differences: it keeps three parameters and concatenates
their weights in every forward (bert_fused_attention.py:26-31), where this module holds one (3H, H) weight
and a (3H,) bias; so here LAMB's trust ratio is taken over the fused tensor, not over each of q, k, v.

The weight is ``[query.weight; key.weight; value.weight]`` stacked on dim 0 and the bias likewise (the order
of bert_fused_attention.py:26-31), so output columns [0, H) are q, [H, 2H) k, [2H, 3H) v. Checkpoints keep
transformers' layout: each module's ``_load_from_state_dict`` accepts either layout (concatenating or
splitting), so ``load_state_dict`` of a transformers state dict works with either model, and
``hf_layout`` turns a fused state dict back into query/key/value for ``save_pretrained``/``hf_state_dict``.

Shape legend: B packs, S tokens per pack, H hidden size, N heads, D = H / N.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch
from torch import nn

from .attention import attend

FUSED_QKV_ATTRIBUTE = "fused_qkv"
"""``transformers.BertConfig`` attribute (the config's ``model.fused_qkv``) that selects the fused projection."""

_PARTS = ("query", "key", "value")
_FUSED = "qkv"


def fused_qkv(config: Any) -> bool:
    """Whether ``config`` asks for the fused projection (``config.fused_qkv``, default False)."""
    value = getattr(config, FUSED_QKV_ATTRIBUTE, False)
    if not isinstance(value, bool):
        raise ValueError("%s must be true or false, got %r" % (FUSED_QKV_ATTRIBUTE, value))
    return value


class _SelfAttention(nn.Module):
    """Heads, attention and the merge back to (B, S, H); subclasses give the projections."""

    def __init__(self, config: Any, implementation: str) -> None:
        super().__init__()
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError(
                "hidden_size (%d) must be a multiple of num_attention_heads (%d)"
                % (config.hidden_size, config.num_attention_heads)
            )
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.implementation = implementation
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_attention_heads, self.attention_head_size).transpose(1, 2)

    def projections(self, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(self, h: torch.Tensor, mask: Any) -> torch.Tensor:
        """(B, S, H) -> (B, S, H): context vectors, each token attending only within its own sequence."""
        batch, length, hidden = h.shape
        query, key, value = self.projections(h)  # each (B, S, H)
        q, k, v = self._heads(query), self._heads(key), self._heads(value)  # each (B, N, S, D); no generator:
        # torch 2.0.1's dynamo cannot unpack one under fullgraph=True
        context = attend(self.implementation, q, k, v, mask, self.dropout)  # (B, N, S, D)
        return context.transpose(1, 2).reshape(batch, length, hidden)  # (B, S, H)


class BertSelfAttention(_SelfAttention):
    """transformers' layout: ``query``, ``key``, ``value``, each Linear(H, H)."""

    def __init__(self, config: Any, implementation: str) -> None:
        super().__init__(config, implementation)
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def projections(self, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.query(h), self.key(h), self.value(h)  # each (B, S, H)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # a fused checkpoint: split it
        _split_in_place(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class BertFusedSelfAttention(_SelfAttention):
    """One ``qkv`` Linear(H, 3H) holding [query; key; value] (see the module docstring)."""

    def __init__(self, config: Any, implementation: str) -> None:
        super().__init__(config, implementation)
        self.hidden_size = config.hidden_size
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)

    def projections(self, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        fused = self.qkv(h)  # (B, S, 3H)
        n = self.hidden_size
        return fused[..., :n], fused[..., n : 2 * n], fused[..., 2 * n :]  # views, each (B, S, H)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # transformers' layout: concatenate
        for suffix in ("weight", "bias"):
            names = [prefix + part + "." + suffix for part in _PARTS]
            if prefix + _FUSED + "." + suffix not in state_dict and all(name in state_dict for name in names):
                state_dict[prefix + _FUSED + "." + suffix] = torch.cat([state_dict.pop(name) for name in names], 0)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def self_attention(config: Any, implementation: str) -> nn.Module:
    """The self-attention module ``config`` asks for (fused or not)."""
    cls = BertFusedSelfAttention if fused_qkv(config) else BertSelfAttention
    return cls(config, implementation)


def _split_in_place(state: Dict[str, torch.Tensor], prefix: str) -> None:
    for suffix in ("weight", "bias"):
        fused = prefix + _FUSED + "." + suffix
        if fused in state:
            for part, chunk in zip(_PARTS, state.pop(fused).chunk(3, dim=0)):
                state.setdefault(prefix + part + "." + suffix, chunk)


def hf_layout(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``state`` with every fused ``...qkv.weight`` and ``...qkv.bias`` split into transformers' query, key
    and value entries (contiguous copies), in its order (query.weight, query.bias, key.weight, ...) at the
    fused weight's place; other entries as they are."""
    out = {}  # type: Dict[str, torch.Tensor]
    for key, value in state.items():
        head, _, suffix = key.rpartition(".")
        if not (head.endswith("." + _FUSED) and suffix in ("weight", "bias")):
            out[key] = value
            continue
        prefix = head[: -len(_FUSED)]
        if suffix == "bias" and head + ".weight" in state:
            continue  # split with its weight
        parts = [(suffix, value)] if suffix == "bias" else [("weight", value)]
        if suffix == "weight" and head + ".bias" in state:
            parts.append(("bias", state[head + ".bias"]))
        chunks = [(name, tensor.chunk(3, dim=0)) for name, tensor in parts]
        for i, part in enumerate(_PARTS):
            for name, pieces in chunks:
                out[prefix + part + "." + name] = pieces[i].contiguous()
    return out


__all__ = ["BertFusedSelfAttention", "BertSelfAttention", "FUSED_QKV_ATTRIBUTE", "fused_qkv", "hf_layout",
           "self_attention"]
