"""The task's work in the worker processes (write/workers.py): a chunk of a split's rows -> its instance file.

Each worker builds the model's tokenizer once (`start_encoder`), as transformers' BertTokenizerFast calls it for
run_glue.py's `tokenizer(a, b, truncation=True, max_length=S)`: the tokenizer's own normalizer, pre-tokenizer,
WordPiece and post-processor ([CLS] A [SEP] or [CLS] A [SEP] B [SEP], token types 0 then 1; a tokenizer without a
post-processor gets BERT's), truncation "longest_first" to S (the longer of the two texts loses a token until the
pair fits; the text's end is cut). A chunk's instances carry the task's per-sequence columns (labels,
example_ids) as the instances' extra columns, and no predictions. Tokenizing is deterministic, so the chunks do
not depend on the workers.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from ...errors import DataError
from ..instance_files import Instances, save_instances
from ..vocab import TokenizerSpec

CHUNK_ROWS = 1 << 13
"""Rows of a split per worker task (bounds a task's memory; does not change the output)."""

_WORKER: Dict[str, object] = {}


def start_encoder(spec: TokenizerSpec, max_seq_length: int) -> None:
    """A worker's state for `encode_chunk` (the tokenizer is built at the first chunk)."""
    _WORKER.clear()
    _WORKER.update(spec=spec, max_seq_length=max_seq_length, tokenizer=None)


def build_encoder(spec: TokenizerSpec, max_seq_length: int, stride: int = 0, strategy: str = "longest_first"):
    """The fast tokenizer of `spec`, set up as BertTokenizerFast(a, b, truncation=True, max_length=S) runs it (a
    question-answering task's windows: truncation "only_second" with its doc stride, data/finetune/windows.py)."""
    from tokenizers.processors import TemplateProcessing

    tokenizer = spec.build()
    if tokenizer.post_processor is None:
        ids = spec.special_token_ids
        tokenizer.post_processor = TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_seq_length, stride=stride, strategy=strategy, direction="right")
    return tokenizer


def encode(tokenizer, cls_id: int, texts_a: List[str], texts_b: Optional[List[str]], where: str = "input"
           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Tokenize a batch -> (tokens (T,) int32 back to back, lengths (n,) int64, a_lengths (n,) int64: tokens of
    [CLS] A [SEP], truncated: how many were cut to S)."""
    batch = texts_a if texts_b is None else list(zip(texts_a, texts_b))
    encodings = tokenizer.encode_batch_fast(batch, add_special_tokens=True)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    b_tokens = np.fromiter((sum(e.type_ids) for e in encodings), dtype=np.int64, count=len(encodings))
    tokens = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int32, count=int(lengths.sum()))
    truncated = sum(1 for e in encodings if e.overflowing)
    starts = np.cumsum(lengths) - lengths
    if len(tokens) and np.any(tokens[starts] != cls_id):
        raise DataError("%s: the tokenizer's post-processor does not start a sequence with [CLS] (id %d): not a "
                        "BERT tokenizer" % (where, cls_id))
    return tokens, lengths, lengths - b_tokens, truncated


def encode_chunk(index: int, first_row: int, texts_a: List[str], texts_b: Optional[List[str]], labels: np.ndarray,
                 path: str) -> Tuple[np.ndarray, int]:
    """Worker: rows first_row, first_row + 1, ... of a split -> their instance file at `path`; returns (lengths
    (n,) uint16 or int32, examples truncated)."""
    spec = _WORKER["spec"]
    s = int(_WORKER["max_seq_length"])
    if _WORKER["tokenizer"] is None:
        _WORKER["tokenizer"] = build_encoder(spec, s)
    tokens, lengths, a_lengths, truncated = encode(_WORKER["tokenizer"], spec.special_token_ids["[CLS]"], texts_a,
                                                   texts_b, spec.source)
    n = len(lengths)
    zeros = np.zeros(n, dtype=np.int32)
    example_ids = np.arange(first_row, first_row + n, dtype=np.int32)
    instances = Instances(tokens, lengths.astype(np.int32), a_lengths.astype(np.int32), zeros, zeros,
                          np.zeros(0, np.int32), np.zeros(0, np.int32),
                          {"labels": np.ascontiguousarray(labels), "example_ids": example_ids})
    save_instances(path, instances, len(spec.vocab))
    return lengths.astype(np.uint16 if s < 1 << 16 else np.int32), truncated
