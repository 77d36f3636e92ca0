"""LAMB and the learning-rate schedule against hand computations."""

import copy
import math

import numpy as np
import pytest
import torch

from ipu_packing.train.optim import LAMB, WarmupDecay, build_scheduler, parameter_groups


def _hand_lamb(w, grads, lr, b1, b2, eps, wd, bias_correction=True, max_weight_norm=None):
    """LAMB in float64 numpy, step by step, from the paper's formulas."""
    w = np.array(w, dtype=np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, dtype=np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t) if bias_correction else m
        v_hat = v / (1 - b2 ** t) if bias_correction else v
        u = m_hat / (np.sqrt(v_hat) + eps) + wd * w
        r1 = np.linalg.norm(w)
        if max_weight_norm is not None:
            r1 = min(r1, max_weight_norm)
        r2 = np.linalg.norm(u)
        trust = r1 / r2 if r1 > 0 and r2 > 0 else 1.0
        w = w - lr * trust * u
    return w


@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("max_weight_norm", [None, 0.0, 0.5])
def test_lamb_matches_hand_computation(bias_correction, max_weight_norm):
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(3, 4))
    grads = [rng.normal(size=(3, 4)) for _ in range(3)]
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    opt = LAMB([{"params": [p], "weight_decay": 0.01, "max_weight_norm": max_weight_norm}],
               lr=0.05, betas=(0.8, 0.95), eps=1e-6, bias_correction=bias_correction)
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    expected = _hand_lamb(w0, grads, 0.05, 0.8, 0.95, 1e-6, 0.01, bias_correction, max_weight_norm)
    np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    # the trust ratio matters: the update differs from the Adam-style one unless it is clipped to 1
    adam_like = _hand_lamb(w0, grads, 0.05, 0.8, 0.95, 1e-6, 0.01, bias_correction, max_weight_norm=0.0)
    assert np.abs(expected - adam_like).max() > 1e-6 or max_weight_norm == 0.0


def test_lamb_zero_weight_uses_trust_one():
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    opt = LAMB([p], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
    p.grad = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    opt.step()
    expected = _hand_lamb(np.zeros(4), [p.grad.numpy()], 0.1, 0.9, 0.999, 1e-6, 0.0)
    np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-12)


def test_lamb_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    opt_a = LAMB(parameter_groups(a, 0.01), lr=0.01)
    x = torch.randn(8, 4)
    for _ in range(2):
        opt_a.zero_grad()
        a(x).pow(2).sum().backward()
        opt_a.step()
    b.load_state_dict(a.state_dict())
    opt_b = LAMB(parameter_groups(b, 0.01), lr=0.01)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as if read back from disk
    for model, opt in ((a, opt_a), (b, opt_b)):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_parameter_groups_follow_graphcore():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    groups = parameter_groups(model, 0.01)
    assert [len(g["params"]) for g in groups] == [1, 1, 2]  # matrix, LayerNorm weight, biases
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0, 0.0]
    assert "max_weight_norm" not in groups[0] and groups[2]["max_weight_norm"] == 0.0


def test_schedule_warmup_then_linear_and_poly():
    linear = WarmupDecay(total_steps=10, warmup_steps=2, decay="linear")
    assert [linear(s) for s in range(11)] == pytest.approx(
        [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0])
    poly = WarmupDecay(total_steps=10, warmup_steps=2, decay="poly", power=2.0, end_fraction=0.1)
    assert poly(6) == pytest.approx(0.1 + 0.9 * 0.5 ** 2)
    assert poly(10) == pytest.approx(0.1)
    assert WarmupDecay(10, 0, "constant")(7) == 1.0


def test_scheduler_drives_lr_and_saves_state():
    p = torch.nn.Parameter(torch.ones(2))
    opt = LAMB([p], lr=0.4)

    class Sched:
        warmup_fraction, decay, poly_power, end_lr_fraction = 0.25, "linear", 1.0, 0.0

    sched = build_scheduler(opt, Sched, total_steps=8)
    lrs = []
    for _ in range(8):
        lrs.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(2)
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.2, 0.4, 0.4, 1 / 3 * 0.4 * 2.5, 0.4 * 4 / 6, 0.4 * 3 / 6, 0.4 * 2 / 6, 0.4 / 6])
    state = sched.state_dict()
    assert state["last_epoch"] == 8
    assert math.isclose(state["lr_lambdas"][0]["total_steps"], 8)


