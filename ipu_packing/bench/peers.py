"""Peers: the packed model against Hugging Face transformers' ``BertForPreTraining``, on the same sequences.

    python -m ipu_packing.bench --peers --histogram ../shared/data/wikipedia_512_histogram.json \\
        --max-seq-length 512 --model small --timed-packs 32 --repeats 2 [--device cuda] [--precision bf16] [--json]

The sequences are the synthetic bench's (throughput.py): `--timed-packs` packs of the plan of the histogram,
sampled systematically, their sequences made as the data recipe masks them and laid out padded (one per row,
K = 1) and packed. Every contender trains on exactly these sequences, with their MLM and NSP labels:

- ``transformers padded``: ``transformers.BertForPreTraining`` (``attn_implementation="sdpa"`` where the
  installed transformers has it for BERT, else its default), `--micro-batch-size` sequences per step, every row
  padded to S. Its inputs are built from the padded layout's records (``data.reference.unpack``): input ids,
  token types, an attention mask over the real tokens, ``labels`` holding each masked token's original id at
  its position (-100 elsewhere) and ``next_sentence_label``.
- ``transformers grouped``: the same model and batch size, the sequences ordered as the Trainer's
  ``group_by_length`` orders them (``length_grouped_order``: a seeded permutation cut into mega-batches of 50
  micro batches, each sorted longest first, the longest batch first) and each batch padded to its longest.
- ``ours padded <attention>`` and ``ours packed <attention>``: ``PackedBertForPreTraining`` holding the
  transformers model's initial weights (``model.pretrained.load_hf_state_dict``), one model per attention
  implementation (dense, sdpa, varlen; one this torch cannot run is left out, and the result says why),
  stepping through the training runner (``make_runner(...).train_step``) on `--micro-batch-size` rows per step:
  padded sequences, or packs.

Every contender: full training steps (zero_grad, forward, backward, AdamW update with the same ``ADAMW``
settings and weight-decay groups), bf16 autocast with `--precision bf16`, on `--device`. Every batch of every
contender is one timed call (the last batch may be short), and the calls of all contenders are interleaved in
proportion in one process, so every contender sees the same machine load (``--order passes``: each contender's
pass back to back instead, the order rotated each repeat; harness.py times every bench); that is repeated
`--repeats` times and each contender's seconds are the median over repeats. On CUDA each
call ends with ``torch.cuda.synchronize()`` (the optimizer's kernels are counted in the call that launched
them) and each contender's peak memory is measured: ``torch.cuda.max_memory_allocated`` during its steps less
what was allocated before them (every model stays resident; gradients are freed after each call), plus its own
weights and AdamW state: what it would peak at alone.

Reported: sequences/s per contender, its ratio to ``transformers padded``, real and computed (padding
included) tokens, and ``os.getloadavg()`` before and after. Speed is reported, never asserted.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import jsonout
from . import harness
from .inputs import BenchError
from .peer_batches import (Contents, grouped_batches, hf_contents, layout_batches, layout_contents, layout_instances,
                           padded_batches)
from .presets import MODEL_PRESETS
from .report import PeersResult, format_peers
from .throughput import Layout, plan_histogram, timed_layouts

ATTENTIONS = ("dense", "sdpa", "varlen")
"""Our attention implementations every peers run times (model/attention.py); flex needs CUDA and is left out."""

ADAMW = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
"""Every contender's optimizer: torch.optim.AdamW with these settings, weight decay on matrices only
(train/optim.py's parameter_groups, as the HF Trainer leaves biases and LayerNorm weights undecayed)."""

BASELINE = "transformers padded"


# -- contenders -----------------------------------------------------------------------------------------------


@dataclass
class Contender(harness.Contender):
    """One row of the table: the harness's contender (its batches are host tensors, its call one full training
    step: zero_grad, forward, backward, AdamW update; ``after`` frees the gradients, so the next contender's
    memory is its own), and what the table says of it."""

    library: str = ""
    """"transformers" or "ours"."""
    layout: str = ""
    """"padded", "grouped" or "packed"."""
    attention: str = ""
    contents: Optional[Contents] = None
    resident_bytes: Callable[[], int] = lambda: 0
    """Its model's weights and optimizer state, in bytes (shared with the contenders of the same model)."""

    def __post_init__(self) -> None:  # the harness's counts of one pass, from what its batches hold
        self.sequences, self.computed_tokens = self.contents.sequences, self.contents.computed_tokens


def adamw_groups(model):
    """train/optim.py's parameter_groups at ``ADAMW``'s weight decay (matrices only), as AdamW takes them."""
    from ipu_packing.train.optim import parameter_groups

    groups = parameter_groups(model, ADAMW["weight_decay"])
    for g in groups:
        g.pop("max_weight_norm", None)
    return groups


def adamw(model, torch):
    """torch.optim.AdamW with ``ADAMW``'s settings, weight decay on matrices only."""
    return torch.optim.AdamW(adamw_groups(model), lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])


