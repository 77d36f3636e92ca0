"""Sequence classification, ours against transformers, on the same texts: inference, or fine-tuning steps.

    python -m ipu_packing.bench --classifier DIR [--input FILE] [--inputs 1024] [--max-seq-length 128] \\
        [--max-sequences-per-pack 32] [--micro-batch-size 32] [--repeats 3] [--model PRESET] [--train | --table]
        [--json]

``--table`` runs serving, then fine-tuning steps, one after the other in one command (a list of both results with
``--json``): the peer table of docs/results.md.

``DIR`` is a transformers BERT directory with its tokenizer: a classifier (this project's fine-tuning export,
e.g. output/runs/finetune_demo/final) or a pretraining export (output/runs/demo/final: the classification head
is then initialised at random, seeded). With ``--model PRESET`` the architecture is the preset's (vocabulary:
DIR's tokenizer) and every weight random, seeded. Both sides start from the same weights: transformers'
``BertForSequenceClassification`` is built, saved with the tokenizer to a temporary directory, and ours is
``Predictor.from_pretrained`` of that directory (its attention: the fastest exact one for S on the device).

The texts: ``--input`` (read as ``predict --input`` reads it), else the embedded demo task's (every split, in
its shuffled order: short sentences, a GLUE-like length distribution); the first ``--inputs`` of them. Each is
tokenized once, as ``BertTokenizerFast(text, truncation=True, max_length=S)``.

Inference contenders (eval mode, no gradients, fp32; ``--micro-batch-size`` B rows a call):

- ``transformers padded``: ``BertForSequenceClassification`` on B inputs a call, in input order, each row padded
  to S (attention mask over the real tokens): run_glue.py's default (``pad_to_max_length``, max_seq_length 128);
- ``transformers dynamic``: B inputs a call in input order, each batch padded to its longest (run_glue.py's
  ``--pad_to_max_length False``: the data collator's dynamic padding);
- ``transformers grouped``: the inputs sorted by length, longest first, B a call, each batch padded to its
  longest (the best a padded model can do on a known set of inputs);
- ``ours padded`` and ``ours packed``: the predictor's own packs of the inputs (``Predictor.packs``: K=1, and K
  up to ``--max-sequences-per-pack``), as many packs a call as the predictor takes by default on CPU
  (predict.packs_per_call, from the model's sizes), each call ``train/evaluate.collect``
  (the predictor's path: forward, then each used slot's logits by example id);
- end to end, texts in and scores out, all the inputs in one call: ``transformers pipeline``
  (``pipeline("text-classification", top_k=None, batch_size=B)``: it pads each batch to its longest) and
  ``ours predict`` (``Predictor.predict``: tokenize, pack, forward, unpack, scores).

``--train``: fine-tuning steps instead (train mode, AdamW with peers.py's ``ADAMW`` settings: transformers' as its
Trainer builds it at this torch, ours as the training app does, both fused from torch 2.8; the same initial
weights restored before the timed passes), every step of B sequences: ``transformers padded``, ``transformers
dynamic`` and ``transformers grouped`` (the Trainer's ``group_by_length`` order, peer_batches.length_grouped_order;
each batch padded to its longest), and ``ours padded`` and ``ours packed`` (the predictor's packs with each
example's label, stepped by ``make_runner``'s ``train_step`` with the training app's batch accounting off the IPU
for a global batch of B sequences: one micro batch of B rows padded, of round(B / packing factor) packs packed,
TrainingConfig.packs_per_step). The labels:
the demo task's (its label names in sorted order, modulo the model's labels), or seeded random ones for
``--input``. ``--input`` may hold pairs (sentence1 and sentence2), tokenized as pairs by both sides.

Every contender's calls are timed by harness.py in one process, ``--repeats`` times, interleaved in proportion
(``--order passes``: each contender's pass back to back, the order rotated each repeat); its seconds are the
median over repeats. Reported: sequences/s per contender and its ratio to ``transformers
padded``, sequences per row (the packing factor of ours packed), computed tokens (rows x row length), the
largest logit difference of ours packed from transformers
padded (inference), and ``os.getloadavg()`` before and after. Speed is reported, never asserted.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .harness import ORDERS, Contender, measure
from .inputs import BenchError

BASELINE = "transformers padded"


@dataclass
class Entry(Contender):
    """One contender: the harness's, and the sequences and computed tokens (rows x row length) of its pass."""

    sequences: int = 0
    computed_tokens: int = 0


