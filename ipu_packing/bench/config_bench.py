"""``bench --config``: packed against padded through a training config's own runner, data and batch accounting
(docs/app.md, "Through a training config", says what is timed and reported; a fine-tuning config's rows:
config_finetune.py).

    python -m ipu_packing.bench --config demo_512 [section.key=value ...] [--steps N] [--json] [--plot PNG]
    python -m ipu_packing.bench --config demo_512 --histogram ../shared/data/wikipedia_512_histogram.json
    python -m ipu_packing.bench --config demo --attention dense,sdpa,varlen [--steps N]
    torchrun --nproc-per-node 2 -m ipu_packing.bench --config NAME ...     (DDP or pipelined configs)

``--attention A,B,...`` times both layouts with each implementation (``model.packed_attention``), every call
interleaved (padded and packed of A, of B, ...; then again): the measurement behind the torch configs' default
attention; the first attention's figures are the top-level ones.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import jsonout
from .harness import ORDERS, Contender, measure, progress
from .inputs import (BenchError, attention_list, check_writable, first_epoch_packs, read_histogram_file,
                     refuse_other_modes_options)
from .throughput import make_sequences, plan_histogram, select_packs


def load_layouts(name: str, overrides: Sequence[str]):
    """(packed config, padded config): the config as both layouts, through the one loader."""
    from ipu_packing.train import load_config

    return (load_config(name, list(overrides) + ["data.layout=packed"]),
            load_config(name, list(overrides) + ["data.layout=padded"]))


class Rows:
    """A layout's rows as a torch Dataset of pack dicts (int32, as ipu_packing.data's Dataset serves them)."""

    def __init__(self, packs) -> None:
        from ipu_packing.data.format import as_batch

        # {field: (P, width)}: a structured array of records, or a fine-tuning layout's fields already stacked
        self.arrays = dict(packs) if isinstance(packs, dict) else as_batch(packs, np.int32)

    def __len__(self) -> int:
        return int(self.arrays["input_ids"].shape[0])

    def __getitem__(self, i: int):
        import torch

        return {name: torch.from_numpy(array[i]) for name, array in self.arrays.items()}


def row_count(packs) -> int:
    """Rows of a layout: records, or a fine-tuning layout's stacked fields."""
    return int(packs["input_ids"].shape[0]) if isinstance(packs, dict) else int(len(packs))


def rows_per_call(execution) -> int:
    """Rows (all processes together) one train_step consumes: a global batch per optimizer step, times the
    optimizer steps of one call (poptorch's device iterations)."""
    return int(execution.global_batch_packs) * int(execution.optimizer_steps_per_call)


def open_source(config, histogram: Optional[np.ndarray], path: str):
    """(source, packing factor): the config's prepared dataset (TrainingData, opened and checked as training
    does), or the histogram's packing plan over the config's S and K."""
    if histogram is None:
        from ipu_packing.data import open_dataset
        from ipu_packing.train.data import open_run_data

        data, _ = open_run_data(config, open_dataset=lambda path, **kw: open_dataset(path, as_tensors=False, **kw))
        return data, data.packing_factor
    S = config.data.max_seq_length
    if histogram[S:].sum() > 0:
        raise BenchError("histogram %s has sequences longer than the config's data.max_seq_length %d" % (path, S))
    histogram = np.concatenate([histogram[:S], np.zeros(max(0, S - len(histogram)))])
    plan = plan_histogram(histogram, S, config.data.max_sequences_per_pack, None)
    return plan, plan.num_sequences / float(plan.num_packs)


def dataset_groups(config, data, packed_rows: int, padded_rows: int) -> Tuple[List[List[Any]], Dict[str, Any]]:
    """Sequences of the prepared dataset, grouped as DIR/packed packs them: the packs of the run's first
    epoch in its order (TrainingData.epoch_order), until there are `packed_rows` packs and `padded_rows`
    sequences."""
    from ipu_packing.data.reference import unpack

    records = first_epoch_packs(config, data, packed_rows, padded_rows,
                                lambda record: int(np.max(record["sequence_ids"])), "sequences")  # numbered 1..k
    groups = [unpack(record) for record in records]
    return groups, {"source": data.path, "packed_mlm_slots": int(data.dataset.mlm_slots),
                    "recipe": data.dataset.manifest.get("recipe") or {}}