def with_sdpa(build) -> Tuple[Any, str]:
    """(transformers model, its attention implementation): ``build(attn_implementation="sdpa")`` where this
    transformers has sdpa for BERT, else ``build()`` (its default, eager)."""
    try:
        model = build(attn_implementation="sdpa")
    except (TypeError, ValueError, ImportError):  # a transformers whose BERT has no sdpa path
        model = build()
    return model, str(getattr(model.config, "_attn_implementation", None) or "eager")


def state_bytes(model, optimizer) -> int:
    """Bytes of a model's parameters and buffers and of its optimizer's state tensors."""
    import torch

    seen, total = set(), 0
    tensors = list(model.parameters()) + list(model.buffers())
    for state in optimizer.state.values():
        tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def autocast(device, precision: str, torch):
    import contextlib

    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def to_tensors(batches: Sequence[Dict[str, np.ndarray]], torch) -> List[Dict[str, Any]]:
    return [{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in b.items()} for b in batches]


def build_contenders(padded: Layout, packed: Layout, model_kwargs: Dict[str, Any], micro_batch_size: int,
                     device: str, precision: str, seed: int, attentions: Sequence[str] = ATTENTIONS):
    """(contenders, models, skipped, transformers attention): the transformers rows, then ours per attention.

    ``models`` is [(model, initial weights)] for restoring after the warm-up; ``skipped`` says which attention
    this torch cannot run, and why. The transformers inputs are unpacked from the padded layout's records;
    every contender's contents are checked equal to the padded layout's (AssertionError otherwise)."""
    import torch
    import transformers

    from ipu_packing.execution import ExecutionConfig, make_runner
    from ipu_packing.model import PackedBertForPreTraining
    from ipu_packing.model.attention import missing_torch_support
    from ipu_packing.model.pretrained import load_hf_state_dict

    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    S = int(padded.arrays["input_ids"].shape[1])
    config = transformers.BertConfig(**model_kwargs)
    torch.manual_seed(seed)
    cls = transformers.BertForPreTraining
    hf, hf_attention = with_sdpa(lambda **kw: cls._from_config(config, **kw) if kw else cls(config))
    hf.to(dev).train()
    hf_optimizer = adamw(hf, torch)
    initial_state = {k: v.detach().cpu().clone() for k, v in hf.state_dict().items()}

    def hf_step(batch):
        hf_optimizer.zero_grad(set_to_none=True)
        inputs = {k: v.to(dev) for k, v in batch.items()}
        with autocast(dev, precision, torch):
            out = hf(**inputs)
        out.loss.float().backward()
        hf_optimizer.step()

    def hf_after():
        hf_optimizer.zero_grad(set_to_none=True)

    reference = layout_contents(layout_batches(padded, micro_batch_size))
    instances = layout_instances(padded)
    contenders = []
    for layout_name, batches in (("padded", padded_batches(instances, micro_batch_size, S)),
                                 ("grouped", grouped_batches(instances, micro_batch_size, seed))):
        contenders.append(Contender("transformers " + layout_name, to_tensors(batches, torch), hf_step, hf_after,
                                    library="transformers", layout=layout_name, attention=hf_attention,
                                    contents=hf_contents(batches),
                                    resident_bytes=lambda: state_bytes(hf, hf_optimizer)))
    models = [(hf, initial_state)]  # host copies (the live tensors change), off the GPU's memory
    skipped = []
    execution = ExecutionConfig(backend="torch", device=device, micro_batch_size=micro_batch_size,
                                precision=precision)
    runners = {}  # attention -> (model, optimizer, runner): one model per attention, both layouts step it
    for attention in attentions:
        missing = missing_torch_support(attention)
        if missing:
            skipped.append("ours %s: %s" % (attention, missing))
            continue
        model = PackedBertForPreTraining(config, attention=attention)
        loaded, missing_keys, unexpected = load_hf_state_dict(model, initial_state, "transformers' BertForPreTraining")
        if missing_keys or unexpected:
            raise AssertionError("our model and transformers' differ: missing %s, unexpected %s"
                                 % (missing_keys, unexpected))
        model.to(dev).train()
        optimizer = adamw(model, torch)
        runners[attention] = (model, optimizer, make_runner(model, optimizer, execution))
        models.append((model, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}))
    for layout in (padded, packed):
        batches = layout_batches(layout, micro_batch_size)
        for attention, (model, optimizer, runner) in runners.items():
            contenders.append(Contender(
                "ours %s %s" % (layout.name, attention), to_tensors(batches, torch), runner.train_step,
                (lambda o=optimizer: o.zero_grad(set_to_none=True)), library="ours", layout=layout.name,
                attention=attention, contents=layout_contents(batches),
                resident_bytes=(lambda m=model, o=optimizer: state_bytes(m, o))))
    for c in contenders:
        if not c.contents.same_sequences(reference):
            raise AssertionError("%s does not hold the padded layout's sequences" % c.name)
    return contenders, models, skipped, hf_attention


