"""LAMB (You et al., arXiv 1904.00962) for the torch backend, parameter groups, and the schedule.

The class is named `LAMB` and keeps its hyperparameters in `param_groups` (lr, betas, eps,
weight_decay, max_weight_norm) and its defaults in `defaults`, the torch way; the PopTorch runner
translates them into `poptorch.optim.LAMB`. Per parameter w with gradient g, at step t:

    m = beta1 * m + (1 - beta1) * g            v = beta2 * v + (1 - beta2) * g * g
    m_hat = m / (1 - beta1 ** t)               v_hat = v / (1 - beta2 ** t)      (bias_correction)
    u = m_hat / (sqrt(v_hat) + eps) + weight_decay * w
    r1 = min(||w||, max_weight_norm)           r2 = ||u||
    trust = r1 / r2 if r1 > 0 and r2 > 0 else 1
    w = w - lr * trust * u

max_weight_norm None means no clipping; 0 makes trust = 1 (plain Adam-style step), which is how
Graphcore's app exempts biases from the trust ratio.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch


class LAMB(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        max_weight_norm: Optional[float] = None,
        bias_correction: bool = True,
    ):
        if not lr > 0:
            raise ValueError("LAMB lr must be > 0")
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, max_weight_norm=max_weight_norm
        )
        self.bias_correction = bool(bias_correction)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("LAMB does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                if self.bias_correction:
                    m_hat = m / (1.0 - beta1 ** t)
                    v_hat = v / (1.0 - beta2 ** t)
                else:
                    m_hat, v_hat = m, v
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"] != 0:
                    update = update.add(p, alpha=group["weight_decay"])
                w_norm = torch.linalg.vector_norm(p)
                if group["max_weight_norm"] is not None:
                    w_norm = w_norm.clamp(max=float(group["max_weight_norm"]))
                u_norm = torch.linalg.vector_norm(update)
                trust = torch.where(
                    (w_norm > 0) & (u_norm > 0), w_norm / u_norm.clamp(min=torch.finfo(u_norm.dtype).tiny),
                    torch.ones_like(w_norm),
                )
                p.add_(update * trust, alpha=-group["lr"])
        return loss


def parameter_groups(model: torch.nn.Module, weight_decay: float, trust_ratio_on_bias: bool = False) -> List[dict]:
    """Three groups as in Graphcore's BERT app: matrices (decay), other 1-D weights such as LayerNorm
    (no decay), biases (no decay, no trust ratio unless asked). Empty groups are dropped."""
    biases, vectors, matrices = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.endswith("bias"):
            biases.append(p)
        elif p.dim() == 1:
            vectors.append(p)
        else:
            matrices.append(p)
    # A group without max_weight_norm keeps the default (None: trust ratio on).
    groups = [
        {"params": matrices, "weight_decay": weight_decay},
        {"params": vectors, "weight_decay": 0.0},
        {"params": biases, "weight_decay": 0.0, "max_weight_norm": None if trust_ratio_on_bias else 0.0},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(model: torch.nn.Module, optimizer_config, betas: Tuple[float, float]) -> torch.optim.Optimizer:
    """The configured optimizer, with `betas` as derived by the batch accounting."""
    groups = parameter_groups(model, optimizer_config.weight_decay, optimizer_config.trust_ratio_on_bias)
    if optimizer_config.name == "lamb":
        return LAMB(
            groups,
            lr=optimizer_config.lr,
            betas=tuple(betas),
            eps=optimizer_config.eps,
            bias_correction=optimizer_config.bias_correction,
        )
    for g in groups:
        g.pop("max_weight_norm", None)
    return adamw(groups, lr=optimizer_config.lr, betas=tuple(betas), eps=optimizer_config.eps)


def adamw(params, **settings) -> torch.optim.AdamW:
    """torch.optim.AdamW over ``params`` with ``settings``, fused where this torch has the fused kernel for the
    parameters' device (``fused_kernel``; transformers' Trainer picks it by default from torch 2.8): one pass over
    each weight and its two moments instead of about ten elementwise ops, each a pass of its own. The update is
    AdamW's; its float32 rounding may differ from the per-op loop in the last bit. Elsewhere the per-op loop. A
    checkpoint's optimizer state keeps the choice it was saved with (``load_state_dict`` restores each group's
    ``fused``), so a resumed run steps as the run it continues."""
    params = list(params)
    tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
    fused = bool(tensors) and fused_kernel(tensors[0].device.type)
    return torch.optim.AdamW(params, **dict(settings, fused=True) if fused else settings)


def fused_kernel(device_type: str, version: str = torch.__version__) -> bool:
    """Whether torch ``version`` has the fused AdamW kernel for ``device_type``: CUDA's since torch 2.0, the
    CPU's since 2.4 (torch 2.0.1 builds AdamW(fused=True) over CPU tensors and fails at its first step)."""
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    if device_type == "cuda":
        return True
    return device_type == "cpu" and (major, minor) >= (2, 4)


class WarmupDecay:
    """Learning-rate multiplier: linear warm-up over `warmup_steps`, then linear / poly decay to
    `end_fraction` at `total_steps`, or constant. A callable object so LambdaLR can save it."""

    def __init__(self, total_steps: int, warmup_steps: int, decay: str, power: float = 1.0, end_fraction: float = 0.0):
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.power = float(power)
        self.end_fraction = float(end_fraction)

    def __call__(self, step: int) -> float:
        if self.warmup_steps > 0 and step < self.warmup_steps:
            return (step + 1) / float(self.warmup_steps)
        if self.decay == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, max(0.0, (step - self.warmup_steps) / float(span)))
        power = 1.0 if self.decay == "linear" else self.power
        return self.end_fraction + (1.0 - self.end_fraction) * (1.0 - progress) ** power


def build_scheduler(optimizer: torch.optim.Optimizer, schedule_config, total_steps: int):
    warmup = int(math.floor(schedule_config.warmup_fraction * total_steps))
    fn = WarmupDecay(total_steps, warmup, schedule_config.decay, schedule_config.poly_power,
                     schedule_config.end_lr_fraction)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
