"""attention='varlen' (each sequence attends only to itself, padding left out) equals the dense mask.

Per sequence, with identical weights: MLM logits at every masked token, NSP logits of every sequence and
every parameter's gradient of the loss, within 1e-5 in float32 and 1e-12 in float64, against the packed
model's dense path and against transformers run on each sequence alone (the harness of
tests/test_model_equivalence.py). Packs of 1 to 8 sequences, with and without padding, with sequences of
length 1, 2 and 3; both varlen kernels ("grouped", the CPU default, and "nested" jagged tensors).
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ipu_packing.model import attention as attention_module
from ipu_packing.model.attention import attend, build_mask, resolve_attention, varlen_layout
from model_fixtures import CONFIGS, FP64_ATOL, GRAD_ATOL, LOGIT_ATOL, gather_reference, run_both
from torch_features import requires_torch_compile

# the nested kernel needs jagged nested tensors (torch >= 2.3); the grouped one runs on torch 2.0.1
NESTED_MISSING = None if hasattr(torch.nested, "nested_tensor_from_jagged") else (
    "varlen kernel 'nested' needs torch >= 2.3, this is torch %s" % torch.__version__)
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")

# S = 32 (the harness's SEQ_LEN), at most 8 sequences and 24 MLM slots per pack. Every pack size 1..8 occurs;
# "full" packs fill all 32 tokens, the others end in padding; lengths 1, 2 and 3 occur many times.
VARLEN_PACKS = [
    [1],  # 1 sequence, 31 padding
    [32],  # 1 sequence, full
    [2, 3],  # 2, padded
    [3, 1, 28],  # 3, full
    [5, 5, 5, 5],  # 4, padded
    [10, 5, 7, 6, 4],  # 5, full
    [2, 9, 1, 13, 3, 1],  # 6, padded
    [1, 1, 1, 1, 1, 1, 26],  # 7, full
    [4, 4, 4, 4, 4, 4, 4, 4],  # 8, full
    [1, 2, 3, 1, 2, 3, 1, 2],  # 8, padded
]
KERNELS = ("grouped",
           pytest.param("nested", marks=pytest.mark.skipif(NESTED_MISSING is not None, reason=str(NESTED_MISSING))))


@pytest.fixture(params=KERNELS)
def kernel(request, monkeypatch):
    """Run the model's varlen path with this kernel (the model builds its layout with the default)."""
    monkeypatch.setattr(attention_module, "varlen_layout", functools.partial(varlen_layout, kernel=request.param))
    return request.param