def run_peers(histogram: np.ndarray, S: int, K: int, model_preset: str = "tiny", micro_batch_size: int = 8,
              repeats: int = 3, algorithm: Optional[str] = None, seed: int = 0, timed_packs: Optional[int] = 128,
              device: str = "cpu", precision: str = "fp32", attentions: Sequence[str] = ATTENTIONS,
              keep_going: bool = False, order: str = "calls", log=lambda message: None) -> PeersResult:
    """The module docstring's bench. ``keep_going`` (gpu_check's, for a short GPU session): a contender whose
    warm-up step raises is left out and named in ``failed`` with its error, and the others are timed; without
    it the error propagates (a failing contender is a bug, with its traceback)."""
    import torch
    import transformers

    started = time.perf_counter()
    model_kwargs = dict(MODEL_PRESETS[model_preset])
    model_kwargs.update(max_position_embeddings=max(512, S), attention_probs_dropout_prob=0.0)
    plan = plan_histogram(histogram, S, K, algorithm)
    padded, packed = timed_layouts(plan, S, K, timed_packs, model_kwargs["vocab_size"], seed)
    if packed.rows < micro_batch_size:
        raise BenchError("--micro-batch-size %d is more than the %d timed packs" % (micro_batch_size, packed.rows))
    log("plan: %d sequences -> %d packs (K=%d, %s); timing %d packs = %d sequences (%d real tokens) at S=%d, "
        "model %s, %s on %s" % (plan.num_sequences, plan.num_packs, K, plan.algorithm, packed.rows,
                                padded.sequences, padded.tokens, S, model_preset, precision, device))
    contenders, models, skipped, hf_attention = build_contenders(padded, packed, model_kwargs, micro_batch_size,
                                                                  device, precision, seed, attentions)
    for note in skipped:
        log("skipped " + note)
    cuda = device == "cuda"

    def reset():  # after the warm-up (the grouped contender's longest batch first): every model's initial weights
        for model, initial in models:
            model.load_state_dict(initial)

    timings = harness.measure(contenders, repeats, order, reset, keep_going, torch, cuda, log)
    rows = harness.rows(timings, {"ratio": BASELINE})
    for row, c in zip(rows, timings.contenders):  # on CUDA, what it would peak at alone: its weights and state too
        resident = c.resident_bytes() if cuda else None
        row.update(library=c.library, layout=c.layout, attention=c.attention, tokens=c.contents.tokens,
                   resident_bytes=resident, peak_memory_bytes=None if resident is None else
                   resident + row["step_memory_bytes"])
    return PeersResult(
        rows=rows, skipped=skipped, failed=timings.failed, load_before=timings.load_before,
        load_after=timings.load_after, device=device, order=order,
        device_name=torch.cuda.get_device_name() if cuda else "cpu", precision=precision,
        torch_threads=torch.get_num_threads(), torch_version=torch.__version__,
        transformers_version=transformers.__version__, transformers_attention=hf_attention,
        model=dict(model_kwargs, preset=model_preset), optimizer=dict(ADAMW, name="AdamW"),
        micro_batch_size=micro_batch_size, repeats=repeats, seed=seed, max_seq_length=S, max_sequences_per_pack=K,
        packing_algorithm=plan.algorithm, plan_sequences=int(plan.num_sequences), plan_packs=int(plan.num_packs),
        timed_packs=packed.rows, num_sequences=padded.sequences, num_tokens=padded.tokens,
        seconds=time.perf_counter() - started)


def main_peers(args, histogram: np.ndarray) -> int:
    """``--peers``: the command line's checked arguments and length histogram -> table or JSON on stdout."""
    log = harness.progress(args.json)
    result = run_peers(histogram, len(histogram), args.max_sequences_per_pack, model_preset=args.model,
                       micro_batch_size=args.micro_batch_size, repeats=args.repeats, algorithm=args.algorithm,
                       seed=args.seed, timed_packs=args.timed_packs or None, device=args.device,
                       precision=args.precision, order=args.order, log=log)
    print(jsonout.dumps(asdict(result), sort_keys=True) if args.json else format_peers(result))
    return 0