def histogram_groups(config, plan, path: str, packed_rows: int, padded_rows: int):
    """Random-token sequences of the plan's packs (bench.select_packs), as many as both layouts need."""
    count = max(packed_rows, int(math.ceil(padded_rows * plan.num_packs / float(plan.num_sequences))))
    while True:
        chosen = select_packs(plan, count, config.training.seed)
        if (len(chosen) >= packed_rows and sum(len(p) for p in chosen) >= padded_rows) or count >= plan.num_packs:
            break
        count = int(count * 1.1) + 1
    lengths = np.asarray([n for pack in chosen for n in pack], dtype=np.int64)
    if len(chosen) < packed_rows or len(lengths) < padded_rows:
        raise BenchError("histogram %s holds too few sequences for --steps of both layouts; lower --steps" % (path,))
    sequences = iter(make_sequences(lengths, config.model_value("vocab_size"), config.training.seed))
    groups = [[next(sequences) for _ in pack] for pack in chosen]
    return groups, {"source": path, "packed_mlm_slots": None, "recipe": {}}


def lay_out(groups: List[List[Any]], S: int, K: int, M_packed: Optional[int], recipe: Dict[str, Any]):
    """(packed, padded) pack records of the same sequences, by format.pack_sequences."""
    from ipu_packing.data.format import mlm_slots
    from ipu_packing.data.reference import pack_sequences

    prob = float(recipe.get("masked_lm_prob", 0.15))
    cap = recipe.get("max_predictions_per_seq")
    packed = pack_sequences(groups, S, K, M_packed or mlm_slots(S, K, prob, cap))
    padded = pack_sequences([[s] for group in groups for s in group], S, 1, mlm_slots(S, 1, prob, cap))
    return packed, padded


class Timed:
    """One layout: its config, accounting, runner and the batches of its calls."""

    def __init__(self, name: str, config, accounting, packs, task=None) -> None:
        import torch

        from ipu_packing.execution import make_runner
        from ipu_packing.train.build import build
        from ipu_packing.train.task import PRETRAINING

        task = task or PRETRAINING
        self.name, self.config, self.accounting = name, config, accounting
        built = build(config, accounting.betas, task)  # both layouts start from the same (seeded) weights
        self.attention = str(getattr(built.model, "attention_implementation", ""))
        self.runner = make_runner(built.model, built.optimizer, accounting.execution, scheduler=built.scheduler,
                                  metrics=task.metrics)
        rng = torch.get_rng_state()
        # A copy of each batch: an asynchronous poptorch.DataLoader (the IPU configs' mode) hands out the memory
        # of its ring buffer, which its worker refills once the next batch is asked for.
        self.batches = [{k: v.clone() for k, v in batch.items()}
                        for batch in self.runner.dataloader(Rows(packs), num_workers=0)]
        torch.set_rng_state(rng)
        self.compile_seconds = self.warmup_seconds = 0.0
        self.seconds: List[float] = []
        self.metrics: List[Any] = []

    def compile(self, log: Callable[[str], None]) -> None:
        """``runner.compile`` on the first batch, timed apart (the poptorch compile or cache load; nothing on torch),
        then the executable released for the other layouts."""
        start = time.perf_counter()
        self.runner.compile(self.batches[0])
        self.compile_seconds = time.perf_counter() - start
        getattr(self.runner, "release", lambda: None)()
        log("%s: compile %.2f s; %s; %s" % (self.name, self.compile_seconds, self.accounting.describe(),
                                            self.accounting.describe_passes()))

    def step(self, batch) -> None:
        self.metrics.append(self.runner.train_step(batch))

    def contender(self, calls: int) -> Contender:
        """The harness's contender: the warm-up on the first batch, ``calls`` timed calls on the next; a poptorch
        executable attached for each call and detached after it (one layout's on the IPUs at a time)."""
        return Contender("%s %s" % (self.name, self.attention), self.batches[1:1 + calls], self.step,
                         after=getattr(self.runner, "release", None), before=getattr(self.runner, "attach", None),
                         warmup=self.batches[0])

    def summary(self) -> Dict[str, Any]:
        seconds = float(sum(self.seconds))
        ex = self.accounting.execution
        steps = sum(int(getattr(m, "optimizer_steps", 1)) for m in self.metrics)
        sequences, tokens = sum(int(m.sequences) for m in self.metrics), sum(int(m.tokens) for m in self.metrics)
        return {
            "steps": steps, "sequences": sequences, "tokens": tokens, "rows": len(self.metrics) * rows_per_call(ex),
            "seconds": seconds, "seconds_per_step": seconds / max(1, steps),
            "sequences_per_second": sequences / seconds, "tokens_per_second": tokens / seconds,
            "compile_seconds": self.compile_seconds, "warmup_seconds": self.warmup_seconds,
            "micro_batch_size": ex.micro_batch_size, "gradient_accumulation": self.accounting.gradient_accumulation,
            "global_batch_packs": ex.global_batch_packs, "betas": list(self.accounting.betas),
            "call_seconds": list(self.seconds),
        }


