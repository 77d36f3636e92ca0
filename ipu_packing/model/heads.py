"""What the packed task models (each fine-tuning task's ``model``, tasks/) share: the packed encoder run with
the per-sequence tensors derived where PopTorch wants them, and transformers-format loading and saving
(pretrained.py). The per-slot bookkeeping and losses are in per_sequence.py, with the pretraining heads'.

Where the per-sequence tensors (slots.slots_in_use, slots.slot_membership) are computed: ``forward`` derives
them right after the embeddings, where the attention mask is built, so under PopTorch ``sequence_ids`` is
read on the embeddings' IPU only and the derived tensors travel to the heads' IPU as activations (PopART
streams an input onto one IPU only while pipelining). The heads' own entry point (the method a task model's
``pipeline_stages`` names, what stages.py runs for a torch pipeline, where any stage may read any batch field)
derives them from ``sequence_ids`` itself.

Shape legend: B packs, S tokens per pack, K sequence slots per pack, H hidden size.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from .modeling import PackedBertModel, init_bert_weights, prepare_config


class PackedBertTaskModel(nn.Module):
    """The packed encoder (``bert``) under a task head; subclasses add the head. Parameters carry
    transformers' names (bert.embeddings.*, bert.encoder.layer.N.*, bert.pooler.* where there is one, then
    the head's), so the state dict is transformers' own."""

    HF_ARCHITECTURE = ""
    """transformers' class of the same modules (config.json ``architectures``)."""
    TASK = ""
    """Which parts stages.py declares for this model (stages.model_stages)."""
    FRESH_HEAD: Tuple[str, ...] = ()
    """Weight-name prefixes ``from_pretrained`` may leave at their fresh initialisation (the head)."""
    ADD_POOLING_LAYER = True
    SERVED: Tuple[str, ...] = ("logits",)
    """The output fields serving brings back from the device (execution/poptorch_backend.py PoptorchInference)."""

    def __init__(self, config: Any, attention: Optional[str] = None) -> None:
        super().__init__()
        self.config, implementation = prepare_config(config, attention)
        self.bert = PackedBertModel(self.config, implementation, add_pooling_layer=self.ADD_POOLING_LAYER)

    @property
    def attention_implementation(self) -> str:
        return self.bert.attention_implementation

    @property
    def tied(self) -> bool:
        return False  # no weight is shared with the embeddings

    def tie_weights(self) -> None:
        """Nothing to tie (pretrained.py calls it on every model it loads)."""

    def _init_weights(self, module: nn.Module) -> None:
        init_bert_weights(module, self.config.initializer_range)

    def encode(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor,
               sequence_ids: torch.Tensor, derive: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        """(final hidden states (B, S, H), ``derive(sequence_ids)``): the embeddings, then the attention mask
        and ``derive`` (both on the embeddings' device under PopTorch: its block is current until the first
        layer's begins), then the encoder."""
        h = self.bert.embeddings(input_ids, token_type_ids, position_ids)  # (B, S, H)
        mask = self.bert.get_attention_mask(sequence_ids)
        derived = derive(sequence_ids)
        return self.bert.encoder(h, mask), derived

    # -- transformers-format directories (pretrained.py) ----------------------------------------------

    @classmethod
    def _from_pretrained(cls, directory: str, attention: Optional[str], fused_qkv: Optional[bool], strict: bool,
                         overrides: Dict[str, Any], output_loading_info: bool) -> Any:
        from .pretrained import load_pretrained

        return load_pretrained(cls, directory, attention=attention, strict=strict, fused_qkv=fused_qkv,
                               config_overrides=overrides, output_loading_info=output_loading_info)

    def save_pretrained(self, directory: str, safe_serialization: bool = True) -> None:
        """config.json (architectures: HF_ARCHITECTURE) + model.safetensors (or pytorch_model.bin), which
        transformers' class of the same name loads with no missing and no unexpected weights."""
        from .pretrained import save_pretrained

        save_pretrained(self, directory, safe_serialization=safe_serialization)

    def hf_state_dict(self) -> Dict[str, torch.Tensor]:
        """The state dict as transformers saves it (a fused qkv split into query, key and value)."""
        from .pretrained import export_state_dict

        return export_state_dict(self)


__all__ = ["PackedBertTaskModel"]
