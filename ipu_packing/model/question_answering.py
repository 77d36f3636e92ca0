"""Packed BERT for extractive question answering: transformers' ``BertForQuestionAnswering`` once per
sequence (window) of a pack.

``qa_outputs`` Linear(H, 2) over every token gives a start and an end logit per token, (B, S) each. For each
sequence slot k the answer is searched among ITS OWN tokens only: its logits over the row, (B, K, S), keep
the token logits where ``sequence_ids == k + 1`` and hold ``EXCLUDED`` (the most negative finite value of
the logits' dtype) everywhere else, so their softmax over the row is exactly the softmax over the
sequence's own positions (exp(EXCLUDED - max) is exactly 0) and the loss is the one transformers computes on
that window alone, unpadded.

Why a finite value and not -inf: an empty slot's row holds nothing but excluded positions; with -inf its
log-softmax would be NaN (and an ignored loss term that an implementation multiplies by 0 instead of
skipping, as a compiled graph may, would make the loss NaN), where with the finite value it is a harmless
uniform row. ``torch.where`` sends no gradient to an excluded position. The value is a Python constant of
the logits' dtype (no data-dependent shape, nothing PopTorch cannot trace). Do not add to these logits:
EXCLUDED + a negative number is -inf.

Labels: ``start_positions`` and ``end_positions`` (B, K), positions in the pack row (absolute, not relative
to the sequence's [CLS]); IGNORE_INDEX (-100) for an empty slot. A position outside its own sequence
is ignored as well (transformers ignores a position past the end of the window: it clamps it to the
window's length, its ignore_index). Unlike transformers, a negative position is not clamped to 0: a
no-answer example points at its own [CLS] (its cls_positions entry). Start and end are counted apart.

Loss: transformers' (CE(start) + CE(end)) / 2 with each CE the mean over the batch's windows, i.e.
``(start_loss + end_loss) / 2``, start_loss the mean cross-entropy over the valid starts (0 when none), and
likewise for the end. To combine micro batches exactly, weight start_loss by start_count and end_loss by
end_count.

Shape legend: B packs, S tokens per pack, K sequence slots per pack, H hidden size.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import nn

from .. import tasks
from .heads import PackedBertTaskModel
from .modeling import IGNORE_INDEX
from .per_sequence import mean_loss_and_accuracy, slot_membership
from .stages import INPUTS as PRETRAINING_INPUTS, Stages, heads_on_last_device

INPUTS = PRETRAINING_INPUTS[:4] + ("start_positions", "end_positions")
"""PackedBertForQuestionAnswering's batch fields, in its forward's argument order."""


def excluded_value(dtype: torch.dtype) -> float:
    """EXCLUDED for logits of ``dtype``: its most negative finite value."""
    return float(torch.finfo(dtype).min)


class PackedBertQuestionAnsweringOutput(NamedTuple):
    """What one forward pass returns: a NamedTuple of tensors. Losses, accuracies and counts are float32 for a
    float32, fp16 or bf16 (autocast) model, float64 for a float64 one; None when no labels are given."""

    loss: Optional[torch.Tensor]
    """() (start_loss + end_loss) / 2."""
    start_logits: torch.Tensor
    """(B, K, S) start logits of each sequence slot over the row; positions of other sequences and padding
    hold the dtype's most negative finite value (an empty slot: all of them)."""
    end_logits: torch.Tensor
    """(B, K, S) end logits, likewise."""
    token_start_logits: torch.Tensor
    """(B, S) start logit of every token (for post-processing with ``sequence_ids``)."""
    token_end_logits: torch.Tensor
    """(B, S) end logit of every token."""
    start_loss: Optional[torch.Tensor]
    """() mean cross-entropy of the valid start positions over their own sequences (0 when none)."""
    end_loss: Optional[torch.Tensor]
    """() likewise for the end positions."""
    start_accuracy: Optional[torch.Tensor]
    """() fraction of valid start positions that are their sequence's argmax."""
    end_accuracy: Optional[torch.Tensor]
    """() likewise for the end positions."""
    start_count: Optional[torch.Tensor]
    """() valid start positions in the batch."""
    end_count: Optional[torch.Tensor]
    """() valid end positions in the batch."""