def load_variants(name: str, overrides: Sequence[str], attentions: Sequence[Optional[str]], histogram: bool):
    """[(packed config, padded config)] of each attention (None: the config's own), checked for this machine's
    backend; a fine-tuning config with the architecture training builds (a phase-1 directory's)."""
    from ipu_packing.train.run_plan import check_backend

    variants = [list(overrides) + (["model.packed_attention=%s" % a] if a else []) for a in attentions]
    configs = [load_layouts(name, v) for v in variants]
    if configs[0][0].task.fine_tuning:  # the model training builds: a phase-1 directory's architecture
        from ipu_packing.train.phase1 import with_init_architecture

        if histogram:
            raise BenchError("--histogram applies to pretraining configs: %s fine-tunes (task.name=%s) and is timed "
                             "on its task's split, %s" % (name, configs[0][0].task.name, configs[0][0].data.path))
        configs = [(with_init_architecture(a), with_init_architecture(b)) for a, b in configs]
    for packed_variant, _ in configs:
        check_backend(packed_variant)
    return configs


@dataclass
class TimedRows:
    """The rows both layouts time, the same sequences in both, and the batch accounting each gets."""

    packed: Any
    """Pack records (or a fine-tuning layout's stacked fields) of the packed layout; ``padded`` one sequence a row."""
    padded: Any
    source: Dict[str, Any]
    """Where the rows come from (``source``: a dataset's path or the histogram's; a fine-tuning split's matching)."""
    task: Any
    """The fine-tuning config's task (train/task.py), else None."""
    factor: float
    """The packing factor the packed layout's accounting divides by (the dataset's, or the plan's)."""
    num_sequences: int
    packed_accounting: Any
    padded_accounting: Any


def timed_rows(configs, calls: int, histogram: Optional[np.ndarray], histogram_path: str) -> TimedRows:
    """The rows both layouts time (a warm-up call and ``calls`` timed calls of each), with the batch accounting
    each gets (the measured packing factor, as training uses): a fine-tuning config's task split
    (config_finetune.py), else the dataset's packs or a histogram plan's."""
    packed_config, padded_config = configs
    task = None
    if packed_config.task.fine_tuning:
        from .config_finetune import open_task_data

        source_data, padded_data, task = open_task_data(packed_config, padded_config)
        factor = source_data.packing_factor
    else:
        source_data, factor = open_source(packed_config, histogram, histogram_path)
    padded_accounting = padded_config.batch_accounting(1.0)
    packed_accounting = packed_config.batch_accounting(factor)
    need_padded = (calls + 1) * rows_per_call(padded_accounting.execution)
    need_packed = (calls + 1) * rows_per_call(packed_accounting.execution)
    if task is not None:
        from .config_finetune import task_layouts

        packed_packs, padded_packs, source = task_layouts(packed_config, source_data, padded_data, need_packed,
                                                          need_padded)
        num_sequences = source["examples"]
    else:
        if histogram is None:
            groups, source = dataset_groups(packed_config, source_data, need_packed, need_padded)
        else:
            groups, source = histogram_groups(packed_config, source_data, histogram_path, need_packed, need_padded)
        packed_packs, padded_packs = lay_out(groups, packed_config.data.max_seq_length,
                                             packed_config.data.max_sequences_per_pack, source["packed_mlm_slots"],
                                             source["recipe"])
        num_sequences = sum(len(g) for g in groups)
    return TimedRows(packed_packs, padded_packs, source, task, factor, num_sequences, packed_accounting,
                     padded_accounting)