def per_sequence_outputs(packed, batch, dtype):
    """MLM logits at valid slots, NSP logits of valid sequences, and every gradient of the mean loss."""
    packed.zero_grad()
    out = packed(**batch)
    mlm_valid = batch["mlm_labels"] != -100
    nsp_valid = batch["nsp_labels"] != -100
    # the loss as a mean in the model's own dtype (its built-in loss is float32, see test_model_equivalence)
    loss = F.cross_entropy(out.mlm_logits[mlm_valid], batch["mlm_labels"][mlm_valid].long()) + F.cross_entropy(
        out.nsp_logits[nsp_valid], batch["nsp_labels"][nsp_valid].long()
    )
    assert loss.dtype == dtype
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in packed.named_parameters()}
    return out.mlm_logits[mlm_valid].detach(), out.nsp_logits[nsp_valid].detach(), grads, loss.item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_varlen_equals_dense_and_transformers(name, dtype, kernel):
    tolerance = {torch.float32: (LOGIT_ATOL, GRAD_ATOL), torch.float64: (FP64_ATOL, FP64_ATOL)}[dtype]
    reference, varlen, groups, batch, hf_inputs = run_both(CONFIGS[name], "varlen", lengths=VARLEN_PACKS)
    _, dense, _, _, _ = run_both(CONFIGS[name], "dense", lengths=VARLEN_PACKS)
    assert varlen.attention_implementation == "varlen" and dense.attention_implementation == "dense"
    for model in (reference, varlen, dense):
        model.to(dtype)

    mlm, nsp, grads, loss = per_sequence_outputs(varlen, batch, dtype)
    mlm_dense, nsp_dense, grads_dense, loss_dense = per_sequence_outputs(dense, batch, dtype)

    hf_out = reference(**hf_inputs)
    mlm_ref, nsp_ref = gather_reference(groups, batch, hf_out, hf_inputs)
    mlm_ref = mlm_ref[batch["mlm_labels"] != -100].detach()
    nsp_ref = nsp_ref[batch["nsp_labels"] != -100].detach()
    hf_out.loss.backward()  # transformers' loss: the same two means (fp64: its own, in float64)
    grads_ref = {n: p.grad for n, p in reference.named_parameters()}

    assert nsp.shape[0] == sum(len(g) for g in groups) and mlm.shape[0] > 0
    diffs = {
        "mlm vs dense": (mlm - mlm_dense).abs().max().item(),
        "nsp vs dense": (nsp - nsp_dense).abs().max().item(),
        "mlm vs transformers": (mlm - mlm_ref).abs().max().item(),
        "nsp vs transformers": (nsp - nsp_ref).abs().max().item(),
    }
    grad_dense = max((grads[n] - grads_dense[n]).abs().max().item() for n in grads)
    grad_ref = max((grads[n] - grads_ref[n]).abs().max().item() for n in grads)
    print("%s %s %s: %s, gradients vs dense %.1e, vs transformers %.1e" % (
        name, dtype, kernel, ", ".join("%s %.1e" % kv for kv in diffs.items()), grad_dense, grad_ref))
    for what, diff in diffs.items():
        assert diff <= tolerance[0], (what, diff)
    assert abs(loss - loss_dense) <= tolerance[1] * max(1.0, abs(loss_dense)), (loss, loss_dense)
    assert sorted(grads) == sorted(grads_dense) == sorted(grads_ref)
    for n in grads:
        assert (grads[n] - grads_dense[n]).abs().max().item() <= tolerance[1], n
        assert (grads[n] - grads_ref[n]).abs().max().item() <= tolerance[1], n
    # not trivially equal: real logits and gradients
    assert loss > 0.5 and grads["bert.embeddings.position_embeddings.weight"].abs().sum() > 0
    assert grads["bert.encoder.layer.0.attention.self.query.weight"].abs().sum() > 0


def random_ids(rng, batch, length, interleave):
    """(B, S) sequence ids: packs of 1..8 sequences of lengths >= 1, padding at the end of some; with
    ``interleave`` the tokens are shuffled within each pack (the layout must not assume contiguity)."""
    rows = []
    for _ in range(batch):
        k = int(rng.integers(1, 9))
        used = int(rng.integers(k, length + 1))
        cuts = np.sort(rng.choice(np.arange(1, used), size=k - 1, replace=False)) if k > 1 else np.array([], int)
        sizes = np.diff(np.concatenate([[0], cuts, [used]]))
        row = np.concatenate([np.repeat(np.arange(1, k + 1), sizes), np.zeros(length - used, int)])
        if interleave:
            rng.shuffle(row)
        rows.append(row)
    return torch.tensor(np.stack(rows))


