"""Attention for packed sequences: the mask from ``sequence_ids`` and three kernels that honour it.

A pack holds several sequences side by side; ``sequence_ids`` (B, S) says which one each token belongs to
(1..K, and 0 for padding). Token q may attend to token k exactly when ``sequence_ids[q] == sequence_ids[k]``.
For real tokens this is the block-diagonal mask of the paper: no token sees another sequence, and nothing
real sees padding. Padding tokens form one more block of their own, so padding attends only to padding and
every query row has at least one allowed key: no row is ever fully masked, so no kernel can produce NaN
(a softmax over nothing), and padding outputs never reach a loss.

Implementations (chosen per model, see ``resolve_attention``):

- ``"dense"`` (default, suits IPUs and any static-graph compiler): plain matmuls and a softmax, with an
  additive float mask of shape (B, 1, S, S) holding 0 (attend) or ``MASK_VALUE`` (do not). ``MASK_VALUE``
  is finite and representable in fp16 and bf16, and ``exp(MASK_VALUE)`` underflows to exactly 0 in every
  float format, so masked keys contribute exactly nothing.
- ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` (torch >= 2.0) with a boolean mask
  (B, 1, S, S), True = attend.
- ``"flex"``: FlexAttention (``torch.nn.attention.flex_attention``, torch >= 2.5) with a block-sparse
  ``BlockMask`` built from ``sequence_ids``; imported lazily, so older torch never sees it. It has no
  attention-probability dropout, so training with ``attention_probs_dropout_prob > 0`` is refused. A
  ``BlockMask`` is not a tensor: it cannot travel between pipeline stages, use dense or sdpa there.

Shape legend: B packs, S tokens per pack, N heads, D head size.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F

ATTENTION_IMPLEMENTATIONS = ("dense", "sdpa", "flex")
"""Accepted values of the ``attention`` argument and of ``config.packed_attention``."""

CONFIG_ATTRIBUTE = "packed_attention"
"""Name of the optional ``transformers.BertConfig`` attribute that selects the implementation."""

MASK_VALUE = -10000.0
"""Additive mask value of the dense path: finite in fp16/bf16, and exp() of it is exactly 0."""


def resolve_attention(config: Any, attention: Optional[str] = None) -> str:
    """The implementation to use: ``attention`` if given, else ``config.packed_attention``, else "dense"."""
    name = attention if attention is not None else getattr(config, CONFIG_ATTRIBUTE, None)
    if name is None:
        name = "dense"
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError("attention must be one of %s, got %r" % (ATTENTION_IMPLEMENTATIONS, name))
    return name


def same_sequence(sequence_ids: torch.Tensor) -> torch.Tensor:
    """Boolean mask (B, 1, S, S): True where query and key belong to the same sequence (or both padding)."""
    return (sequence_ids.unsqueeze(2) == sequence_ids.unsqueeze(1)).unsqueeze(1)  # (B, 1, S, S)


def dense_mask(sequence_ids: torch.Tensor) -> torch.Tensor:
    """Additive float32 mask (B, 1, S, S): 0 where attention is allowed, ``MASK_VALUE`` elsewhere."""
    allowed = same_sequence(sequence_ids)
    return (1.0 - allowed.to(torch.float32)) * MASK_VALUE  # (B, 1, S, S)


def flex_block_mask(sequence_ids: torch.Tensor) -> Any:
    """FlexAttention ``BlockMask`` for the same rule (lazy import; needs torch >= 2.5)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as error:  # older torch: name the way out
        raise RuntimeError(
            "attention='flex' needs torch >= 2.5 (torch.nn.attention.flex_attention); use 'dense' or 'sdpa'"
        ) from error
    batch, length = sequence_ids.shape

    def mask_mod(b, h, q_idx, kv_idx):  # noqa: ARG001 (signature fixed by FlexAttention)
        return sequence_ids[b, q_idx] == sequence_ids[b, kv_idx]

    return create_block_mask(mask_mod, batch, None, length, length, device=sequence_ids.device)


def build_mask(implementation: str, sequence_ids: torch.Tensor) -> Any:
    """The mask in the form ``attend(implementation, ...)`` takes."""
    if implementation == "dense":
        return dense_mask(sequence_ids)
    if implementation == "sdpa":
        return same_sequence(sequence_ids)
    if implementation == "flex":
        return flex_block_mask(sequence_ids)
    raise ValueError("attention must be one of %s, got %r" % (ATTENTION_IMPLEMENTATIONS, implementation))


_FLEX = None


def _flex_attention():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = flex_attention
    return _FLEX


def attend(
    implementation: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: Any,
    dropout: torch.nn.Dropout,
) -> torch.Tensor:
    """Scaled dot-product attention of (B, N, S, D) inputs under ``mask``; returns (B, N, S, D).

    ``dropout`` is the attention-probability dropout module (active only in training mode).
    """
    if implementation == "dense":
        scores = torch.matmul(query, key.transpose(-1, -2))  # (B, N, S, S)
        scores = scores / math.sqrt(query.shape[-1])
        scores = scores + mask.to(scores.dtype)
        probs = torch.softmax(scores, dim=-1)
        probs = dropout(probs)
        return torch.matmul(probs.to(value.dtype), value)  # (B, N, S, D)
    if implementation == "sdpa":
        p = dropout.p if dropout.training else 0.0
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=p)
    if implementation == "flex":
        if dropout.training and dropout.p > 0.0:
            raise ValueError(
                "attention='flex' has no attention-probability dropout; set attention_probs_dropout_prob=0 "
                "or use 'dense' or 'sdpa' for training"
            )
        return _flex_attention()(query, key, value, block_mask=mask)
    raise ValueError("attention must be one of %s, got %r" % (ATTENTION_IMPLEMENTATIONS, implementation))