def run_config_bench(name: str, overrides: Sequence[str], steps: int, histogram: Optional[np.ndarray] = None,
                     histogram_path: str = "", log: Callable[[str], None] = lambda message: None,
                     attentions: Sequence[Optional[str]] = (None,), order: str = "calls") -> Dict[str, Any]:
    import torch

    configs = load_variants(name, overrides, attentions, histogram is not None)
    packed_config = configs[0][0]
    # Rows each layout needs (all processes): one warm-up call and ceil(N / steps per call) timed calls.
    calls = int(math.ceil(steps / float(packed_config.execution.optimizer_steps_per_call)))
    rows = timed_rows(configs[0], calls, histogram, histogram_path)
    if packed_config.training.num_threads:
        torch.set_num_threads(packed_config.training.num_threads)
    layouts = []  # type: List[Timed]
    for packed_variant, padded_variant in configs:  # the same sequences and accounting; another attention
        layouts += [Timed("padded", padded_variant, rows.padded_accounting, rows.padded, rows.task),
                    Timed("packed", packed_variant, rows.packed_accounting, rows.packed, rows.task)]
    for layout in layouts:
        layout.compile(log)
    # padded, packed, padded, packed, ... (of each attention in turn), after one warm-up call of each
    timings = measure([layout.contender(calls) for layout in layouts], 1, order,
                      lambda: [layout.metrics.clear() for layout in layouts], log=log)
    for layout, warmup, seconds in zip(layouts, timings.warmup, timings.calls):
        layout.warmup_seconds, layout.seconds = warmup, seconds
    summaries = [layout.summary() for layout in layouts]
    padded, packed = summaries[0], summaries[1]
    ex = rows.packed_accounting.execution
    speedup = packed["sequences_per_second"] / padded["sequences_per_second"]
    theoretical = (packed["sequences"] / float(packed["rows"])) / (padded["sequences"] / float(padded["rows"]))
    model = layouts[1].runner.model
    result = {
        "mode": "config", "config": packed_config.name, "overrides": list(overrides),
        "main_process": int(getattr(layouts[0].runner, "rank", 0)) == 0,
        "backend": ex.backend, "device": ex.device if ex.backend == "torch" else "ipu",
        "replication_factor": ex.replication_factor, "pipeline_stages": ex.num_stages, "world_size": ex.world_size,
        "precision": ex.precision, "attention": getattr(model, "attention_implementation", None),
        "torch_threads": torch.get_num_threads(), "source": rows.source["source"],
        "max_seq_length": packed_config.data.max_seq_length,
        "max_sequences_per_pack": packed_config.data.max_sequences_per_pack, "steps": steps, "order": order,
        "num_sequences": rows.num_sequences, "padded_rows": row_count(rows.padded),
        "num_packs": row_count(rows.packed), "packing_factor": float(rows.factor),
        "batch_accounting": packed_config.training.batch_accounting,
        "padded_sequences_per_second": padded["sequences_per_second"],
        "packed_sequences_per_second": packed["sequences_per_second"],
        "padded_tokens_per_second": padded["tokens_per_second"],
        "packed_tokens_per_second": packed["tokens_per_second"],
        "speedup": speedup, "theoretical_speedup": theoretical, "overhead": theoretical / speedup - 1.0,
        "compile_seconds": padded["compile_seconds"] + packed["compile_seconds"],
        "padded": padded, "packed": packed,
        "attentions": [{"attention": layouts[2 * j + 1].attention, "padded": summaries[2 * j],
                        "packed": summaries[2 * j + 1],
                        "speedup": summaries[2 * j + 1]["sequences_per_second"]
                        / summaries[2 * j]["sequences_per_second"]} for j in range(len(configs))],
    }
    if rows.task is not None:  # pretraining's result keeps exactly its keys
        result.update(task=rows.task.name, padded_source=rows.source["padded_source"],
                      example_ids=rows.source["example_ids"], matched_by=rows.source["matched_by"])
    return result


