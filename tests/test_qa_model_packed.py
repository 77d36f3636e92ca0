"""Packs from `prepare --task question_answering` through PackedBertForQuestionAnswering equal transformers'
BertForQuestionAnswering run on each window alone: start and end logits (the packed model's per-slot rows and its
token logits), the loss with the packs' own labels (answers inside windows and windows pointing at their [CLS]) and
every parameter's gradient, within 1e-12 in float64 and 1e-5 in float32 (max |ours - theirs| / max(1, max
|theirs|)). tests/test_model_question_answering.py does the same on random packs for every attention; this is the
prepared data's case: its fields, labels and offsets as the pipeline writes them."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import transformers

from ipu_packing.data import open_dataset
from ipu_packing.model import PackedBertForQuestionAnswering
from ipu_packing.model.question_answering import excluded_value
from task_packs import gradient_differences, scaled_difference, twins

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.fixture(scope="module")
def packs(qa_demo_task):
    """The eight fullest packs of the demo task's validation split at S=64 (with the default vocabulary): windows
    of several questions in a pack, answers inside and outside windows."""
    ds = open_dataset(os.path.join(qa_demo_task, "validation", "packed"), as_tensors=False)
    windows_per_pack = [int((ds[i]["feature_ids"] >= 0).sum()) for i in range(len(ds))]
    rows = [ds[i] for i in sorted(range(len(ds)), key=lambda i: -windows_per_pack[i])[:8]]  # the fullest packs
    batch = {k: torch.as_tensor(np.stack([r[k] for r in rows])).long() for k in rows[0]}
    windows = int((batch["feature_ids"] >= 0).sum())
    at_cls = int(((batch["start_positions"] == batch["cls_positions"]) & (batch["feature_ids"] >= 0)).sum())
    assert windows > 8 and 0 < at_cls < windows  # several windows a pack; labels inside and at [CLS]
    return ds.vocab_size, batch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_prepared_packs_equal_transformers_window_by_window(packs, dtype):
    vocab_size, batch = packs
    reference, packed = twins(transformers.BertForQuestionAnswering, PackedBertForQuestionAnswering, "dense", 3,
                              vocab_size=vocab_size)
    reference, packed = reference.to(dtype), packed.to(dtype)
    out = packed(batch["input_ids"], batch["token_type_ids"], batch["position_ids"], batch["sequence_ids"],
                 batch["start_positions"], batch["end_positions"])
    losses, diffs = [], {"start logits": 0.0, "end logits": 0.0, "token logits": 0.0}
    floor = excluded_value(dtype)
    for b, k in zip(*np.nonzero(batch["feature_ids"].numpy() >= 0)):
        first = int(batch["cls_positions"][b, k])
        own = batch["sequence_ids"][b] == k + 1
        n = int(own.sum())
        theirs = reference(input_ids=batch["input_ids"][b, first:first + n][None],
                           token_type_ids=batch["token_type_ids"][b, first:first + n][None],
                           start_positions=(batch["start_positions"][b, k] - first)[None],
                           end_positions=(batch["end_positions"][b, k] - first)[None])
        losses.append(theirs.loss)
        for key, row, token, ref in (("start logits", out.start_logits, out.token_start_logits, theirs.start_logits),
                                     ("end logits", out.end_logits, out.token_end_logits, theirs.end_logits)):
            diffs[key] = max(diffs[key], scaled_difference(row[b, k][own], ref[0]))
            diffs["token logits"] = max(diffs["token logits"], scaled_difference(token[b][own], ref[0]))
            assert (row[b, k][~own] == floor).all()  # another window's tokens, padding: never this slot's
    reference_loss = torch.stack(losses).mean()  # transformers' loss over a batch of these windows
    assert int(out.start_count) == int(out.end_count) == len(losses)
    diffs["loss"] = scaled_difference(out.loss, reference_loss)
    reference_loss.backward()
    out.loss.backward()
    diffs["gradients"] = max(gradient_differences(packed, reference).values())
    print("prepared qa packs %s: %s" % (dtype, ", ".join("%s %.1e" % kv for kv in diffs.items())))
    for what, diff in diffs.items():
        assert diff <= TOLERANCE[dtype], (what, diff)