def test_poptorch_translation_keeps_lamb_groups():
    """The PopTorch runner builds poptorch.optim.LAMB from our optimizer: the constructor takes the torch
    optimizer's defaults and every group spells out its own values, so group order does not matter."""
    import types

    from ipu_packing.execution import ExecutionConfig
    from ipu_packing.execution.poptorch_backend import translate_optimizer
    from ipu_packing.train.run_config import OptimizerConfig
    from ipu_packing.train.optim import build_optimizer

    recorded = {}

    class FakeLAMB:
        def __init__(self, groups, **kwargs):
            recorded["groups"], recorded["kwargs"] = groups, kwargs

    fake = types.SimpleNamespace(optim=types.SimpleNamespace(LAMB=FakeLAMB))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model, OptimizerConfig(lr=0.002828, bias_correction=False), betas=(0.81, 0.998))
    translate_optimizer(optimizer, ExecutionConfig(backend="poptorch", precision="fp16", loss_scaling=128.0), fake)
    kwargs, groups = recorded["kwargs"], recorded["groups"]
    assert kwargs["bias_correction"] is False and kwargs["loss_scaling"] == 128.0
    assert kwargs["lr"] == 0.002828 and kwargs["betas"] == (0.81, 0.998) and kwargs["weight_decay"] == 0.0
    assert "max_weight_norm" not in kwargs  # default None: the trust ratio applies to matrices
    assert groups[0]["weight_decay"] == 0.01 and "max_weight_norm" not in groups[0]  # matrices
    assert groups[2]["max_weight_norm"] == 0.0 and groups[2]["weight_decay"] == 0.0  # biases


def test_adamw_steps_as_torch_adamw_and_is_fused_where_torch_has_the_kernel():
    """optimizer.name adamw: torch's AdamW with the three groups, fused on a torch with the CPU kernel (2.4 on),
    its weights within float32 rounding of the per-op loop's after a few steps, and moved by them."""
    from torch.torch_version import TorchVersion

    from ipu_packing.train.optim import build_optimizer
    from ipu_packing.train.sections import OptimizerConfig

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    twin = copy.deepcopy(model)
    config = OptimizerConfig(name="adamw", lr=0.01, weight_decay=0.01)
    optimizer = build_optimizer(model, config, betas=(0.9, 0.99))
    groups = parameter_groups(twin, 0.01)
    for g in groups:
        g.pop("max_weight_norm", None)
    reference = torch.optim.AdamW(groups, lr=0.01, betas=(0.9, 0.99), eps=1e-6, foreach=False)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert bool(optimizer.defaults.get("fused")) == (TorchVersion(torch.__version__) >= "2.4")
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0, 0.0]
    start = [p.detach().clone() for p in model.parameters()]
    for step in range(5):
        grads = [torch.randn_like(p) for p in model.parameters()]
        for m, opt in ((model, optimizer), (twin, reference)):
            for p, g in zip(m.parameters(), grads):
                p.grad = g.clone()
            opt.step()
    for p, q, s in zip(model.parameters(), twin.parameters(), start):
        assert not torch.equal(p, s)
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device, version, fused", [
    ("cpu", "2.0.1+cu117", False),  # the Poplar SDK's torch: AdamW(fused=True) is built, then its step fails
    ("cpu", "2.3.1", False), ("cpu", "2.4.0", True), ("cpu", "2.13.0", True),
    ("cuda", "2.0.1+cu117", True), ("meta", "2.13.0", False)])
def test_adamw_is_fused_only_where_torch_has_the_kernel(device, version, fused):
    from ipu_packing.train.optim import fused_kernel

    assert fused_kernel(device, version) is fused