def demo_texts() -> Tuple[List[str], List[str]]:
    """(texts, label names) of the embedded demo task, every split in order."""
    from ipu_packing.data.finetune.demo import demo_rows

    rows = [row for split in demo_rows().values() for row in split]
    return [text for text, _ in rows], [label for _, label in rows]


def build_models(directory: str, preset: Optional[str], S: int, seed: int, work: str):
    """(transformers model, tokenizer, saved directory): the transformers classifier of ``directory`` (or of the
    preset's architecture, random), saved with ``directory``'s tokenizer to ``work``."""
    import torch
    import transformers

    from .presets import MODEL_PRESETS

    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise BenchError("--classifier %s is not a transformers model directory (no config.json)" % (directory,))
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        raise BenchError("--classifier %s holds no tokenizer (%s)" % (directory, str(exc).splitlines()[0]))
    torch.manual_seed(seed)
    if preset:
        kwargs = dict(MODEL_PRESETS[preset])
        kwargs.update(vocab_size=len(tokenizer), max_position_embeddings=max(512, S))
        model = transformers.BertForSequenceClassification(transformers.BertConfig(**kwargs))
    else:
        try:
            model = transformers.BertForSequenceClassification.from_pretrained(directory)
        except (OSError, ValueError) as exc:
            raise BenchError("--classifier %s is not a BERT model (%s)" % (directory, str(exc).splitlines()[0]))
    if S > int(model.config.max_position_embeddings):
        raise BenchError("--max-seq-length %d exceeds the model's max_position_embeddings %d"
                         % (S, model.config.max_position_embeddings))
    model.save_pretrained(work)
    tokenizer.save_pretrained(work)
    return model, tokenizer, work


def hf_model(work: str, torch):
    """transformers' classifier of ``work``, with sdpa attention where this transformers has it for BERT."""
    import transformers

    cls = transformers.BertForSequenceClassification
    try:
        model = cls.from_pretrained(work, attn_implementation="sdpa")
    except (TypeError, ValueError, ImportError):
        model = cls.from_pretrained(work)
    return model, str(getattr(model.config, "_attn_implementation", None) or "eager")


def hf_batches(encoded: Sequence[Sequence[int]], order: Sequence[int], B: int, S: Optional[int], labels=None,
               token_types: Optional[Sequence[Sequence[int]]] = None):
    """transformers' inputs: ``order`` cut into batches of B, each row padded to S (None: the batch's longest);
    ``token_types``: each input's token type ids (pairs; None: all 0). Returns (batches of int64 tensors, computed
    tokens)."""
    import torch

    batches, computed = [], 0
    for start in range(0, len(order), B):
        chunk = list(order[start:start + B])
        L = S or max(len(encoded[i]) for i in chunk)
        ids = np.zeros((len(chunk), L), np.int64)
        mask = np.zeros((len(chunk), L), np.int64)
        types = np.zeros((len(chunk), L), np.int64)
        for r, i in enumerate(chunk):
            e = encoded[i]
            ids[r, :len(e)] = e
            mask[r, :len(e)] = 1
            if token_types is not None:
                types[r, :len(e)] = token_types[i]
        batch = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
                 "token_type_ids": torch.from_numpy(types)}
        if labels is not None:
            batch["labels"] = torch.as_tensor([int(labels[i]) for i in order[start:start + B]], dtype=torch.long)
        batches.append(batch)
        computed += len(chunk) * L
    return batches, computed


def pack_batches(packs, B: int, labels=None):
    """The predictor's packs cut into calls of B packs (predict.Packs each); with ``labels``, each used slot's label
    set from its example id. Returns (batches, computed tokens)."""
    from ipu_packing.predict import Packs

    arrays = dict(packs.arrays)
    if labels is not None:
        ids = arrays["example_ids"].astype(np.int64)
        filled = np.full(ids.shape, -100, np.int64)
        filled[ids >= 0] = np.asarray(labels, np.int64)[ids[ids >= 0]]
        arrays["labels"] = filled.astype(arrays["labels"].dtype)
    P, S = arrays["input_ids"].shape
    return [Packs({k: v[s:s + B] for k, v in arrays.items()}) for s in range(0, P, B)], P * S


