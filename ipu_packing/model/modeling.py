"""Packed BERT for pretraining: modules named and shaped as transformers' ``BertForPreTraining``.

Shape legend: B packs in the batch, S tokens per pack, K sequence slots per pack, M MLM slots per pack,
H hidden size, N attention heads, D = H / N head size, I intermediate size, V vocabulary size.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable, Dict, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import tasks
from ..data.format import IGNORE_INDEX  # the pack format's label of an unused slot (numpy only)
from .attention import CONFIG_ATTRIBUTE, build_mask, resolve_attention
from .self_attention import fused_qkv, self_attention
from .per_sequence import gather_positions, mean_loss_and_accuracy

_gather = gather_positions  # the names tests/test_execution_poptorch.py and tests/test_model_half.py call
_mean_loss_and_accuracy = mean_loss_and_accuracy


class PackedBertOutput(NamedTuple):
    """Everything one forward pass returns; a NamedTuple of tensors (compile-, DDP-, pipeline-, PopTorch-safe).
    Losses, accuracies and counts are float32 for a float32, fp16 or bf16 (autocast) model, float64 for a
    float64 one."""

    loss: torch.Tensor
    """() mlm_loss + nsp_loss."""
    mlm_loss: torch.Tensor
    """() mean cross-entropy over the batch's valid MLM slots (0 when there are none)."""
    nsp_loss: torch.Tensor
    """() mean cross-entropy over the batch's valid sequences (0 when there are none)."""
    mlm_logits: torch.Tensor
    """(B, M, V) vocabulary logits at each MLM slot (unused slots hold those of position 0: ignore them)."""
    nsp_logits: torch.Tensor
    """(B, K, 2) NSP logits per sequence slot, label 0 = is next, 1 = random (unused slots: ignore)."""
    mlm_accuracy: torch.Tensor
    """() fraction of valid MLM slots whose argmax equals the label."""
    nsp_accuracy: torch.Tensor
    """() fraction of valid sequences whose NSP argmax equals the label."""
    mlm_count: torch.Tensor
    """() number of valid MLM slots in the batch (weight for exact means across micro batches)."""
    nsp_count: torch.Tensor
    """() number of valid sequences in the batch."""


def _activation(name: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    if callable(name):
        return name
    table = {
        "gelu": F.gelu,
        "gelu_python": F.gelu,  # transformers' pure-Python erf GELU: the same function
        "gelu_new": functools.partial(F.gelu, approximate="tanh"),
        "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
        "relu": F.relu,
        "silu": F.silu,
        "swish": F.silu,
        "tanh": torch.tanh,
    }
    if name not in table:
        raise ValueError("hidden_act must be one of %s, got %r" % (sorted(table), name))
    return table[name]


class BertEmbeddings(nn.Module):
    """Word + token type + position embeddings (positions looked up from ``position_ids``), LayerNorm, dropout."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """(B, S) ids, int32 or int64 -> (B, S, H)."""
        h = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        h = h + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(h))  # (B, S, H)


class BertOutput(nn.Module):
    """Project to the hidden size, dropout, add the residual, LayerNorm: (B, S, in) -> (B, S, H).

    Serves both places transformers names ``*.output``: after attention (in = H) and after the
    feed-forward intermediate (in = I), with transformers' parameter names.
    """

    def __init__(self, config: Any, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: Any, implementation: str) -> None:
        super().__init__()
        self.self = self_attention(config, implementation)  # query/key/value, or one fused qkv (config.fused_qkv)
        self.output = BertOutput(config, config.hidden_size)

    def forward(self, h: torch.Tensor, mask: Any) -> torch.Tensor:
        return self.output(self.self(h, mask), h)


class BertIntermediate(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _activation(config.hidden_act)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(h))  # (B, S, I)


class BertLayer(nn.Module):
    """One encoder layer: ``layer(h, mask) -> h``, (B, S, H) -> (B, S, H) (a tensor, not a tuple)."""

    def __init__(self, config: Any, implementation: str) -> None:
        super().__init__()
        self.attention = BertAttention(config, implementation)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config, config.intermediate_size)

    def forward(self, h: torch.Tensor, mask: Any) -> torch.Tensor:
        attended = self.attention(h, mask)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, config: Any, implementation: str) -> None:
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(config, implementation) for _ in range(config.num_hidden_layers)])

    def forward(self, h: torch.Tensor, mask: Any) -> torch.Tensor:
        for layer in self.layer:
            h = layer(h, mask)
        return h


class BertPooler(nn.Module):
    """Dense + tanh over the hidden state of each sequence's [CLS] (gathered by the caller)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(cls_hidden))  # (B, K, H)


class PackedBertModel(nn.Module):
    """Embeddings, the packed attention mask and the encoder; the pooler is applied by the heads (at each
    sequence's [CLS]). ``add_pooling_layer=False`` builds no pooler (``pooler`` is None), as transformers'
    ``BertModel(config, add_pooling_layer=False)`` inside ``BertForQuestionAnswering``."""

    def __init__(self, config: Any, implementation: str, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.attention_implementation = implementation
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config, implementation)
        self.pooler = BertPooler(config) if add_pooling_layer else None

    def get_attention_mask(self, sequence_ids: torch.Tensor) -> Any:
        """Mask from (B, S) ``sequence_ids`` in the form this model's layers take (see ``attention.py``):
        dense: (B, 1, S, S) additive, in the model's dtype (fp16 for a ``.half()`` model: half the bytes of
        an fp32 mask, stashed on every pipeline stage; as transformers' get_extended_attention_mask, whose
        dtype is the first parameter's); sdpa: the dense one (cast to the query's dtype where autocast changed
        it); flex: a ``BlockMask``."""
        dtype = self.embeddings.word_embeddings.weight.dtype
        return build_mask(self.attention_implementation, sequence_ids, dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        sequence_ids: torch.Tensor,
    ) -> torch.Tensor:
        """(B, S) fields -> final hidden states (B, S, H)."""
        h = self.embeddings(input_ids, token_type_ids, position_ids)
        mask = self.get_attention_mask(sequence_ids)
        return self.encoder(h, mask)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = _activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(h)))