def format_config_result(r: Dict[str, Any]) -> str:
    lines = [
        "bench --config %s: %s on %s (replicas %d, stages %d, %s), S=%d, K=%d, %d optimizer steps of each layout "
        "(%s)" % (r["config"], r["backend"], r["device"], r["replication_factor"], r["pipeline_stages"],
                  r["precision"], r["max_seq_length"], r["max_sequences_per_pack"], r["steps"], ORDERS[r["order"]]),
        "sequences from %s: %d sequences = %d padded rows = %d packs (packing factor %.4f, accounting %s)"
        % (r["source"], r["num_sequences"], r["padded_rows"], r["num_packs"], r["packing_factor"],
           r["batch_accounting"]),
    ]
    if r.get("task"):
        lines.append("task %s: the packs' sequences one per row from %s (matched by %s)"
                     % (r["task"], r["padded_source"], r["matched_by"]))
    lines += [
        "%-7s %8s %11s %12s %13s %12s %12s"
        % ("layout", "steps", "seq/step", "s/step", "sequences/s", "tokens/s", "compile s"),
    ]
    for name in ("padded", "packed"):
        x = r[name]
        lines.append("%-7s %8d %11.1f %12.3f %13.1f %12.0f %12.2f" % (
            name, x["steps"], x["sequences"] / float(max(1, x["steps"])), x["seconds_per_step"],
            x["sequences_per_second"], x["tokens_per_second"], x["compile_seconds"]))
    lines.append("speed-up %.3fx (theoretical %.3fx, overhead %.1f%%)" % (r["speedup"], r["theoretical_speedup"],
                                                                        100.0 * r["overhead"]))
    if len(r.get("attentions", ())) > 1:
        first = r["attentions"][0]
        lines.append("%-9s %15s %15s %9s %14s" % ("attention", "padded seq/s", "packed seq/s", "speed-up",
                                                   "packed vs " + first["attention"]))
        for a in r["attentions"]:
            lines.append("%-9s %15.1f %15.1f %8.3fx %13.3fx" % (
                a["attention"], a["padded"]["sequences_per_second"], a["packed"]["sequences_per_second"],
                a["speedup"], a["packed"]["sequences_per_second"] / first["packed"]["sequences_per_second"]))
    return "\n".join(lines)


def draw_config_plot(r: Dict[str, Any], path: str) -> str:
    """Seconds of each timed call of both layouts, in the order they ran, and sequences/s."""
    from .throughput import draw_bars, two_panels

    with two_panels(path) as (fig, left, right):
        for name in ("padded", "packed"):
            seconds = r[name]["call_seconds"]
            left.plot(range(1, len(seconds) + 1), seconds, marker="o", label=name)
        left.set_xlabel("timed call (interleaved)")
        left.set_ylabel("seconds")
        left.legend()
        draw_bars(right, r["padded_sequences_per_second"], r["packed_sequences_per_second"], r["theoretical_speedup"],
                  "speed-up %.2fx of %.2fx" % (r["speedup"], r["theoretical_speedup"]))
        fig.suptitle("%s: packed vs padded through the %s runner" % (r["config"], r["backend"]))
    return path


def main_config(parser, args) -> int:
    """bench --config: check the options, run, then print (and plot) on the first process only."""
    refuse_other_modes_options(parser, args, "--config")
    if args.steps < 1:
        raise BenchError("--steps must be >= 1")
    histogram = read_histogram_file(args.histogram, None) if args.histogram else None
    if args.plot:
        check_writable(args.plot, reading=[args.histogram or ""])
    log = progress(args.json)
    attentions = attention_list(args)
    if any(a and "model.packed_attention=" in o for a in attentions for o in args.overrides):
        raise BenchError("--attention and the override model.packed_attention both choose the attention: give one")
    result = run_config_bench(args.config, args.overrides, args.steps, histogram, args.histogram or "", log=log,
                              attentions=attentions, order=args.order)
    if not result.pop("main_process"):
        return 0
    if args.plot:
        result["plot"] = draw_config_plot(result, args.plot)
    print(jsonout.dumps(result, sort_keys=True) if args.json else format_config_result(result))
    return 0
