"""``bench --classifier``: sequence classification, ours against transformers' ``BertForSequenceClassification``
on the same texts from the same weights: serving calls, or fine-tuning steps (``--train``; ``--table``: both, the
peer table of docs/results.md). docs/finetuning.md, "Benchmarks", says what each contender is.

    python -m ipu_packing.bench --classifier DIR [--input FILE] [--inputs 1024] [--max-seq-length 128] \\
        [--max-sequences-per-pack 32] [--micro-batch-size 32] [--repeats 3] [--model PRESET] [--train | --table]

``DIR``: a transformers BERT directory with its tokenizer (a classifier, or a pretraining export whose head is
then seeded at random; ``--model PRESET``: the preset's architecture, random weights). Transformers' model is
built, saved with the tokenizer to a temporary directory, and ours is ``Predictor.from_pretrained`` of it.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .harness import ORDERS, Contender, load_line, measure, progress, restorer, table
from .harness import rows as harness_rows
from .inputs import BenchError, refuse_other_modes_options
from .peers import hf_batches, to_tensors

BASELINE = "transformers padded"


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

    from .inputs import MODEL_PRESETS

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
    from ipu_packing.train.optim import adamw

    from .peers import ADAMW, adamw_groups as groups

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
    """The bench; a dict (JSON-ready)."""
    import torch
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # a pretraining export's new head, the pipeline's device notice
    try:
        return _run(transformers, torch, directory, texts, inputs, S, K, micro_batch_size, repeats, preset, train,
                    seed, order, log)
    finally:
        transformers.logging.set_verbosity(verbosity)


@dataclass
class Inputs:
    """The texts both sides take, tokenized once as ``BertTokenizerFast(text, truncation=True, max_length=S)``."""

    texts: List[Any]
    labels: List[int]
    """Each input's label: the demo task's (its label names sorted, modulo the model's labels), else seeded."""
    encoded: List[List[int]]
    token_types: Optional[List[List[int]]]
    """Each input's token type ids (pairs), else None."""

    @property
    def lengths(self) -> List[int]:
        return [len(e) for e in self.encoded]


@dataclass
class Mode:
    """One mode's entries, what restores their state after the warm-up, and what the result says of the mode."""

    entries: List[Contender]
    reset: Optional[Callable[[], None]]
    report: Dict[str, Any]


def tokenize(texts: List[Any], label_names: Optional[List[str]], tokenizer, S: int, num_labels: int,
             seed: int) -> Inputs:
    if label_names is not None:
        names = sorted(set(label_names))
        labels = [names.index(n) % num_labels for n in label_names[:len(texts)]]
    else:
        labels = np.random.default_rng(seed).integers(0, num_labels, len(texts)).tolist()
    pairs = isinstance(texts[0], tuple)
    tokenized = (tokenizer([a for a, _ in texts], [b for _, b in texts], truncation=True, max_length=S) if pairs
                 else tokenizer(texts, truncation=True, max_length=S))
    return Inputs(texts, labels, [list(e) for e in tokenized["input_ids"]],
                  [list(t) for t in tokenized["token_type_ids"]] if pairs else None)


def hf_entries(data: Inputs, B: int, S: int, grouped_order: Sequence[int], call, labels) -> List[Contender]:
    """transformers padded to S, with dynamic padding (input order) and grouped (``grouped_order``), B a call."""
    import torch

    rows = [dict(input_ids=e, token_type_ids=data.token_types[i] if data.token_types else [0] * len(e),
                 **({"labels": int(labels[i])} if labels is not None else {})) for i, e in enumerate(data.encoded)]
    entries = []
    for name, order, length in (("transformers padded", range(len(rows)), S),
                                ("transformers dynamic", range(len(rows)), None),
                                ("transformers grouped", grouped_order, None)):
        batches = hf_batches(rows, order, B, length)
        entries.append(Contender(name, to_tensors(batches, torch), call, sequences=len(rows),
                             computed_tokens=sum(int(b["input_ids"].size) for b in batches)))
    return entries


def serving(hf, padded, packed, tokenizer, data: Inputs, packs, B: int, S: int, transformers, torch) -> Mode:
    """Inference: eval mode, no gradients; ours as many packs a call as each predictor takes by default."""
    from ipu_packing.train.evaluate import collect

    hf.eval()
    packed.model.eval()
    n = len(data.texts)

    def hf_forward(batch):
        with torch.no_grad():
            return hf(**batch).logits

    def ours(name: str, predictor) -> Contender:
        batches, computed = pack_batches(packs[name], predictor.batch_packs)
        return Contender(name, batches, lambda p: collect(predictor.model, p, len(p)), sequences=n,
                     computed_tokens=computed)

    pipe = transformers.pipeline("text-classification", model=hf, tokenizer=tokenizer, top_k=None, device="cpu",
                                 batch_size=B)
    texts = data.texts
    entries = hf_entries(data, B, S, sorted(range(n), key=lambda i: -data.lengths[i]), hf_forward, None) + [
        ours("ours padded", padded), ours("ours packed", packed),
        Contender("transformers pipeline", [[{"text": a, "text_pair": b} for a, b in texts]
                                        if data.token_types is not None else texts], lambda t: pipe(t), sequences=n),
        Contender("ours predict", [texts], packed.predict, sequences=n)]
    ours_logits = collect(packed.model, packs["ours packed"], B)["logits"]
    hf_logits = torch.cat([hf_forward(b) for b in entries[0].batches]).numpy()
    return Mode(entries, None, {
        "packs_per_call": {"ours padded": padded.batch_packs, "ours packed": packed.batch_packs},
        "max_logit_difference": float(np.abs(ours_logits - hf_logits).max())})


def training(hf, ours, data: Inputs, packs, B: int, S: int, factor: float, seed: int, transformers,
             torch) -> Mode:
    """Fine-tuning steps of B sequences: transformers' three batchings (grouped in the Trainer's group_by_length
    order), ours a step as the training app's batch accounting makes it off the IPU, every side AdamW."""
    from ipu_packing.execution import ExecutionConfig, make_runner
    from ipu_packing.train.sections import TrainingConfig

    from .peers import ADAMW, length_grouped_order

    hf.train()
    ours.train()
    hf_optimizer, our_optimizer = optimizers(hf, ours, transformers, torch)
    steps = {"ours padded": B, "ours packed": TrainingConfig(global_batch_sequences=B).packs_per_step(1, factor)}
    runners: Dict[int, Any] = {}

    def runner_for(packs_a_step: int):
        """The runner of a step of one micro batch of ``packs_a_step`` packs (the last step may be short)."""
        if packs_a_step not in runners:
            ex = ExecutionConfig(backend="torch", device="cpu", micro_batch_size=packs_a_step, gradient_accumulation=1)
            runners[packs_a_step] = make_runner(ours, our_optimizer, ex)
        return runners[packs_a_step]

    def hf_step(batch):
        hf_optimizer.zero_grad(set_to_none=True)
        hf(**batch).loss.backward()
        hf_optimizer.step()

    def our_step(batch):
        runner_for(int(batch["input_ids"].shape[0])).train_step(batch)

    def ours_entry(name: str) -> Contender:
        batches, computed = pack_batches(packs[name], steps[name], data.labels)
        return Contender(name, to_tensors([p.arrays for p in batches], torch), our_step, sequences=len(data.texts),
                         computed_tokens=computed)

    passes = {name: runner_for(packs_a_step).config.pass_sizes for name, packs_a_step in steps.items()}
    entries = (hf_entries(data, B, S, length_grouped_order(data.lengths, B, seed), hf_step, data.labels)
               + [ours_entry("ours padded"), ours_entry("ours packed")])
    # after the warm-up: the initial weights, a fresh optimizer state
    return Mode(entries, restorer([hf, ours], [hf_optimizer, our_optimizer]), {
        "packs_per_step": steps, "passes": passes,
        "optimizer": dict(ADAMW, name="AdamW", fused={"transformers": fused(hf_optimizer),
                                                      "ours": fused(our_optimizer)})})


def _run(transformers, torch, directory, texts, inputs, S, K, B, repeats, preset, train, seed, order, log):
    from ipu_packing.predict import Predictor

    from .peers import with_sdpa

    started = time.perf_counter()
    label_names = None
    if texts is None:
        texts, label_names = demo_texts()
    texts = list(texts)[:inputs]
    if not texts:
        raise BenchError("no input texts to time")
    with tempfile.TemporaryDirectory() as work:
        _, tokenizer, saved = build_models(directory, preset, S, seed, work)
        cls = transformers.BertForSequenceClassification
        hf, hf_attention = with_sdpa(lambda **kw: cls.from_pretrained(saved, **kw))
        padded = Predictor.from_pretrained(saved, S, 1)  # serving: the predictor's own packs a call
        packed = Predictor.from_pretrained(saved, S, K)
        padded.model = packed.model  # one model for both of our layouts (as one model serves any K)
        data = tokenize(texts, label_names, tokenizer, S, int(hf.config.num_labels), seed)
        packs = {"ours padded": padded.packs(texts), "ours packed": packed.packs(texts)}
        n, lengths = len(texts), data.lengths
        factor = n / float(len(packs["ours packed"]))
        mode = (training(hf, packed.model, data, packs, B, S, factor, seed, transformers, torch) if train
                else serving(hf, padded, packed, tokenizer, data, packs, B, S, transformers, torch))
        log("%d inputs (%d tokens, mean length %.1f) at S=%d: %d padded rows, %d packs (K<=%d); %s"
            % (n, sum(lengths), float(np.mean(lengths)), S, n, len(packs["ours packed"]), K,
               "fine-tuning steps" if train else "inference"))
        timings = measure(mode.entries, repeats, order, mode.reset, log=log)
        rows = harness_rows(timings, {"ratio": BASELINE, "ratio_dynamic": "transformers dynamic",
                                      "ratio_grouped": "transformers grouped"})
        for row in rows:  # the pipeline and predict end to end compute no rows of their own
            row["sequences_per_row"] = factor if row["name"] == "ours packed" else (
                1.0 if row["computed_tokens"] else None)
        speed = {row["name"]: row["sequences_per_second"] for row in rows}
        config = hf.config
        return dict({
            "mode": "classifier-train" if train else "classifier-inference", "classifier": directory,
            "model": {"preset": preset, "hidden_size": int(config.hidden_size),
                      "num_hidden_layers": int(config.num_hidden_layers), "vocab_size": int(config.vocab_size),
                      "num_labels": int(config.num_labels)},
            "inputs": n, "real_tokens": int(sum(lengths)), "mean_length": float(np.mean(lengths)),
            "max_seq_length": S, "max_sequences_per_pack": K, "packs": int(len(packs["ours packed"])),
            "packing_factor": factor, "micro_batch_size": B, "repeats": repeats,
            "pairs": data.token_types is not None, "packs_per_step": None, "packs_per_call": None, "passes": None,
            "max_logit_difference": None, "optimizer": None,
            "packed_over_padded": speed["ours packed"] / speed["ours padded"],
            "seed": seed, "rows": rows, "ours_attention": str(getattr(packed.model, "attention_implementation", "")),
            "transformers_attention": hf_attention, "torch_threads": torch.get_num_threads(),
            "torch_version": torch.__version__, "transformers_version": transformers.__version__,
            "load_before": timings.load_before, "load_after": timings.load_after, "order": order,
            "seconds": time.perf_counter() - started,
        }, **mode.report)


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
        load_line(r["load_before"], r["load_after"]),
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
    lines += table(r["rows"], [
        ("contender", 22, lambda row: row["name"]), ("calls", 6, lambda row: "%d" % row["calls"]),
        ("seq/s", 10, lambda row: "%.1f" % row["sequences_per_second"]),
        ("vs HF pad", 9, lambda row: "%.2fx" % row["ratio"]), ("vs dyn", 9, lambda row: "%.2fx" % row["ratio_dynamic"]),
        ("vs group", 9, lambda row: "%.2fx" % row["ratio_grouped"]),
        ("seq/row", 8, lambda row: "-" if row["sequences_per_row"] is None else "%.2f" % row["sequences_per_row"]),
        ("computed tok", 13, lambda row: "%d" % row["computed_tokens"] if row["computed_tokens"] else "-")])
    return "\n".join(lines)


def main_classifier(parser, args) -> int:
    """``--classifier``: check the options, run, print the table (or JSON) on stdout."""
    from .. import jsonout

    refuse_other_modes_options(parser, args, "--classifier")
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
    log = progress(args.json)
    modes = (False, True) if args.table else (args.train,)
    results = [run_classifier_peers(args.classifier, texts, args.inputs, S, K, B, args.repeats, args.model,
                                    train, args.seed, args.order, log) for train in modes]
    if args.json:
        print(jsonout.dumps(results if args.table else results[0], sort_keys=True))
    else:
        print("\n\n".join(format_classifier_peers(r) for r in results))
    return 0

__all__ = ["format_classifier_peers", "main_classifier", "run_classifier_peers"]
