"""Packed BERT for sequence classification and regression: transformers' ``BertForSequenceClassification``
once per sequence of a pack.

Each sequence's own [CLS] (``cls_positions``, (B, K)) -> ``bert.pooler`` -> dropout (``classifier_dropout``,
else ``hidden_dropout_prob``) -> ``classifier`` Linear(H, num_labels). Losses as transformers defines them
for ``config.problem_type``, over the sequences of the batch:

    "single_label_classification"  labels (B, K) int, IGNORE_INDEX (-100) where nothing is to be learnt;
                                   mean cross-entropy over the valid sequences
    "regression"                   labels (B, K) float (num_labels 1) or (B, K, L); mean squared error over
                                   every label of the valid sequences (torch's MSELoss: per element)
    "multi_label_classification"   labels (B, K, L) float in [0, 1]; mean BCE-with-logits over every label
                                   of the valid sequences (per element, as BCEWithLogitsLoss)

With ``problem_type`` None the type is chosen per call as transformers does: num_labels 1 -> regression,
integer labels -> single label, else multi label.

A slot is valid when it holds a sequence (``slots.slots_in_use``: k < the largest sequence id of its row,
a field every pack has) and, for single-label, its label is not IGNORE_INDEX. So the labels of empty slots
are never read, whatever they hold: float labels need no sentinel (a NaN one would have to be kept out of
every product, the backward's included, since NaN * 0 is NaN), and a collate that pads labels with 0 is safe.

Shape legend: B packs, S tokens per pack, K sequence slots per pack, H hidden size, L = num_labels.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Sequence

import torch
from torch import nn

from .. import tasks
from .heads import PackedBertTaskModel
from .modeling import IGNORE_INDEX
from .stages import INPUTS as PRETRAINING_INPUTS, Stages, heads_on_last_device
from .per_sequence import (
    binary_cross_entropy_with_logits,
    gather_positions,
    group_means,
    group_sums,
    loss_dtype,
    mean_loss_and_accuracy,
    slots_in_use,
    squared_error,
)

INPUTS = PRETRAINING_INPUTS[:4] + ("cls_positions", "labels")
"""PackedBertForSequenceClassification's batch fields, in its forward's argument order."""

PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
"""``config.problem_type`` values (transformers'), besides None (chosen from num_labels and the labels)."""


class PackedBertSequenceClassifierOutput(NamedTuple):
    """What one forward pass returns: a NamedTuple of tensors. ``loss``, ``accuracy``: float32 for a float32,
    fp16 or bf16 (autocast) model, float64 for a float64 one; None when no labels are given."""

    loss: Optional[torch.Tensor]
    """() mean loss over the valid sequences (per element for regression and multi-label); 0 when none."""
    logits: torch.Tensor
    """(B, K, L) logits per sequence slot (empty slots hold those of position 0's pooled state: ignore)."""
    accuracy: Optional[torch.Tensor]
    """() single-label: fraction of valid sequences whose argmax is the label; multi-label: fraction of the
    valid sequences' labels with (logit > 0) == (label > 0.5); regression: 0 (none is defined)."""
    count: torch.Tensor
    """() valid sequences (no labels: sequences in the batch). Weight ``loss`` and ``accuracy`` by it to
    combine micro batches exactly (the per-element means have L elements per sequence, the same in each)."""


def resolve_problem_type(problem_type: Optional[str], num_labels: int, labels: torch.Tensor) -> str:
    """transformers' rule when ``config.problem_type`` is None (decided from static facts: traceable)."""
    if problem_type is not None:
        return problem_type
    if num_labels == 1:
        return "regression"
    if not labels.is_floating_point():
        return "single_label_classification"
    return "multi_label_classification"


class SequenceClassificationHeads(nn.Module):
    """No parameters: runs every op after the encoder (gather at each [CLS], pooler, dropout, classifier,
    loss), taking the modules that hold the weights as arguments, so that a pipeline block begun on it
    covers all of them (stages.py)."""

    def __init__(self, num_labels: int, problem_type: Optional[str]) -> None:
        super().__init__()
        self.num_labels = num_labels
        self.problem_type = problem_type

    def forward(
        self,
        h: torch.Tensor,
        in_use: torch.Tensor,
        cls_positions: torch.Tensor,
        labels: Optional[torch.Tensor],
        pooler: nn.Module,
        dropout: nn.Module,
        classifier: nn.Module,
        groups: int = 1,
    ) -> PackedBertSequenceClassifierOutput:
        """h (B, S, H), in_use (B, K) bool (slots.slots_in_use), cls_positions (B, K), labels as the module
        docstring says (or None); ``groups``: the rows are that many micro batches, each loss and accuracy
        the mean of theirs (per_sequence.mean_loss_and_accuracy)."""
        pooled = pooler(gather_positions(h, cls_positions, in_use))  # (B, K, H)
        logits = classifier(dropout(pooled))  # (B, K, L)
        dtype = loss_dtype(logits)
        if labels is None:
            return PackedBertSequenceClassifierOutput(None, logits, None, in_use.sum().to(dtype))
        kind = resolve_problem_type(self.problem_type, self.num_labels, labels)
        if kind == "single_label_classification":
            labels = labels.long()
            valid = in_use & (labels != IGNORE_INDEX)  # (B, K)
            targets = torch.where(valid, labels, torch.full_like(labels, IGNORE_INDEX))
            loss, accuracy, count = mean_loss_and_accuracy(logits, targets, valid, groups)
            return PackedBertSequenceClassifierOutput(loss, logits, accuracy, count)
        if kind not in PROBLEM_TYPES:
            raise ValueError("problem_type must be one of %s or None, got %r" % (PROBLEM_TYPES, kind))
        if labels.dim() == 2:
            labels = labels.unsqueeze(-1)  # (B, K) -> (B, K, 1)
        if tuple(labels.shape) != tuple(logits.shape):
            raise ValueError("%s labels must be (B, K, num_labels) = %s%s, got %s"
                             % (kind, tuple(logits.shape), " or (B, K)" if self.num_labels == 1 else "",
                                tuple(labels.shape)))
        work = logits.to(dtype)  # (B, K, L), float32 for half logits
        targets = torch.where(in_use.unsqueeze(-1), labels.to(dtype), torch.zeros_like(work))  # empty slots: 0
        per_label = squared_error(work, targets) if kind == "regression" else (
            binary_cross_entropy_with_logits(work, targets))  # (B, K, L)
        weight = in_use.unsqueeze(-1).to(dtype)  # (B, K, 1)
        count = in_use.sum().to(dtype)
        if groups > 1:
            elements = group_sums(weight, groups) * self.num_labels  # per micro batch
            loss = group_means(group_sums(per_label * weight, groups), elements)
        else:
            elements = (count * self.num_labels).clamp(min=1.0)
            loss = (per_label * weight).sum() / elements
        if kind == "regression":
            accuracy = torch.zeros((), dtype=dtype, device=logits.device)
        else:
            agree = ((work > 0) == (targets > 0.5)).to(dtype)  # (B, K, L)
            accuracy = (group_means(group_sums(agree * weight, groups), elements) if groups > 1
                        else (agree * weight).sum() / elements)
        return PackedBertSequenceClassifierOutput(loss, logits, accuracy, count)


class PackedBertForSequenceClassification(PackedBertTaskModel):
    """BERT for classification / regression of each sequence of a pack; the packed counterpart of
    transformers' ``BertForSequenceClassification`` (same modules and parameter names: ``bert``,
    ``dropout``, ``classifier``). See the module docstring for labels and losses, the package docstring
    for the batch contract."""

    HF_ARCHITECTURE = "BertForSequenceClassification"
    TASK = tasks.CLASSIFICATION.name
    FRESH_HEAD = ("bert.pooler.", "classifier.")

    def __init__(self, config: Any, attention: Optional[str] = None) -> None:
        super().__init__(config, attention)
        problem_type = getattr(self.config, "problem_type", None)
        if problem_type is not None and problem_type not in PROBLEM_TYPES:
            raise ValueError("problem_type must be one of %s or None, got %r" % (PROBLEM_TYPES, problem_type))
        self.num_labels = int(self.config.num_labels)
        if self.num_labels < 1:
            raise ValueError("num_labels must be at least 1, got %d" % self.num_labels)
        rate = getattr(self.config, "classifier_dropout", None)
        self.dropout = nn.Dropout(self.config.hidden_dropout_prob if rate is None else rate)
        self.classifier = nn.Linear(self.config.hidden_size, self.num_labels)
        self.heads = SequenceClassificationHeads(self.num_labels, problem_type)
        self.apply(self._init_weights)

    def classification_heads(self, h: torch.Tensor, sequence_ids: torch.Tensor, cls_positions: torch.Tensor,
                             labels: Optional[torch.Tensor] = None) -> PackedBertSequenceClassifierOutput:
        """Final hidden states (B, S, H) and the head's fields -> the output (what stages.py's last part runs;
        derives the slots in use from ``sequence_ids`` itself)."""
        in_use = slots_in_use(sequence_ids, cls_positions.shape[1])
        return self.heads(h, in_use, cls_positions, labels, self.bert.pooler, self.dropout, self.classifier)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        sequence_ids: torch.Tensor,
        cls_positions: torch.Tensor,
        labels: Optional[torch.Tensor] = None,
        *,
        loss_groups: int = 1,
    ) -> PackedBertSequenceClassifierOutput:
        """``loss_groups``: the rows are that many micro batches of one step (equal, consecutive), the loss and
        accuracy their micro batches' means averaged (a keyword-only setting, not a batch field)."""
        num_slots = cls_positions.shape[1]
        h, in_use = self.encode(input_ids, token_type_ids, position_ids, sequence_ids,
                                lambda ids: slots_in_use(ids, num_slots))  # (B, S, H), (B, K)
        grouped = (loss_groups,) if loss_groups != 1 else ()  # the default keeps the heads' call as it always was
        return self.heads(h, in_use, cls_positions, labels, self.bert.pooler, self.dropout, self.classifier, *grouped)

    @classmethod
    def from_pretrained(
        cls,
        directory: str,
        attention: Optional[str] = None,
        fused_qkv: Optional[bool] = None,
        num_labels: Optional[int] = None,
        problem_type: Optional[str] = None,
        id2label: Optional[Dict[int, str]] = None,
        label2id: Optional[Dict[str, int]] = None,
        strict: bool = False,
        output_loading_info: bool = False,
    ) -> Any:
        """Read a transformers-format directory: a BertForSequenceClassification one (everything loaded), or
        a BertForPreTraining / BertModel one (this project's pretraining export included): encoder and pooler
        loaded, the classifier (and a missing pooler) freshly initialised as transformers does, the fresh and
        the unused weights named in a UserWarning (and returned with ``output_loading_info``). A directory
        without the encoder is refused; ``strict`` refuses any difference. ``num_labels``, ``problem_type``,
        ``id2label``, ``label2id`` replace config.json's (id2label sets num_labels; a classifier of another
        size in the directory is then a ValueError naming it)."""
        overrides = {}  # type: Dict[str, Any]
        if id2label is not None:
            overrides["id2label"] = {int(k): v for k, v in id2label.items()}
            overrides["label2id"] = label2id if label2id is not None else {v: int(k) for k, v in id2label.items()}
        elif num_labels is not None:
            overrides["num_labels"] = num_labels  # transformers' setter: LABEL_0.. names of that many labels
        if label2id is not None and id2label is None:
            overrides["label2id"] = label2id
        if problem_type is not None:
            overrides["problem_type"] = problem_type
        return cls._from_pretrained(directory, attention, fused_qkv, strict, overrides, output_loading_info)


def pipeline_stages(num_layers: int, layers_per_ipu: Sequence[int] = ()) -> Stages:
    """The parts of ``PackedBertForSequenceClassification`` (model/stages.py): the heads (pooler, dropout,
    classifier, loss) on the last device."""
    return heads_on_last_device(num_layers, layers_per_ipu, INPUTS, ("bert.pooler", "classifier"),
                                "classification_heads")


__all__ = [
    "INPUTS",
    "PROBLEM_TYPES",
    "PackedBertForSequenceClassification",
    "PackedBertSequenceClassifierOutput",
    "SequenceClassificationHeads",
    "pipeline_stages",
]