def _targets(positions: torch.Tensor, own: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(B, K) row positions and (B, K, S) membership -> (targets with IGNORE_INDEX where invalid, valid):
    valid where the position is not IGNORE_INDEX, lies in the row and belongs to the slot's own sequence."""
    positions = positions.long()
    length = own.shape[-1]
    inside = (positions >= 0) & (positions < length)  # (B, K)
    index = positions.clamp(0, length - 1).unsqueeze(-1)  # (B, K, 1)
    valid = inside & torch.gather(own, 2, index).squeeze(-1)  # (B, K)
    return torch.where(valid, positions, torch.full_like(positions, IGNORE_INDEX)), valid


class QuestionAnsweringHeads(nn.Module):
    """No parameters: runs every op after the encoder (qa_outputs, the per-sequence logits, the losses),
    taking ``qa_outputs`` as an argument, so that a pipeline block begun on it covers all of them."""

    def forward(
        self,
        h: torch.Tensor,
        own: torch.Tensor,
        start_positions: Optional[torch.Tensor],
        end_positions: Optional[torch.Tensor],
        qa_outputs: nn.Module,
        groups: int = 1,
    ) -> PackedBertQuestionAnsweringOutput:
        """h (B, S, H), own (B, K, S) bool (slots.slot_membership), the label fields (B, K) or None; ``groups``:
        the rows are that many micro batches, each loss and accuracy the mean of theirs."""
        logits = qa_outputs(h)  # (B, S, 2)
        token_start, token_end = logits[..., 0], logits[..., 1]  # (B, S) each
        value = excluded_value(logits.dtype)
        start = torch.where(own, token_start.unsqueeze(1), torch.full_like(token_start.unsqueeze(1), value))
        end = torch.where(own, token_end.unsqueeze(1), torch.full_like(token_end.unsqueeze(1), value))  # (B, K, S)
        if start_positions is None or end_positions is None:
            if start_positions is not None or end_positions is not None:
                raise ValueError("give both start_positions and end_positions, or neither")
            return PackedBertQuestionAnsweringOutput(None, start, end, token_start, token_end,
                                                     None, None, None, None, None, None)
        start_targets, start_valid = _targets(start_positions, own)
        end_targets, end_valid = _targets(end_positions, own)
        start_loss, start_accuracy, start_count = mean_loss_and_accuracy(start, start_targets, start_valid, groups)
        end_loss, end_accuracy, end_count = mean_loss_and_accuracy(end, end_targets, end_valid, groups)
        return PackedBertQuestionAnsweringOutput(
            loss=(start_loss + end_loss) / 2,
            start_logits=start,
            end_logits=end,
            token_start_logits=token_start,
            token_end_logits=token_end,
            start_loss=start_loss,
            end_loss=end_loss,
            start_accuracy=start_accuracy,
            end_accuracy=end_accuracy,
            start_count=start_count,
            end_count=end_count,
        )


class PackedBertForQuestionAnswering(PackedBertTaskModel):
    """BERT for extractive QA on each sequence of a pack; the packed counterpart of transformers'
    ``BertForQuestionAnswering`` (same modules and parameter names: ``bert`` without a pooler,
    ``qa_outputs``). See the module docstring for labels and losses, the package docstring for the batch."""

    HF_ARCHITECTURE = "BertForQuestionAnswering"
    TASK = tasks.QUESTION_ANSWERING.name
    FRESH_HEAD = ("qa_outputs.",)
    ADD_POOLING_LAYER = False  # transformers' BertForQuestionAnswering has none
    SERVED = ("token_start_logits", "token_end_logits")  # what post-processing reads (data/finetune/answers.py)

    def __init__(self, config: Any, attention: Optional[str] = None) -> None:
        if int(getattr(config, "num_labels", 2)) != 2:
            raise ValueError("question answering has 2 outputs per token (start, end): num_labels must be 2, got %d"
                             % config.num_labels)
        super().__init__(config, attention)
        self.qa_outputs = nn.Linear(self.config.hidden_size, 2)
        self.heads = QuestionAnsweringHeads()
        self.apply(self._init_weights)

    def question_answering_heads(self, h: torch.Tensor, sequence_ids: torch.Tensor, start_positions: torch.Tensor,
                                 end_positions: torch.Tensor) -> PackedBertQuestionAnsweringOutput:
        """Final hidden states (B, S, H) and the head's fields -> the output (what stages.py's last part
        runs; derives each slot's tokens from ``sequence_ids`` itself)."""
        own = slot_membership(sequence_ids, start_positions.shape[1])
        return self.heads(h, own, start_positions, end_positions, self.qa_outputs)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        sequence_ids: torch.Tensor,
        start_positions: Optional[torch.Tensor] = None,
        end_positions: Optional[torch.Tensor] = None,
        *,
        num_slots: Optional[int] = None,
        loss_groups: int = 1,
    ) -> PackedBertQuestionAnsweringOutput:
        """``num_slots`` (K) is needed only without labels (serving); with labels it is their width. It is a
        keyword-only setting, not a batch field (the runners feed forward's other arguments from the batch), as
        ``loss_groups`` is: the rows are that many micro batches of one step, each loss their means averaged."""
        if start_positions is not None:
            if num_slots is not None and num_slots != start_positions.shape[1]:
                raise ValueError("num_slots %d differs from the labels' K %d" % (num_slots, start_positions.shape[1]))
            num_slots = start_positions.shape[1]
        if num_slots is None:
            raise ValueError("without start_positions / end_positions, give num_slots (K, sequence slots per pack)")
        k = int(num_slots)
        h, own = self.encode(input_ids, token_type_ids, position_ids, sequence_ids,
                             lambda ids: slot_membership(ids, k))  # (B, S, H), (B, K, S)
        grouped = (loss_groups,) if loss_groups != 1 else ()  # the default keeps the heads' call as it always was
        return self.heads(h, own, start_positions, end_positions, self.qa_outputs, *grouped)

    @classmethod
    def from_pretrained(
        cls,
        directory: str,
        attention: Optional[str] = None,
        fused_qkv: Optional[bool] = None,
        strict: bool = False,
        output_loading_info: bool = False,
    ) -> Any:
        """Read a transformers-format directory: a BertForQuestionAnswering one (everything loaded), or a
        BertForPreTraining / BertModel / BertForSequenceClassification one (this project's pretraining export
        included): the encoder loaded, ``qa_outputs`` freshly initialised as transformers does, the fresh and
        the unused weights (a pooler, the pretraining heads, a classifier) named in a UserWarning (and
        returned with ``output_loading_info``). A directory without the encoder is refused; ``strict``
        refuses any difference. num_labels is 2 whatever config.json says (a classifier's labels do not
        apply)."""
        return cls._from_pretrained(directory, attention, fused_qkv, strict, {"num_labels": 2}, output_loading_info)


def pipeline_stages(num_layers: int, layers_per_ipu: Sequence[int] = ()) -> Stages:
    """The parts of ``PackedBertForQuestionAnswering`` (model/stages.py): the heads (qa_outputs, per-sequence
    logits, loss) on the last device."""
    return heads_on_last_device(num_layers, layers_per_ipu, INPUTS, ("qa_outputs",), "question_answering_heads")


__all__ = ["INPUTS", "PackedBertForQuestionAnswering", "PackedBertQuestionAnsweringOutput", "QuestionAnsweringHeads",
           "excluded_value", "pipeline_stages"]