def optimizers(hf, ours, transformers, torch) -> Tuple[Any, Any]:
    """(transformers', ours) AdamW with peers.py's ``ADAMW`` settings and weight-decay groups: transformers' as
    its Trainer builds it at this torch (``TrainingArguments``' default ``optim``: fused from torch 2.8), ours
    as the training app builds it (train/optim.py ``adamw``: fused where torch has the kernel)."""
    from ipu_packing.train.optim import adamw, parameter_groups

    from .peers import ADAMW

    def groups(model):
        out = parameter_groups(model, ADAMW["weight_decay"])
        for g in out:
            g.pop("max_weight_norm", None)
        return out

    settings = dict(lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])
    trainer_fused = getattr(transformers.TrainingArguments, "default_optim", "adamw_torch") == "adamw_torch_fused"
    theirs = torch.optim.AdamW(groups(hf), fused=True, **settings) if trainer_fused else torch.optim.AdamW(
        groups(hf), **settings)
    return theirs, adamw(groups(ours), **settings)


def fused(optimizer) -> bool:
    """Whether ``optimizer`` steps with torch's fused kernel."""
    return bool(optimizer.defaults.get("fused"))


def run_classifier_peers(directory: str, texts: Optional[Sequence[str]] = None, inputs: int = 1024, S: int = 128,
                         K: int = 32, micro_batch_size: int = 32, repeats: int = 3, preset: Optional[str] = None,
                         train: bool = False, seed: int = 0, order: str = "calls",
                         log=lambda message: None) -> Dict[str, Any]:
    """The module docstring's bench; a dict (JSON-ready)."""
    import torch
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # a pretraining export's new head, the pipeline's device notice
    try:
        return _run(transformers, torch, directory, texts, inputs, S, K, micro_batch_size, repeats, preset, train,
                    seed, order, log)
    finally:
        transformers.logging.set_verbosity(verbosity)