@pytest.mark.parametrize("interleave", [False, True], ids=["contiguous", "interleaved"])
@pytest.mark.parametrize("kernel_name", KERNELS)
def test_varlen_attend_equals_dense_attend(kernel_name, interleave):
    """The kernel alone, fp64: every real token's output and the q/k/v gradients equal the dense mask's;
    padding outputs are exactly zero and padding gets no gradient."""
    rng = np.random.default_rng(3)
    generator = torch.Generator().manual_seed(3)
    ids = random_ids(rng, batch=12, length=16, interleave=interleave)
    B, S, N, D = ids.shape[0], ids.shape[1], 3, 5
    dropout = torch.nn.Dropout(0.0)
    qkv = [torch.randn(B, N, S, D, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    layout = varlen_layout(ids, kernel=kernel_name)
    assert layout.kernel == kernel_name
    expected = sorted(int((row == k).sum()) for row in ids for k in range(1, int(row.max()) + 1))
    assert sorted(layout.lengths) == expected and min(expected) >= 1
    out = attend("varlen", *qkv, layout, dropout)
    weights = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    grads = torch.autograd.grad((out * weights).sum(), qkv)
    ref = attend("dense", *qkv, build_mask("dense", ids).double(), dropout)
    real = (ids > 0)[:, None, :, None].expand_as(out)
    grads_ref = torch.autograd.grad((ref * weights * real).sum(), qkv)
    assert out.shape == (B, N, S, D)
    assert (out - ref)[real].abs().max().item() <= FP64_ATOL
    assert bool((out[~real] == 0).all())
    for g, g_ref in zip(grads, grads_ref):
        assert (g - g_ref).abs().max().item() <= FP64_ATOL
        assert bool((g[~real] == 0).all())


def test_varlen_layout_scores_only_within_sequences():
    """sum(l_i^2) scores, not S^2: the grouped kernel's groups hold each sequence once, at its length."""
    ids = torch.tensor([[1, 1, 1, 2, 2, 0, 0, 0], [1, 2, 2, 3, 3, 3, 3, 3]])
    layout = varlen_layout(ids, kernel="grouped")
    assert layout.lengths == (3, 2, 1, 2, 5)
    assert [tuple(g.shape) for g in layout.groups] == [(1, 1), (2, 2), (1, 3), (1, 5)]
    assert sum(g.shape[0] * g.shape[1] ** 2 for g in layout.groups) == 9 + 4 + 1 + 4 + 25
    assert layout.offsets.tolist() == [0, 3, 5, 6, 8, 13]
    assert layout.order.tolist() == [0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13, 14, 15]
    # all padding: no sequences, zero outputs
    empty = varlen_layout(torch.zeros(2, 4, dtype=torch.long), kernel="grouped")
    q = torch.randn(2, 1, 4, 3)
    assert bool((attend("varlen", q, q, q, empty, torch.nn.Dropout(0.0)) == 0).all())


def test_varlen_is_an_implementation_and_poptorch_refuses_it():
    from ipu_packing.errors import UserError
    from ipu_packing.execution.poptorch_backend import check_backend

    assert resolve_attention(None, "varlen") == "varlen"
    with pytest.raises(UserError, match="dense"):
        check_backend("varlen")


def test_varlen_old_torch_is_one_clear_error(monkeypatch):
    ids = torch.tensor([[1, 1, 0]])
    monkeypatch.delattr(F, "scaled_dot_product_attention")
    with pytest.raises(RuntimeError, match=r"needs torch >= 2\.0") as info:
        varlen_layout(ids)
    assert "\n" not in str(info.value)
    monkeypatch.undo()
    monkeypatch.delattr(torch.nested, "nested_tensor_from_jagged", raising=False)
    with pytest.raises(RuntimeError, match=r"needs torch >= 2\.3") as info:
        varlen_layout(ids, kernel="nested")
    assert varlen_layout(ids).kernel == "grouped"  # the CPU default needs no nested tensors


@requires_torch_compile
@pytest.mark.slow
def test_varlen_under_torch_compile_aot_eager():
    """torch.compile(backend="aot_eager") runs the varlen model (graph breaks at the layout) with the same
    outputs and gradients as eager."""
    _, packed, _, batch, _ = run_both(CONFIGS["L2-H2-d32-V97"], "varlen", lengths=VARLEN_PACKS[:4])
    eager = packed(**batch)
    eager.loss.backward()
    grads = {n: p.grad.clone() for n, p in packed.named_parameters()}
    packed.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(packed, backend="aot_eager")(**batch)
    compiled.loss.backward()
    assert abs(compiled.loss.item() - eager.loss.item()) <= 1e-6
    assert (compiled.mlm_logits - eager.mlm_logits).abs().max().item() <= LOGIT_ATOL
    for n, p in packed.named_parameters():
        assert (p.grad - grads[n]).abs().max().item() <= GRAD_ATOL, n


def test_flop_model_counts_only_within_sequence_pairs():
    """The bench's FLOP model, by hand: per-row linear + L * 4H * (S^2 or sum l_i^2) + heads, per sequence."""
    from ipu_packing.bench import throughput as bench
    from ipu_packing.bench.throughput import flops_per_sequence

    lengths = np.array([10, 6, 12, 3])
    sequences = bench.make_sequences(lengths, 100, seed=0)
    packed = bench.build_layout("packed", sequences, [[0, 1], [2, 3]], 16, 3, 5)
    model = dict(hidden_size=8, intermediate_size=32, num_hidden_layers=2, vocab_size=100)
    H, FF, L, V, S, M = 8, 32, 2, 100, 16, 5
    linear = 2 * L * S * 2 * (4 * H * H + 2 * H * FF)
    heads = 2 * M * 2 * (H * H + H * V)
    dense = (linear + L * 4 * H * 2 * S * S + heads) / 4
    varlen = (linear + L * 4 * H * (100 + 36 + 144 + 9) + heads) / 4
    assert flops_per_sequence(packed, model, "dense") == pytest.approx(dense, rel=1e-12)
    assert flops_per_sequence(packed, model, "varlen") == pytest.approx(varlen, rel=1e-12)


def test_bench_times_every_attention_given_and_reports_the_comparison(tmp_path):
    """``python -m ipu_packing.bench --attention dense,varlen --json`` times both layouts with each attention:
    every pair's sequences/s and its ratio to padded dense's, beside the FLOP model's ratio; the top-level
    figures are the first attention's."""
    from app_fixtures import captured
    from ipu_packing.bench.cli import main as bench_main
    from packing_fixtures import synthetic_histogram

    hist_file = tmp_path / "hist.json"
    hist_file.write_text(json.dumps({"name": "synthetic", "histogram": synthetic_histogram().tolist()}))
    threads = torch.get_num_threads()
    try:
        code, out, err = captured(bench_main, [
            "--histogram", str(hist_file), "--max-seq-length", "64", "--timed-packs", "8", "--micro-batch-size", "4",
            "--repeats", "1", "--threads", "1", "--json", "--plot", "", "--attention", "dense,varlen"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0, err
    result = json.loads(out)
    assert result["attention"] == "dense"
    pairs = {(a["attention"], a["layout"]): a for a in result["attentions"]}
    assert list(pairs) == [("dense", "padded"), ("dense", "packed"), ("varlen", "padded"), ("varlen", "packed")]
    first = pairs["dense", "padded"]
    assert (first["ratio"], first["flop_model_ratio"]) == (1.0, 1.0)
    assert result["padded_sequences_per_second"] == first["sequences_per_second"]
    assert result["packed_sequences_per_second"] == pairs["dense", "packed"]["sequences_per_second"]
    for a in pairs.values():
        assert a["ratio"] == pytest.approx(a["sequences_per_second"] / first["sequences_per_second"])
        assert a["flop_model_ratio"] == pytest.approx(first["flops_per_sequence"] / a["flops_per_sequence"])
    flops = {"%s+%s" % (layout, attention): a["flops_per_sequence"] for (attention, layout), a in pairs.items()}
    # the model's predictions: varlen never costs more FLOPs, packing beats padding
    assert flops["packed+varlen"] < flops["packed+dense"] < flops["padded+dense"]
    assert flops["padded+varlen"] < flops["padded+dense"]
