"""Inference: the packed model's forward pass on batches of packs, on the backend an ExecutionConfig names.

    infer = make_inference(model, config)      # torch (CPU, CUDA) or PopTorch (poptorch.inferenceModel)
    out = infer(batch)                         # batch: {field: (B, ...)}; the model's output for its B rows
    infer.packs_per_call                       # None: any B; PopTorch: the compiled batch, which a caller pads to

The torch path runs the model in eval mode without gradients, under the config's autocast (bf16/fp16); it is what
fine-tuning's evaluation and ``ipu_packing.predict`` use on CPU and GPU. The PopTorch path (poptorch_backend.py
``PoptorchInference``) places the model's parts on the IPUs as training does and compiles the forward pass alone.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from .config import ExecutionConfig
from .runner_common import autocast, model_inputs


class TorchInference:
    """The model on its device (the config's), eval mode, no gradients."""

    packs_per_call: Optional[int] = None

    def __init__(self, model: torch.nn.Module, config: Optional[ExecutionConfig] = None) -> None:
        self.config = config or ExecutionConfig()
        where = next(model.parameters()).device
        self.device = torch.device(self.config.device) if config is not None else where
        # moving a model walks every module (about 1 ms for the demo's): only where it is elsewhere
        self.model = model if where == self.device else model.to(self.device)
        self.inputs = model_inputs(model)  # the batch fields forward takes (labels too: a loss when present)

    def __call__(self, batch: Dict[str, Any]) -> Any:
        was_training = self.model.training
        if was_training:  # eval() and train() walk every module too: only a model in train mode is switched
            self.model.eval()
        try:
            with torch.no_grad(), autocast(self.config, self.device):
                return self.model(**{k: torch.as_tensor(batch[k]).to(self.device) for k in self.inputs if k in batch})
        finally:
            if was_training:
                self.model.train()


def make_inference(model: torch.nn.Module, config: Optional[ExecutionConfig] = None):
    """The inference runner ``config`` asks for (None: torch, where the model already is)."""
    if config is not None and config.backend == "poptorch":
        from .poptorch_backend import PoptorchInference

        return PoptorchInference(model, config)
    return TorchInference(model, config)


__all__ = ["TorchInference", "make_inference"]