def _run(transformers, torch, directory, texts, inputs, S, K, micro_batch_size, repeats, preset, train, seed, order,
         log):
    from ipu_packing.predict import Predictor

    from .peers import ADAMW

    started = time.perf_counter()
    label_names = None
    if texts is None:
        texts, label_names = demo_texts()
    texts = list(texts)[:inputs]
    if not texts:
        raise BenchError("no input texts to time")
    B = micro_batch_size
    with tempfile.TemporaryDirectory() as work:
        _, tokenizer, saved = build_models(directory, preset, S, seed, work)
        hf, hf_attention = hf_model(saved, torch)
        num_labels = int(hf.config.num_labels)
        if label_names is not None:
            names = sorted(set(label_names))
            labels = [names.index(n) % num_labels for n in label_names[:len(texts)]]
        else:
            labels = np.random.default_rng(seed).integers(0, num_labels, len(texts)).tolist()
        padded = Predictor.from_pretrained(saved, S, 1)  # serving: the predictor's own packs a call
        packed = Predictor.from_pretrained(saved, S, K)
        # one model for both of our layouts (as one model serves any K)
        padded.model = packed.model
        ours = packed.model
        pairs = isinstance(texts[0], tuple)
        tokenized = (tokenizer([a for a, _ in texts], [b for _, b in texts], truncation=True, max_length=S) if pairs
                     else tokenizer(texts, truncation=True, max_length=S))
        encoded = [list(e) for e in tokenized["input_ids"]]
        token_types = [list(t) for t in tokenized["token_type_ids"]] if pairs else None
        lengths = [len(e) for e in encoded]
        in_order = list(range(len(texts)))
        padded_packs, packed_packs = padded.packs(texts), packed.packs(texts)
        hf_used = labels if train else None
        our_labels = labels if train else None
        if train:
            from ipu_packing.bench.peer_batches import length_grouped_order

            grouped_order = length_grouped_order(lengths, B, seed)
        else:
            grouped_order = sorted(in_order, key=lambda i: -lengths[i])
        hf_padded, hf_padded_tokens = hf_batches(encoded, in_order, B, S, hf_used, token_types)
        hf_dynamic, hf_dynamic_tokens = hf_batches(encoded, in_order, B, None, hf_used, token_types)
        hf_grouped, hf_grouped_tokens = hf_batches(encoded, grouped_order, B, None, hf_used, token_types)
        n = len(texts)
        factor = n / float(len(packed_packs))
        steps = {"ours padded": padded.batch_packs, "ours packed": packed.batch_packs}  # packs a call
        if train:  # a step of B sequences: the training app's batch accounting of global batch B, off the IPU
            from ipu_packing.train.sections import TrainingConfig

            steps = {"ours padded": B,
                     "ours packed": TrainingConfig(global_batch_sequences=B).packs_per_step(1, factor)}
        ours_padded, ours_padded_tokens = pack_batches(padded_packs, steps["ours padded"], our_labels)
        ours_packed, ours_packed_tokens = pack_batches(packed_packs, steps["ours packed"], our_labels)
        entries: List[Entry] = []

        def entry(name: str, batches, call, computed_tokens: int) -> Entry:
            return Entry(name, batches, call, sequences=n, computed_tokens=computed_tokens)

        restore: List[Tuple[Any, Dict[str, Any]]] = []
        passes: Dict[str, List[int]] = {}
        if train:
            from ipu_packing.execution import ExecutionConfig, make_runner

            hf.train()
            ours.train()
            hf_optimizer, our_optimizer = optimizers(hf, ours, transformers, torch)
            runners: Dict[int, Any] = {}

            def runner_for(packs_a_step: int):
                """The runner of a step of one micro batch of ``packs_a_step`` packs (the last step may be short)."""
                if packs_a_step not in runners:
                    ex = ExecutionConfig(backend="torch", device="cpu", micro_batch_size=packs_a_step,
                                         gradient_accumulation=1)
                    runners[packs_a_step] = make_runner(ours, our_optimizer, ex)
                return runners[packs_a_step]

            for name, packs_a_step in steps.items():
                passes[name] = runner_for(packs_a_step).config.pass_sizes

            def hf_step(batch):
                hf_optimizer.zero_grad(set_to_none=True)
                hf(**batch).loss.backward()
                hf_optimizer.step()

            def our_step(batch):
                runner_for(int(batch["input_ids"].shape[0])).train_step(batch)

            ours_padded, ours_packed = [[{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in p.arrays.items()}
                                         for p in batches] for batches in (ours_padded, ours_packed)]

            entries = [entry("transformers padded", hf_padded, hf_step, hf_padded_tokens),
                       entry("transformers dynamic", hf_dynamic, hf_step, hf_dynamic_tokens),
                       entry("transformers grouped", hf_grouped, hf_step, hf_grouped_tokens),
                       entry("ours padded", ours_padded, our_step, ours_padded_tokens),
                       entry("ours packed", ours_packed, our_step, ours_packed_tokens)]
            restore = [(hf, {k: v.clone() for k, v in hf.state_dict().items()}),
                       (ours, {k: v.clone() for k, v in ours.state_dict().items()})]
        else:
            from ipu_packing.train.evaluate import collect

            hf.eval()
            ours.eval()

            def hf_forward(batch):
                with torch.no_grad():
                    return hf(**batch).logits

            pipe = transformers.pipeline("text-classification", model=hf, tokenizer=tokenizer, top_k=None,
                                         device="cpu", batch_size=B)
            entries = [entry("transformers padded", hf_padded, hf_forward, hf_padded_tokens),
                       entry("transformers dynamic", hf_dynamic, hf_forward, hf_dynamic_tokens),
                       entry("transformers grouped", hf_grouped, hf_forward, hf_grouped_tokens),
                       entry("ours padded", ours_padded, lambda p: collect(ours, p, len(p)), ours_padded_tokens),
                       entry("ours packed", ours_packed, lambda p: collect(ours, p, len(p)), ours_packed_tokens),
                       entry("transformers pipeline", [[{"text": a, "text_pair": b} for a, b in texts] if pairs
                                                        else texts], lambda t: pipe(t), 0),
                       entry("ours predict", [texts], packed.predict, 0)]
        log("%d inputs (%d tokens, mean length %.1f) at S=%d: %d padded rows, %d packs (K<=%d); %s"
            % (n, sum(lengths), float(np.mean(lengths)), S, len(texts), len(packed_packs), K,
               "fine-tuning steps" if train else "inference"))
        def reset():  # after the warm-up: the initial weights, a fresh optimizer state
            for model, state in restore:
                model.load_state_dict(state)
            if train:
                for o in (hf_optimizer, our_optimizer):
                    o.state.clear()

        timings = measure(entries, repeats, order, reset, log=log)
        logit_difference = None
        if not train:
            ours_logits = collect(ours, packed_packs, B)["logits"]
            hf_logits = torch.cat([hf_forward(b) for b in hf_padded]).numpy()
            logit_difference = float(np.abs(ours_logits - hf_logits).max())
        rows = []
        for i, e in enumerate(entries):
            rows.append({"name": e.name, "calls": len(e.batches), "sequences": e.sequences,
                         "computed_tokens": e.computed_tokens, "seconds": timings.seconds[i],
                         "sequences_per_second": e.sequences / timings.median(i),
                         "sequences_per_row": factor if e.name == "ours packed" else (
                             None if not e.computed_tokens else 1.0)})
        speed = {row["name"]: row["sequences_per_second"] for row in rows}
        for row in rows:
            row["ratio"] = row["sequences_per_second"] / speed[BASELINE]
            row["ratio_dynamic"] = row["sequences_per_second"] / speed["transformers dynamic"]
            row["ratio_grouped"] = row["sequences_per_second"] / speed["transformers grouped"]
        config = hf.config
        return {
            "mode": "classifier-train" if train else "classifier-inference", "classifier": directory,
            "model": {"preset": preset, "hidden_size": int(config.hidden_size),
                      "num_hidden_layers": int(config.num_hidden_layers), "vocab_size": int(config.vocab_size),
                      "num_labels": num_labels},
            "inputs": n, "real_tokens": int(sum(lengths)), "mean_length": float(np.mean(lengths)),
            "max_seq_length": S, "max_sequences_per_pack": K, "packs": int(len(packed_packs)),
            "packing_factor": factor, "micro_batch_size": B, "repeats": repeats, "pairs": pairs,
            "packs_per_step": steps if train else None, "packs_per_call": None if train else steps,
            "passes": passes or None,
            "packed_over_padded": speed["ours packed"] / speed["ours padded"],
            "seed": seed, "rows": rows, "ours_attention": str(getattr(ours, "attention_implementation", "")),
            "transformers_attention": hf_attention, "max_logit_difference": logit_difference,
            "optimizer": dict(ADAMW, name="AdamW", fused={"transformers": fused(hf_optimizer),
                                                          "ours": fused(our_optimizer)}) if train else None,
            "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
            "transformers_version": transformers.__version__, "load_before": timings.load_before,
            "load_after": timings.load_after, "order": order, "seconds": time.perf_counter() - started,
        }


