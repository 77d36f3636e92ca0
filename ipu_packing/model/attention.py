"""Attention for packed sequences: the mask from ``sequence_ids`` and three kernels that honour it.

A pack holds several sequences side by side; ``sequence_ids`` (B, S) says which one each token belongs to
(1..K, and 0 for padding). Token q may attend to token k exactly when ``sequence_ids[q] == sequence_ids[k]``.
For real tokens this is the block-diagonal mask of the paper: no token sees another sequence, and nothing
real sees padding. Padding tokens form one more block of their own, so padding attends only to padding and
every query row has at least one allowed key: no row is ever fully masked, so no kernel can produce NaN
(a softmax over nothing), and padding outputs never reach a loss.

Implementations (chosen per model, see ``resolve_attention``):

- ``"dense"`` (default, suits IPUs and any static-graph compiler): plain matmuls and a softmax, with an
  additive float mask of shape (B, 1, S, S) holding 0 (attend) or ``MASK_VALUE`` (do not), built in the
  model's dtype (``dense_mask(..., dtype)``): fp16 for a ``.half()`` model, as transformers builds the
  extended mask Graphcore's ``.half()`` model uses (see ``MASK_VALUE``). ``MASK_VALUE`` is finite and exact
  in fp16, and ``exp(MASK_VALUE)`` underflows to exactly 0 in every float format, so masked keys contribute
  exactly nothing.
- ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` (torch >= 2.0) with the dense path's
  additive mask (B, 1, S, S), cast to the query's dtype where autocast changed it. Not a boolean mask: SDPA
  turns a boolean mask into an additive one in every layer (a ``where`` over (B, 1, S, S)); built once per
  batch, the packed classifier's forward on the demo task's 1,024 texts took 0.615 s against 0.750 s (six
  interleaved calls each, one thread), with bitwise the same logits.
- ``"flex"``: FlexAttention (``torch.nn.attention.flex_attention``, torch >= 2.5) with a block-sparse
  ``BlockMask`` built from ``sequence_ids``; imported lazily, so older torch never sees it. It has no
  attention-probability dropout, so training with ``attention_probs_dropout_prob > 0`` is refused. A
  ``BlockMask`` is not a tensor: it cannot travel between pipeline stages, use dense or sdpa there.
- ``"varlen"``: attention computed only within each sequence. The mask is a ``VarlenLayout`` (built once
  per batch from ``sequence_ids``: which tokens form each real sequence), and each layer gathers q, k, v of
  the real tokens and runs ``scaled_dot_product_attention`` on the sequences alone: a pack of lengths
  l_1..l_k costs sum(l_i^2) scores instead of S^2. Padding is left out altogether: its outputs are zeros
  (they never reach a loss; the dense path's padding-attends-padding rows are just as unused). Inputs and
  outputs keep their static (B, N, S, D) shapes. Two kernels, the same result:

  - ``"grouped"`` (CPU default, torch >= 2.0): sequences of equal length stacked into one (G, N, L, D)
    batch, one SDPA call per distinct length (no padding inside a group, so exactly sum(l_i^2) scores).
  - ``"nested"`` (CUDA default, torch >= 2.3 ``torch.nested.nested_tensor_from_jagged``): one jagged batch
    (``layout=torch.jagged`` from offsets), which SDPA dispatches to flash / memory-efficient kernels on
    CUDA. It runs forward and backward on CPU too, but torch's CPU jagged SDPA is slower than dense there
    (``python -m ipu_packing.bench --attention ...`` timings in docs/model.md), hence "grouped" on CPU.

  torch.compile: the layout depends on the data (how many sequences of which lengths), so building it is
  eager work; ``torch.compile(model, backend="aot_eager")`` runs the model with graph breaks around it and
  gives the same results (tests/test_model_varlen.py). Not for PopTorch: poptorch_backend refuses it.

In a training config the choice is ``model.packed_attention``; train/loader.py refuses, when the config is
read, the combinations that cannot train (poptorch with anything but dense; flex off CUDA, on pipelined
stages, under torch.compile or with attention dropout; varlen under torch.compile; a torch without the kernel,
``missing_torch_support``).

Shape legend: B packs, S tokens per pack, N heads, D head size.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

ATTENTION_IMPLEMENTATIONS = ("dense", "sdpa", "flex", "varlen")
"""Accepted values of the ``attention`` argument and of ``config.packed_attention``."""

CONFIG_ATTRIBUTE = "packed_attention"
"""Name of the optional ``transformers.BertConfig`` attribute that selects the implementation."""

MASK_VALUE = -10000.0
"""Additive mask value of the dense path. transformers 4.18 (the version Graphcore's BERT app pins,
nlp/bert/pytorch/requirements.txt:1) builds its extended mask as ``(1.0 - mask.to(self.dtype)) * -10000.0``
(transformers/modeling_utils.py:581-582), ``self.dtype`` being the first parameter's dtype
(modeling_utils.py:483-487, 141-143): fp16 for Graphcore's ``.half()`` model (run_pretraining.py:134).
Why -10000 suits fp16: it is exact there (bf16 rounds it to -9984); a score plus it stays finite for any
score above -55520 (fp16 rounds -65520 and beyond to -inf), where ``torch.finfo(torch.float16).min`` would
overflow for any score at or below -16; and exp(score - 10000 - m), m the largest allowed score of the row,
is exactly 0 in fp16 and fp32 unless the masked score exceeds m by 9896 or more, which no attention score
does. A fully masked row cannot occur: every token attends at least to itself."""


def resolve_attention(config: Any, attention: Optional[str] = None) -> str:
    """The implementation to use: ``attention`` if given, else ``config.packed_attention``, else "dense"."""
    name = attention if attention is not None else getattr(config, CONFIG_ATTRIBUTE, None)
    if name is None:
        name = "dense"
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError("attention must be one of %s, got %r" % (ATTENTION_IMPLEMENTATIONS, name))
    return name


def missing_torch_support(implementation: str) -> Optional[str]:
    """What this torch lacks to run ``implementation`` (one line naming the version needed), or None."""
    if implementation in ("sdpa", "varlen") and not hasattr(F, "scaled_dot_product_attention"):
        return "attention %r needs torch >= 2.0 (scaled_dot_product_attention), found torch %s" % (
            implementation, torch.__version__)
    if implementation == "flex":
        try:  # find_spec imports the parent packages only, not FlexAttention itself
            import importlib.util

            found = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
        except ImportError:  # torch.nn.attention itself is missing (torch < 2.2)
            found = False
        if not found:
            return "attention 'flex' needs torch >= 2.5 (torch.nn.attention.flex_attention), found torch %s" % (
                torch.__version__,)
    return None


def same_sequence(sequence_ids: torch.Tensor) -> torch.Tensor:
    """Boolean mask (B, 1, S, S): True where query and key belong to the same sequence (or both padding)."""
    return (sequence_ids.unsqueeze(2) == sequence_ids.unsqueeze(1)).unsqueeze(1)  # (B, 1, S, S)


def dense_mask(sequence_ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive mask (B, 1, S, S) in ``dtype`` (the model's): 0 where attention is allowed, ``MASK_VALUE``
    elsewhere. Both values are exact in float32 and float64, so those masks hold the same numbers."""
    allowed = same_sequence(sequence_ids)
    return (1.0 - allowed.to(dtype)) * MASK_VALUE  # (B, 1, S, S)


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