class BertLMPredictionHead(nn.Module):
    """Transform, then a decoder whose weight is tied to the word embeddings and whose bias is ``self.bias``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias  # one parameter, two names, as in transformers

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(h))  # (B, M, V)


class BertPreTrainingHeads(nn.Module):
    """MLM and NSP heads with their losses. Its forward runs every op after the encoder, so a pipeline
    block placed on this module covers all of them (see stages.py)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(
        self,
        h: torch.Tensor,
        pooler: nn.Module,
        mlm_positions: torch.Tensor,
        mlm_labels: torch.Tensor,
        cls_positions: torch.Tensor,
        nsp_labels: torch.Tensor,
        groups: int = 1,
    ) -> "PackedBertOutput":
        """Final hidden states (B, S, H), the pooler (kept at ``bert.pooler``, transformers' name) and the
        label fields -> ``PackedBertOutput``.

        Pooler + NSP head at each sequence's [CLS] (``cls_positions``, (B, K)); MLM transform + tied decoder
        only at ``mlm_positions`` (B, M), never over all S tokens; losses and accuracies over valid slots (each
        of ``groups`` micro batches' own, then their mean: per_sequence.mean_loss_and_accuracy).
        """
        mlm_labels = mlm_labels.long()
        nsp_labels = nsp_labels.long()
        mlm_valid = mlm_labels != IGNORE_INDEX  # (B, M)
        nsp_valid = nsp_labels != IGNORE_INDEX  # (B, K)

        mlm_logits = self.predictions(gather_positions(h, mlm_positions, mlm_valid))  # (B, M, V)
        pooled = pooler(gather_positions(h, cls_positions, nsp_valid))  # (B, K, H)
        nsp_logits = self.seq_relationship(pooled)  # (B, K, 2)

        mlm_loss, mlm_accuracy, mlm_count = mean_loss_and_accuracy(mlm_logits, mlm_labels, mlm_valid, groups)
        nsp_loss, nsp_accuracy, nsp_count = mean_loss_and_accuracy(nsp_logits, nsp_labels, nsp_valid, groups)
        return PackedBertOutput(
            loss=mlm_loss + nsp_loss,
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            mlm_logits=mlm_logits,
            nsp_logits=nsp_logits,
            mlm_accuracy=mlm_accuracy,
            nsp_accuracy=nsp_accuracy,
            mlm_count=mlm_count,
            nsp_count=nsp_count,
        )


def prepare_config(config: Any, attention: Optional[str] = None):
    """(a copy of ``config`` recording the attention implementation, the implementation): the checks every
    packed model runs on its config before building modules (shared by pretraining and the task heads)."""
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError("only position_embedding_type='absolute' is supported")
    for flag in ("is_decoder", "add_cross_attention"):
        # A decoder's causal mask and cross-attention are not part of this (encoder-only) model:
        # accepting the flags would silently compute something else than transformers does.
        if getattr(config, flag, False):
            raise ValueError("%s=True is not supported: the packed model is BERT's bidirectional encoder" % flag)
    _activation(config.hidden_act)  # refuse an unknown activation here, not inside the first layer
    fused_qkv(config)  # and a fused_qkv that is not a bool
    implementation = resolve_attention(config, attention)
    config = copy.deepcopy(config)
    setattr(config, CONFIG_ATTRIBUTE, implementation)
    return config, implementation