def format_classifier_peers(r: Dict[str, Any]) -> str:
    m = r["model"]
    lines = [
        "%s: %s (hidden %d, %d layers, vocab %d, %d labels), S=%d, K<=%d, micro batch %d (rows), %d torch threads, "
        "%d repeats (medians; %s)" % (r["mode"], m["preset"] or r["classifier"], m["hidden_size"],
                                      m["num_hidden_layers"], m["vocab_size"], m["num_labels"], r["max_seq_length"],
                                      r["max_sequences_per_pack"], r["micro_batch_size"], r["torch_threads"],
                                      r["repeats"], ORDERS[r["order"]]),
        "%d inputs, %d real tokens (mean length %.1f) -> %d packs (packing factor %.2f); attention: ours %s, "
        "transformers %s; torch %s, transformers %s" % (
            r["inputs"], r["real_tokens"], r["mean_length"], r["packs"], r["packing_factor"], r["ours_attention"],
            r["transformers_attention"], r["torch_version"], r["transformers_version"]),
        "load average before %s, after %s" % (" ".join("%.2f" % x for x in r["load_before"]),
                                              " ".join("%.2f" % x for x in r["load_after"])),
    ]
    if r["max_logit_difference"] is not None:
        lines.append("largest |logit| difference, ours packed against transformers padded: %.2e"
                     % r["max_logit_difference"])
    if r.get("packs_per_call"):
        lines.append("packs a call, the predictor's default on CPU (predict.packs_per_call): ours padded %d, ours "
                     "packed %d; transformers %d rows" % (
                         r["packs_per_call"]["ours padded"], r["packs_per_call"]["ours packed"], r["micro_batch_size"]))
    if r.get("packs_per_step"):
        lines.append("steps of %d sequences, each one micro batch (the training app's step off the IPU): ours padded "
                     "%d rows, ours packed %d packs" % (r["micro_batch_size"], r["packs_per_step"]["ours padded"],
                                                        r["packs_per_step"]["ours packed"]))
    if (r.get("optimizer") or {}).get("fused"):
        lines.append("AdamW: transformers %s, ours %s" % tuple(
            "fused" if r["optimizer"]["fused"][k] else "per-op loop" for k in ("transformers", "ours")))
    lines.append("ours packed / ours padded: %.2fx at packing factor %.2f (%.0f%% of it)"
                 % (r["packed_over_padded"], r["packing_factor"], 100 * r["packed_over_padded"] / r["packing_factor"]))
    lines.append("%-22s %6s %10s %9s %9s %9s %8s %13s" % ("contender", "calls", "seq/s", "vs HF pad", "vs dyn",
                                                          "vs group", "seq/row", "computed tok"))
    for row in r["rows"]:
        per_row = row.get("sequences_per_row")
        lines.append("%-22s %6d %10.1f %8.2fx %8.2fx %8.2fx %8s %13s" % (
            row["name"], row["calls"], row["sequences_per_second"], row["ratio"], row["ratio_dynamic"],
            row["ratio_grouped"], "-" if per_row is None else "%.2f" % per_row, row["computed_tokens"] or "-"))
    return "\n".join(lines)