def build_mask(implementation: str, sequence_ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> Any:
    """The mask in the form ``attend(implementation, ...)`` takes; ``dtype`` (the model's) is the dense mask's."""
    if implementation == "dense":
        return dense_mask(sequence_ids, dtype)
    if implementation == "sdpa":
        return dense_mask(sequence_ids, dtype)
    if implementation == "flex":
        return flex_block_mask(sequence_ids)
    if implementation == "varlen":
        return varlen_layout(sequence_ids)
    raise ValueError("attention must be one of %s, got %r" % (ATTENTION_IMPLEMENTATIONS, implementation))


VARLEN_KERNELS = ("grouped", "nested")
"""Kernels of the varlen path (see the module docstring); ``varlen_layout(kernel=None)`` picks by device."""


class VarlenLayout(NamedTuple):
    """Where the real sequences of a batch of packs lie, for ``attend("varlen", ...)``.

    Token t of the flattened batch is row t of a (B*S, ...) view. ``order`` lists the real tokens sequence
    by sequence (pack, then sequence id, then position); ``offsets`` (n+1,) are the sequence boundaries in
    ``order``. For the grouped kernel, ``groups`` holds one (G, L) token-index tensor per distinct length L.
    """

    batch: int
    length: int
    kernel: str
    order: torch.Tensor  # (T,) int64, T real tokens
    offsets: torch.Tensor  # (n + 1,) int64
    lengths: Tuple[int, ...]  # (n,) sequence lengths, python ints
    groups: Tuple[torch.Tensor, ...]  # grouped kernel: (G, L) int64 per distinct L; nested: ()


def _check_varlen_torch(kernel: str) -> None:
    if not hasattr(F, "scaled_dot_product_attention"):
        raise RuntimeError(
            "attention='varlen' needs torch >= 2.0 (scaled_dot_product_attention), found torch %s; use 'dense'"
            % torch.__version__
        )
    if kernel == "nested" and not hasattr(getattr(torch, "nested", None), "nested_tensor_from_jagged"):
        raise RuntimeError(
            "attention='varlen' with kernel 'nested' needs torch >= 2.3 (torch.nested.nested_tensor_from_jagged), "
            "found torch %s; use kernel 'grouped'" % torch.__version__
        )


def varlen_layout(sequence_ids: torch.Tensor, kernel: Optional[str] = None) -> VarlenLayout:
    """The ``VarlenLayout`` of (B, S) ``sequence_ids`` (0 = padding, 1..K = sequences, any token order).

    ``kernel``: "grouped" or "nested"; default "nested" on CUDA when torch has jagged nested tensors, else
    "grouped". Synchronises with the device once (the sequence lengths are data)."""
    if kernel is None:
        nested_ok = hasattr(getattr(torch, "nested", None), "nested_tensor_from_jagged")
        kernel = "nested" if sequence_ids.is_cuda and nested_ok else "grouped"
    if kernel not in VARLEN_KERNELS:
        raise ValueError("varlen kernel must be one of %s, got %r" % (VARLEN_KERNELS, kernel))
    _check_varlen_torch(kernel)
    batch, length = sequence_ids.shape
    ids = sequence_ids.reshape(-1).long()  # (B*S,)
    real = (ids > 0).nonzero().squeeze(1)  # (T,) positions of real tokens, ascending
    pack = real // length
    # one key per (pack, sequence): sorting by it (stably) keeps each sequence's tokens in position order
    key = pack * (int(ids.max().item()) + 1 if ids.numel() else 1) + ids[real]
    key, perm = torch.sort(key, stable=True)
    order = real[perm]  # (T,)
    _, counts = torch.unique_consecutive(key, return_counts=True)  # (n,)
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.long, device=ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    lengths = tuple(int(n) for n in counts.tolist())
    groups = ()  # type: Tuple[torch.Tensor, ...]
    if kernel == "grouped":
        starts = offsets[:-1]
        by_length: Dict[int, List[int]] = {}
        for i, n in enumerate(lengths):
            by_length.setdefault(n, []).append(i)
        built = []
        for n in sorted(by_length):
            first = starts[torch.tensor(by_length[n], device=ids.device)]  # (G,)
            steps = torch.arange(n, device=ids.device)
            built.append(order[first[:, None] + steps[None, :]])  # (G, L)
        groups = tuple(built)
    return VarlenLayout(batch, length, kernel, order, offsets, lengths, groups)


def varlen_attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: VarlenLayout, dropout: torch.nn.Dropout
) -> torch.Tensor:
    """(B, N, S, D) q, k, v -> (B, N, S, D): SDPA within each sequence of ``layout``; zeros at padding."""
    batch, heads, length, size = query.shape
    if (batch, length) != (layout.batch, layout.length):
        raise ValueError("varlen layout is for (B, S) = %r, inputs are %r"
                         % ((layout.batch, layout.length), (batch, length)))
    p = dropout.p if dropout.training else 0.0

    def tokens(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(batch * length, heads, size)  # (B*S, N, D), a view for BertSelfAttention

    q, k, v = tokens(query), tokens(key), tokens(value)
    if layout.kernel == "nested":
        offsets, lengths = layout.offsets, layout.lengths

        def jagged(x: torch.Tensor) -> torch.Tensor:  # (T, N, D) -> (n, N, j, D)
            values = x.index_select(0, layout.order)
            return torch.nested.nested_tensor_from_jagged(
                values, offsets, min_seqlen=min(lengths), max_seqlen=max(lengths)
            ).transpose(1, 2)

        if not lengths:
            return query.new_zeros(query.shape)
        out = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), dropout_p=p)
        values = out.transpose(1, 2).values()  # (T, N, D)
        index = layout.order
    else:
        if not layout.groups:
            return query.new_zeros(query.shape)
        parts = []
        for group in layout.groups:  # (G, L) token indices, every sequence of length L
            flat = group.reshape(-1)

            def stack(x: torch.Tensor) -> torch.Tensor:  # (B*S, N, D) -> (G, N, L, D)
                return x.index_select(0, flat).view(group.shape[0], group.shape[1], heads, size).transpose(1, 2)

            out = F.scaled_dot_product_attention(stack(q), stack(k), stack(v), dropout_p=p)  # (G, N, L, D)
            parts.append(out.transpose(1, 2).reshape(-1, heads, size))  # (G*L, N, D)
        values = torch.cat(parts)  # (T, N, D)
        index = torch.cat([group.reshape(-1) for group in layout.groups])
    context = q.new_zeros(q.shape).index_copy(0, index, values.to(q.dtype))  # (B*S, N, D), zeros at padding
    return context.view(batch, length, heads, size).transpose(1, 2)  # (B, N, S, D)


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
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask.to(query.dtype), dropout_p=p)
    if implementation == "flex":
        if dropout.training and dropout.p > 0.0:
            raise ValueError(
                "attention='flex' has no attention-probability dropout; set attention_probs_dropout_prob=0 "
                "or use 'dense' or 'sdpa' for training"
            )
        return _flex_attention()(query, key, value, block_mask=mask)
    if implementation == "varlen":
        return varlen_attend(query, key, value, mask, dropout)
    raise ValueError("attention must be one of %s, got %r" % (ATTENTION_IMPLEMENTATIONS, implementation))