def init_bert_weights(module: nn.Module, std: float) -> None:
    """transformers' BERT initialisation of one module: N(0, ``std``) weights (``config.initializer_range``),
    zero biases and padding embedding, unit LayerNorm."""
    if isinstance(module, nn.Linear):
        module.weight.data.normal_(mean=0.0, std=std)
        if module.bias is not None:
            module.bias.data.zero_()
    elif isinstance(module, nn.Embedding):
        module.weight.data.normal_(mean=0.0, std=std)
        if module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        module.weight.data.fill_(1.0)
        module.bias.data.zero_()


class PackedBertForPreTraining(nn.Module):
    """BERT for pretraining on packs; see the package docstring for the batch contract and composition."""

    METRICS = tasks.PRETRAINING.metrics
    """The output's scalar fields a training step reports (averaged over micro batches and replicas)."""
    HF_ARCHITECTURE = "BertForPreTraining"
    """transformers' class of the same modules, written to config.json's ``architectures``."""
    TASK = tasks.PRETRAINING.name
    """Which parts stages.py declares for this model (stages.model_stages)."""

    def __init__(self, config: Any, attention: Optional[str] = None) -> None:
        super().__init__()
        self.config, implementation = prepare_config(config, attention)
        self.bert = PackedBertModel(self.config, implementation)
        self.cls = BertPreTrainingHeads(self.config)
        self.apply(self._init_weights)
        self.tie_weights()

    @property
    def attention_implementation(self) -> str:
        return self.bert.attention_implementation

    @property
    def tied(self) -> bool:
        return bool(getattr(self.config, "tie_word_embeddings", True))

    def tie_weights(self) -> None:
        """Decoder weight is the word-embedding matrix (unless ``config.tie_word_embeddings`` is False)."""
        if self.tied:
            self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        self.cls.predictions.decoder.bias = self.cls.predictions.bias

    def _init_weights(self, module: nn.Module) -> None:
        """transformers' BERT initialisation (init_bert_weights), and a zero MLM bias."""
        init_bert_weights(module, self.config.initializer_range)
        if isinstance(module, BertLMPredictionHead):
            module.bias.data.zero_()

    def pretraining_heads(
        self,
        h: torch.Tensor,
        mlm_positions: torch.Tensor,
        mlm_labels: torch.Tensor,
        cls_positions: torch.Tensor,
        nsp_labels: torch.Tensor,
        groups: int = 1,
    ) -> PackedBertOutput:
        """Final hidden states (B, S, H) and the label fields -> ``PackedBertOutput``: ``self.cls`` with the
        pooler (one module call, so a pipeline block on ``cls`` holds every op of the heads)."""
        return self.cls(h, self.bert.pooler, mlm_positions, mlm_labels, cls_positions, nsp_labels, groups)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        sequence_ids: torch.Tensor,
        mlm_positions: torch.Tensor,
        mlm_labels: torch.Tensor,
        cls_positions: torch.Tensor,
        nsp_labels: torch.Tensor,
        *,
        loss_groups: int = 1,
    ) -> PackedBertOutput:
        """``loss_groups``: the batch's rows are that many micro batches of one step (equal, consecutive), each
        loss and accuracy their micro batches' means averaged (a keyword-only setting, not a batch field)."""
        h = self.bert(input_ids, token_type_ids, position_ids, sequence_ids)  # (B, S, H)
        grouped = (loss_groups,) if loss_groups != 1 else ()  # the default keeps the heads' call as it always was
        return self.pretraining_heads(h, mlm_positions, mlm_labels, cls_positions, nsp_labels, *grouped)

    # -- transformers-format checkpoints (see pretrained.py) --------------------------------------------

    @classmethod
    def from_pretrained(
        cls, directory: str, attention: Optional[str] = None, strict: bool = True, fused_qkv: Optional[bool] = None
    ) -> "PackedBertForPreTraining":
        """Read a directory written by transformers (config.json + safetensors or pytorch_model.bin);
        ``fused_qkv`` (default: config.json's, else False) builds the fused projection from its weights."""
        from .pretrained import load_pretrained

        return load_pretrained(cls, directory, attention=attention, strict=strict, fused_qkv=fused_qkv)

    def save_pretrained(self, directory: str, safe_serialization: bool = True) -> None:
        """Write config.json + model.safetensors (or pytorch_model.bin) that BertForPreTraining loads back."""
        from .pretrained import save_pretrained

        save_pretrained(self, directory, safe_serialization=safe_serialization)

    def hf_state_dict(self) -> Dict[str, torch.Tensor]:
        """State dict without tied aliases, as transformers saves it."""
        from .pretrained import export_state_dict

        return export_state_dict(self)


__all__ = ["PackedBertForPreTraining", "PackedBertOutput", "PackedBertModel", "IGNORE_INDEX"]
