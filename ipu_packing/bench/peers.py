"""``bench --peers``: the packed model against transformers' ``BertForPreTraining``, full AdamW training steps
on the same sequences (the synthetic mode's timed packs, their MLM and NSP labels), through harness.py.
docs/app.md, "Against Hugging Face transformers", says what each contender is and what is reported.

    python -m ipu_packing.bench --peers --histogram ../shared/data/wikipedia_512_histogram.json \\
        --max-seq-length 512 --model small --timed-packs 32 --repeats 2 [--device cuda] [--precision bf16] [--json]

On CUDA each contender's peak memory is what it would peak at alone: ``torch.cuda.max_memory_allocated``
during its steps less what was allocated before them (every model stays resident; gradients are freed after
each call), plus its own weights and AdamW state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import jsonout
from ..data.format import IGNORE_INDEX
from ..data.reference import Instance, unpack
from . import harness
from .harness import ORDERS, load_line, table
from .inputs import MODEL_PRESETS, BenchError
from .throughput import Layout, plan_histogram, timed_layouts

ATTENTIONS = ("dense", "sdpa", "varlen")
"""Our attention implementations every peers run times (model/attention.py); flex needs CUDA and is left out."""

ADAMW = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
"""Every contender's optimizer: torch.optim.AdamW with these settings, weight decay on matrices only
(train/optim.py's parameter_groups, as the HF Trainer leaves biases and LayerNorm weights undecayed)."""

BASELINE = "transformers padded"


# -- batches: transformers' inputs built from our records, our layouts' micro batches, what each holds -----------

MEGA_BATCH_MULT = 50
"""Micro batches per mega-batch of the Trainer's length grouping (at most; fewer for few sequences)."""


def layout_instances(layout: Layout) -> List[Instance]:
    """Every sequence of a layout, row by row and in slot order (``unpack`` of each record)."""
    arrays = layout.arrays
    return [s for p in range(layout.rows) for s in unpack({k: v[p] for k, v in arrays.items()})]


def hf_batch(rows: Sequence[Dict[str, Any]], length: Optional[int] = None) -> Dict[str, np.ndarray]:
    """transformers' inputs of ``rows`` (each one sequence's fields: a list as long as its input_ids, or one
    number), padded to ``length`` (None: the longest row): each list field (B, L), padded with 0 (``labels``:
    -100), attention_mask (B, L) over the real tokens, each number field (B,)."""
    L = length or max(len(r["input_ids"]) for r in rows)
    out = {"attention_mask": np.zeros((len(rows), L), dtype=np.int64)}  # (B, L)
    for name, value in rows[0].items():
        out[name] = (np.full((len(rows), L), IGNORE_INDEX if name == "labels" else 0, dtype=np.int64) if np.ndim(value)
                     else np.zeros(len(rows), dtype=np.int64))  # (B, L) or (B,)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        if n > L:
            raise ValueError("a sequence of %d tokens does not fit a row of %d" % (n, L))
        out["attention_mask"][i, :n] = 1
        for name, value in row.items():
            if np.ndim(value):
                out[name][i, :n] = value
            else:
                out[name][i] = value
    return out


def hf_batches(rows: Sequence[Dict[str, Any]], order: Sequence[int], batch_size: int,
               length: Optional[int] = None) -> List[Dict[str, np.ndarray]]:
    """``order`` cut into batches of ``batch_size`` rows, each padded to ``length`` (None: its longest row)."""
    return [hf_batch([rows[j] for j in order[i:i + batch_size]], length) for i in range(0, len(order), batch_size)]


def pretraining_row(s: Instance) -> Dict[str, Any]:
    """transformers' BertForPreTraining fields of one sequence: input_ids, token_type_ids, labels (each masked
    token's original id at its position, -100 elsewhere), next_sentence_label."""
    labels = np.full(len(s), IGNORE_INDEX, dtype=np.int64)
    labels[np.asarray(s.mlm_positions, dtype=np.int64)] = s.mlm_labels
    return dict(input_ids=s.input_ids, token_type_ids=s.token_type_ids, labels=labels, next_sentence_label=s.nsp_label)


def length_grouped_order(lengths: Sequence[int], batch_size: int, seed: int) -> List[int]:
    """The order of transformers' ``trainer_pt_utils.get_length_grouped_indices`` (the Trainer's
    ``group_by_length``), with a torch generator seeded by ``seed``: a random permutation cut into mega-batches
    of min(50, n // (4 * batch_size)) (at least 1) micro batches, each sorted by length, longest first, then
    the mega-batch holding the longest sequence swapped to the front (an out-of-memory shows at once).
    A test holds it equal to transformers' own function."""
    import torch

    mult = min(len(lengths) // (batch_size * 4), MEGA_BATCH_MULT) or 1
    generator = torch.Generator()
    generator.manual_seed(seed)
    indices = torch.randperm(len(lengths), generator=generator).tolist()
    size = mult * batch_size
    megabatches = [sorted(indices[i:i + size], key=lambda j: lengths[j], reverse=True)
                   for i in range(0, len(lengths), size)]
    if megabatches:
        longest = int(np.argmax([lengths[m[0]] for m in megabatches]))
        megabatches[0][0], megabatches[longest][0] = megabatches[longest][0], megabatches[0][0]
    return [i for m in megabatches for i in m]


def padded_batches(instances: Sequence[Instance], batch_size: int, S: int) -> List[Dict[str, np.ndarray]]:
    """``transformers padded``: consecutive batches of ``batch_size`` sequences, every row padded to S."""
    return hf_batches([pretraining_row(s) for s in instances], range(len(instances)), batch_size, S)


def grouped_batches(instances: Sequence[Instance], batch_size: int, seed: int) -> List[Dict[str, np.ndarray]]:
    """``transformers grouped``: ``length_grouped_order`` cut into batches of ``batch_size``, each padded to its
    own longest sequence (what the Trainer's padding collator does)."""
    order = length_grouped_order([len(s) for s in instances], batch_size, seed)
    return hf_batches([pretraining_row(s) for s in instances], order, batch_size)


def layout_batches(layout: Layout, batch_size: int) -> List[Dict[str, np.ndarray]]:
    """Our contenders' steps: consecutive ``batch_size`` rows of a layout (the last batch may be short)."""
    return [{k: v[i:i + batch_size] for k, v in layout.arrays.items()} for i in range(0, layout.rows, batch_size)]


@dataclass
class Contents:
    """What a contender's batches hold, to hold every contender to the same sequences."""

    sequences: int
    tokens: int
    """Real tokens."""
    computed_tokens: int
    """Rows x row length over every batch: the positions the model computes, padding included."""
    lengths: List[int]
    """Every sequence's length, sorted."""
    mlm_labels: List[int]
    """Every masked token's original id, sorted (a multiset)."""
    nsp_labels: List[int]
    """Every sequence's NSP label, sorted."""

    def same_sequences(self, other: "Contents") -> bool:
        """The same sequences, tokens and labels (padding aside)."""
        return ((self.sequences, self.tokens, self.lengths, self.mlm_labels, self.nsp_labels)
                == (other.sequences, other.tokens, other.lengths, other.mlm_labels, other.nsp_labels))


def hf_contents(batches: Sequence[Dict[str, np.ndarray]]) -> Contents:
    lengths, mlm, nsp, computed = [], [], [], 0
    for b in batches:
        lengths.extend(b["attention_mask"].sum(axis=1).tolist())
        mlm.extend(b["labels"][b["labels"] != IGNORE_INDEX].tolist())
        nsp.extend(b["next_sentence_label"].tolist())
        computed += int(b["input_ids"].size)
    return Contents(len(lengths), int(sum(lengths)), computed, sorted(lengths), sorted(mlm), sorted(nsp))


def layout_contents(batches: Sequence[Dict[str, np.ndarray]]) -> Contents:
    lengths, mlm, nsp, computed = [], [], [], 0
    for b in batches:
        for row in b["sequence_ids"]:
            counts = np.bincount(row[row > 0])
            lengths.extend(int(n) for n in counts[1:] if n > 0)
        mlm.extend(b["mlm_labels"][b["mlm_labels"] != IGNORE_INDEX].tolist())
        nsp.extend(b["nsp_labels"][b["nsp_labels"] != IGNORE_INDEX].tolist())
        computed += int(b["input_ids"].size)
    return Contents(len(lengths), int(sum(lengths)), computed, sorted(lengths), sorted(mlm), sorted(nsp))


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

    ``models`` is [(model, optimizer)], transformers' first; ``skipped`` says which attention
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
    models = [(hf, hf_optimizer)]
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
        _, missing_keys, unexpected = load_hf_state_dict(model, hf.state_dict(), "transformers' BertForPreTraining")
        if missing_keys or unexpected:
            raise AssertionError("our model and transformers' differ: missing %s, unexpected %s"
                                 % (missing_keys, unexpected))
        model.to(dev).train()
        optimizer = adamw(model, torch)
        runners[attention] = (model, optimizer, make_runner(model, optimizer, execution))
        models.append((model, optimizer))
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
              keep_going: bool = False, order: str = "calls", log=lambda message: None) -> Dict[str, Any]:
    """The bench: a dict (JSON-ready) of the conditions and ``rows``, each contender's harness row (harness.rows)
    with its library, layout, attention, real tokens and on CUDA ``resident_bytes`` (its weights and AdamW
    state) and ``peak_memory_bytes`` (resident + step: what it would peak at alone); ``skipped`` (an attention
    this torch cannot run, and why) and ``failed``. ``keep_going`` (gpu_check's, for a short GPU session): a
    contender whose warm-up step raises is left out and named in ``failed`` with its error, and the others are
    timed; without it the error propagates (a failing contender is a bug, with its traceback)."""
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
    # after the warm-up (the grouped contender's longest batch first): the initial weights. The AdamW state stays
    # allocated, so that no timed call allocates it: on CUDA it is counted once, in resident_bytes.
    reset = harness.restorer([model for model, _ in models])
    for note in skipped:
        log("skipped " + note)
    cuda = device == "cuda"
    timings = harness.measure(contenders, repeats, order, reset, keep_going, torch, cuda, log)
    rows = harness.rows(timings, {"ratio": BASELINE})
    for row, c in zip(rows, timings.contenders):  # on CUDA, what it would peak at alone: its weights and state too
        resident = c.resident_bytes() if cuda else None
        row.update(library=c.library, layout=c.layout, attention=c.attention, tokens=c.contents.tokens,
                   resident_bytes=resident, peak_memory_bytes=None if resident is None else
                   resident + row["step_memory_bytes"])
    return dict(
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
    print(jsonout.dumps(result, sort_keys=True) if args.json else format_peers(result))
    return 0


def format_peers(r: Dict[str, Any]) -> str:
    memory = any(row["peak_memory_bytes"] is not None for row in r["rows"])
    lines = [
        "model %(preset)s (hidden %(hidden_size)d, %(num_hidden_layers)d layers, vocab %(vocab_size)d), " % r["model"]
        + "S=%(max_seq_length)d, micro batch %(micro_batch_size)d (sequences, or packs for ours packed), %(precision)s "
        "on %(device)s (%(device_name)s), %(torch_threads)d torch threads, %(repeats)d repeats (medians; %(words)s), "
        "AdamW lr %(lr)g wd %(weight_decay)g" % dict(r, words=ORDERS[r["order"]], **r["optimizer"]),
        "timed: %(timed_packs)d packs of the plan (K=%(max_sequences_per_pack)d, %(packing_algorithm)s) = "
        "%(num_sequences)d sequences, %(num_tokens)d real tokens; torch %(torch_version)s, transformers "
        "%(transformers_version)s (attention %(transformers_attention)s)" % r,
        load_line(r["load_before"], r["load_after"]),
    ] + table(r["rows"], [("contender", 26, lambda row: row["name"]), ("steps", 6, lambda row: "%d" % row["calls"]),
                          ("seq/s", 10, lambda row: "%.2f" % row["sequences_per_second"]),
                          ("vs HF pad", 10, lambda row: "%.2fx" % row["ratio"]),
                          ("computed tok", 12, lambda row: "%d" % row["computed_tokens"])]
              + ([("peak memory", 12, lambda row: "%.0f MiB" % (row["peak_memory_bytes"] / 2.0 ** 20))]
                 if memory else []))
    lines += ["skipped %s" % note for note in r["skipped"]] + ["FAILED %s" % note for note in r["failed"]]
    return "\n".join(lines)
