"""Packed BERT for pretraining, sequence classification and question answering (single device; placement is
applied from outside).

Mathematically equivalent to running each sequence of a pack on its own (checked against transformers'
BertForPreTraining in tests/test_model_equivalence.py, and each task model against its transformers class in its
own test module): no
token attends across sequences, positions restart in each sequence, MLM only at the masked slots, NSP and
classification once per sequence from its own [CLS], each QA softmax over its own sequence's positions.

Use:

    from ipu_packing.model import PackedBertForPreTraining, PackedBertOutput
    # attention: None (the default) | "dense" | "sdpa" | "flex" | "varlen"
    model = PackedBertForPreTraining(transformers.BertConfig(...), attention=None)
    out = model(input_ids=..., token_type_ids=..., position_ids=..., sequence_ids=...,   # each (B, S)
                mlm_positions=..., mlm_labels=...,                                      # each (B, M)
                cls_positions=..., nsp_labels=...)                                      # each (B, K)
    out.loss, out.mlm_loss, out.nsp_loss          # () float32 (float64 model: float64): total = mlm + nsp
    out.mlm_logits  # (B, M, V)    out.nsp_logits  # (B, K, 2)
    out.mlm_accuracy, out.nsp_accuracy            # () as the losses
    out.mlm_count, out.nsp_count                  # () as the losses: valid MLM slots / valid sequences

Batch fields (int32 or int64, both accepted): position_ids restart at 0 at each [CLS]; sequence_ids is 0 for
padding and k for the k-th sequence (1-based); cls_positions[k-1] is the index of sequence k's [CLS];
mlm_labels / nsp_labels hold -100 in unused slots, whose positions may hold anything (they are never read).
A padded batch is a batch of packs with K = 1: there is one code path.

Losses: mlm_loss is the mean cross-entropy over the batch's valid MLM slots, nsp_loss the mean over its valid
sequences (each 0, not NaN, when there are none). To combine micro batches exactly, weight by the counts.

Output: ``PackedBertOutput`` is a typing.NamedTuple of tensors (attribute access; a plain tuple to
torch.compile, DDP, torch.distributed.pipelining and PopTorch).

Fine-tuning and serving heads, on the same packed encoder (each task's model module, named by its recipe in
tasks/; what they share: heads.py, and per_sequence.py with the pretraining heads):

    from ipu_packing.model import PackedBertForSequenceClassification, PackedBertForQuestionAnswering
    model = PackedBertForSequenceClassification(config)  # config.num_labels (L), config.problem_type
    out = model(input_ids=..., token_type_ids=..., position_ids=..., sequence_ids=...,   # each (B, S)
                cls_positions=...,                                                      # (B, K)
                labels=...)            # (B, K) int, or float (B, K) (L = 1) / (B, K, L); None to serve
    out.logits                         # (B, K, L) per sequence slot (empty slots: ignore)
    out.loss, out.accuracy, out.count  # () each; loss and accuracy None without labels

    model = PackedBertForQuestionAnswering(config)       # config.num_labels 2 (start, end)
    out = model(input_ids=..., token_type_ids=..., position_ids=..., sequence_ids=...,   # each (B, S)
                start_positions=..., end_positions=...)  # each (B, K); or num_slots=K to serve
    out.start_logits, out.end_logits                     # (B, K, S) each slot over the row, own positions only
    out.token_start_logits, out.token_end_logits         # (B, S) every token
    out.loss, out.start_loss, out.end_loss               # () loss = (start_loss + end_loss) / 2
    out.start_accuracy, out.end_accuracy, out.start_count, out.end_count   # ()

Their labels: a slot holds a sequence when k < max(sequence_ids) of its row (per_sequence.slots_in_use), so the
labels of empty slots are never read. Classification (config.problem_type as transformers defines it,
None: chosen by transformers' rule): "single_label_classification", labels int, IGNORE_INDEX (-100) for a
sequence without one, mean cross-entropy over the labelled sequences; "regression", float labels, mean
squared error per element; "multi_label_classification", float labels in [0, 1], mean BCE-with-logits per
element. Question answering: start/end positions in the pack row (absolute), IGNORE_INDEX for an empty
slot; a position outside its own sequence is ignored (as transformers ignores one past its window); each
slot's positions of other sequences and padding hold torch.finfo(dtype).min, finite (no NaN on an empty
slot's row; torch.where passes no gradient there). Every mean is over the batch's valid sequences (0, not
NaN, when there are none); weight it by its count to combine micro batches. Composition:

    h, derived = model.encode(input_ids, token_type_ids, position_ids, sequence_ids, derive)
    # derive: slots.slots_in_use (classification, (B, K)) or slots.slot_membership (QA, (B, K, S)),
    # computed next to the mask (on the embeddings' device under PopTorch)
    out = model.heads(h, derived, ...)   # one call of a parameter-free module: a pipeline block on it holds
                                         # every op after the encoder (stages.py; heads on the last device)

``from_pretrained(dir)`` of a head takes a transformers directory of its own class, or the encoder of a
BertForPreTraining / BertModel one (this project's export included) with a fresh head, naming the fresh and
unused weights; ``save_pretrained(dir)`` writes what transformers' BertForSequenceClassification /
BertForQuestionAnswering loads with no missing or unexpected weights.

Composition (forward is exactly this; split it for pipelining):

    h = model.bert.embeddings(input_ids, token_type_ids, position_ids)   # (B, S, H)
    mask = model.bert.get_attention_mask(sequence_ids)                   # form depends on attention
    for layer in model.bert.encoder.layer:                               # nn.ModuleList
        h = layer(h, mask)                                               # (B, S, H) tensor
    out = model.pretraining_heads(h, mlm_positions, mlm_labels, cls_positions, nsp_labels)

``pretraining_heads`` is one call of ``model.cls`` (its forward gathers, runs model.bert.pooler at each cls
position, model.cls.seq_relationship, and model.cls.predictions: transform + decoder tied to the word
embeddings, so the part that runs the heads needs the word-embedding weight too). The pipeline parts of a
``layers_per_ipu`` split, with the modules and fields of each, are declared in ``stages.py``.

Attention (constructor argument ``attention``, else ``config.packed_attention``, else "dense"):
  "dense"  matmul + additive mask (B, 1, S, S) in the model's dtype, 0 or -10000; the default, for IPUs.
  "sdpa"   torch scaled_dot_product_attention with a bool mask (B, 1, S, S), True = attend.
  "flex"   FlexAttention with a BlockMask (torch >= 2.5, imported lazily; no attention dropout in training;
           the BlockMask is not a tensor, so not for pipelined stages).
  "varlen" SDPA within each sequence only (sum of l_i^2 scores, not S^2), padding left out (zero outputs);
           the mask is a VarlenLayout of the real sequences (see attention.py); not for PopTorch; under
           torch.compile with graph breaks at the layout (no fullgraph).
The rule: q attends to k iff sequence_ids[q] == sequence_ids[k]. Real tokens see only their own sequence;
padding sees only padding, so no query row is ever fully masked and no path can produce NaN.

config.fused_qkv (model.fused_qkv in a config file; default False): one Linear(H, 3H) per layer for query,
key and value (self_attention.py), as Graphcore's BertFusedSelfAttention computes them; still loads and
exports transformers' query/key/value tensors.

Submodules and parameters follow transformers' BertForPreTraining names and shapes: bert.embeddings.*,
bert.encoder.layer.N.*, bert.pooler.*, cls.predictions.* (decoder tied to word embeddings),
cls.seq_relationship.*. ``PackedBertForPreTraining.from_pretrained(dir)`` reads a transformers-saved
directory (safetensors or pytorch_model.bin); ``model.save_pretrained(dir)`` writes one that
``transformers.BertForPreTraining.from_pretrained`` loads.

Precision: fp32, or bf16/fp16 under torch.autocast (losses are computed in fp32); a .half() model builds an
fp16 mask and takes each MLM slot's loss in fp16, summing in fp32 (no fp32 copy of the logits). Works under
torch.compile(fullgraph=True, dynamic=False). Runs on Python 3.8 / torch 2.0.1 / transformers 4.x
(the "flex" and "varlen" paths excepted: varlen's kernels need torch >= 2.0 / 2.3, checked at use).
"""

from .attention import ATTENTION_IMPLEMENTATIONS
from .classification import PackedBertForSequenceClassification, PackedBertSequenceClassifierOutput
from .modeling import IGNORE_INDEX, PackedBertForPreTraining, PackedBertModel, PackedBertOutput
from .question_answering import PackedBertForQuestionAnswering, PackedBertQuestionAnsweringOutput

__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "IGNORE_INDEX",
    "PackedBertForPreTraining",
    "PackedBertForQuestionAnswering",
    "PackedBertForSequenceClassification",
    "PackedBertModel",
    "PackedBertOutput",
    "PackedBertQuestionAnsweringOutput",
    "PackedBertSequenceClassifierOutput",
]