CLASSIFIER_OPTIONS = ("classifier", "input", "inputs", "train", "table", "max_seq_length", "max_sequences_per_pack",
                      "micro_batch_size", "repeats", "order", "model", "threads", "seed", "json", "help", "plot")
"""bench's options that --classifier takes (--plot: only its default; nothing is drawn)."""


def main_classifier(parser, args) -> int:
    """``--classifier``: check the options, run, print the table (or JSON) on stdout."""
    import sys

    from .. import jsonout

    for action in parser._actions:
        value = getattr(args, action.dest, action.default)
        if action.dest not in CLASSIFIER_OPTIONS and value != action.default and value != []:
            raise BenchError("%s does not apply with --classifier" % ("/".join(action.option_strings) or action.dest,))
    if args.plot != parser.get_default("plot"):
        raise BenchError("--plot is not an option of --classifier (it prints a table, or JSON with --json)")
    S = 128 if args.max_seq_length is None else args.max_seq_length
    K = 32 if args.max_sequences_per_pack is None else args.max_sequences_per_pack
    B = 32 if args.micro_batch_size is None else args.micro_batch_size
    for name, value, low in (("max-seq-length", S, 8), ("max-sequences-per-pack", K, 1), ("micro-batch-size", B, 1),
                             ("repeats", args.repeats, 1), ("inputs", args.inputs, 1)):
        if value < low:
            raise BenchError("--%s must be >= %d, got %d" % (name, low, value))
    if K > 255:
        raise BenchError("--max-sequences-per-pack must be <= 255, got %d" % K)
    if not os.path.isdir(args.classifier):
        raise BenchError("--classifier %s is not a directory (a BERT model with its tokenizer)" % (args.classifier,))
    texts = None
    if args.input:
        from ipu_packing.predict import read_inputs

        if not os.path.isfile(args.input):
            raise BenchError("--input %s is not a file" % (args.input,))
        texts = read_inputs(args.input, None, None)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.table and args.train:
        raise BenchError("--table times serving and fine-tuning steps: leave out --train")
    log = (lambda message: print(message, file=sys.stderr, flush=True)) if not args.json else (lambda message: None)
    modes = (False, True) if args.table else (args.train,)
    results = [run_classifier_peers(args.classifier, texts, args.inputs, S, K, B, args.repeats, args.model,
                                    train, args.seed, args.order, log) for train in modes]
    if args.json:
        print(jsonout.dumps(results if args.table else results[0], sort_keys=True))
    else:
        print("\n\n".join(format_classifier_peers(r) for r in results))
    return 0

__all__ = ["format_classifier_peers", "main_classifier", "run_classifier_peers"]
