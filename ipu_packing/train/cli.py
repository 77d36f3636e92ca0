"""Command line of run_pretraining.py and run_finetuning.py: parse, then call into ipu_packing.train.

    python run_pretraining.py [--config NAME|PATH] [--dry-run] [section.key=value ...]
    python run_finetuning.py [--config NAME|PATH] [--dry-run] [section.key=value ...]

The two are one command over one run machinery: a config's ``task.name`` says what it trains, and each script
refuses the other's configs (pretraining, or a fine-tuning task), so a typo trains nothing it was not asked to.

Exit status (ipu_packing.errors.run_command): 0 done; 2 bad input (config, dataset, checkpoint,
launch), reported on one line before anything is written, or a run that diverged, naming the last
checkpoint that is finite throughout; 130 and 143 stopped by SIGINT (Ctrl-C) and SIGTERM, after the step in
flight completed and its checkpoint was written (train/guard.py), in one line naming both.
"""

from __future__ import annotations

import argparse
from typing import List, Optional

from ..errors import ArgumentParser, ConfigError, run_command
from .loader import DEFAULT_CONFIG, available_configs, load_config


FINETUNE_DEFAULT_CONFIG = "finetune_demo"


def build_parser(fine_tuning: bool = False) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="run_finetuning.py" if fine_tuning else "run_pretraining.py",
        description=("BERT fine-tuning on packed sequences" if fine_tuning else "BERT phase-2 pretraining on packed "
                     "sequences") + " (configs/*.yaml; overrides as section.key=value).",
    )
    parser.add_argument("--config", default=FINETUNE_DEFAULT_CONFIG if fine_tuning else DEFAULT_CONFIG,
                        help="config name in configs/ or a YAML path (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print placement, memory and batch sizes; train nothing")
    parser.add_argument("--list-configs", action="store_true", help="print the shipped config names")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="e.g. training.steps=20")
    return parser


def dry_run(config) -> str:
    """The execution package's report, preceded by the batch accounting (no dataset opened; a phase-1
    directory's architecture read, as training reads it)."""
    from .phase1 import with_init_architecture

    config = with_init_architecture(config)
    accounting = config.batch_accounting(config.nominal_packing_factor)
    lines = [
        "config %s: model %d layers, hidden %d; S=%d, layout %s"
        % (
            config.name,
            config.model_value("num_hidden_layers"),
            config.model_value("hidden_size"),
            config.data.max_seq_length,
            config.data.layout,
        ),
        "global batch %d sequences unpacked = micro %d x accumulation %d x replicas %d"
        % (
            config.training.global_batch_sequences,
            config.execution_spec.micro_batch_size,
            config.unpacked_accumulation,
            config.execution_spec.replication_factor,
        ),
        accounting.describe() + " (estimated factor; training uses the dataset's measured one)",
        accounting.describe_passes(),
    ]
    if config.execution_spec.backend == "poptorch":
        lines.append(static_micro_batch_cost(config, accounting))
    from ipu_packing.data.format import mlm_slots
    from ipu_packing.execution import dry_run as dry_run_module

    fine_tuning = config.task.fine_tuning
    report = dry_run_module.dry_run_report(
        config.bert_config(),
        accounting.execution,
        sequences_per_pack=accounting.packing_factor,
        optimizer=config.optimizer.name,
        sequence_length=config.data.max_seq_length,
        # M as `prepare` sizes the packs (the recipe's defaults; a dataset's manifest holds its own)
        mlm_slots=None if fine_tuning else mlm_slots(config.data.max_seq_length,
                                                     config.data.expected_sequences_per_pack),
        task=config.task.name,
    )
    return "\n".join(lines) + "\n" + report.rstrip("\n")


def static_micro_batch_cost(config, accounting) -> str:
    """What the IPU's static micro batch costs a packed step: the passes it runs against the padded layout's, and
    what a micro batch holding the whole replica step would take in activations (the dry run's estimate)."""
    from ipu_packing.execution.dry_run import training_activation_bytes

    ex = accounting.execution
    value_bytes = 2 if ex.precision == "fp16" else 4
    sizes = {k: config.model_value(k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                "num_hidden_layers")}
    from types import SimpleNamespace

    model = SimpleNamespace(**sizes)
    S = config.data.max_seq_length
    micro = training_activation_bytes(model, ex.micro_batch_size, S, value_bytes)
    whole = training_activation_bytes(model, ex.packs_per_replica_step, S, value_bytes)
    return ("static micro batch (IPU): %d packs, ~%.1f sequences at factor %.3f; a packed step runs %d micro batches "
            "of it (the padded layout %d); one micro batch of the replica step's %d packs would hold %.0f MB of "
            "activations against %.0f MB (estimate without recomputation); raise execution.micro_batch_size to run "
            "fewer" % (ex.micro_batch_size, ex.micro_batch_size * accounting.packing_factor, accounting.packing_factor,
                       ex.gradient_accumulation, accounting.unpacked_accumulation, ex.packs_per_replica_step,
                       whole / 1e6, micro / 1e6))


def command(argv: Optional[List[str]], fine_tuning: bool = False) -> int:
    """The command itself: raises UserError; `main` prints it as one line."""
    args = build_parser(fine_tuning).parse_args(argv)
    if args.list_configs:
        print("\n".join(available_configs()))
        return 0
    config = load_config(args.config, args.overrides)
    if config.task.fine_tuning != fine_tuning:
        raise ConfigError("config %s trains %s (task.name=%s): run it with %s" % (
            config.name, config.task.name, config.task.name,
            "run_finetuning.py" if config.task.fine_tuning else "run_pretraining.py"))
    if args.dry_run:
        print(dry_run(config))
        return 0
    from .loop import run

    run(config, log=lambda message: print(message, flush=True))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """run_pretraining.py (the console script ipu-packing-train)."""
    return run_command(command, argv)


def finetune_main(argv: Optional[List[str]] = None) -> int:
    """run_finetuning.py (the console script ipu-packing-finetune)."""
    return run_command(lambda args: command(args, fine_tuning=True), argv)


def dry_run_command(argv: Optional[List[str]]) -> int:
    """``python -m ipu_packing.execution dry-run --config NAME|PATH [section.key=value ...]``: placement, weight
    memory per IPU/stage and batch sizes of a config (no poptorch needed). The same report as
    ``run_pretraining.py --config NAME --dry-run``, through the same loader: the keys accepted, ``base:``, overrides,
    the derived gradient accumulation and the one-line ``error: ...``, exit 2, are the same."""
    parser = ArgumentParser(prog="python -m ipu_packing.execution")
    sub = parser.add_subparsers(dest="command", required=True)
    dry = sub.add_parser("dry-run", help="placement, memory per IPU and batch sizes of a config (no poptorch needed)")
    dry.add_argument("--config", required=True, help="config name in configs/ or a YAML path")
    dry.add_argument("overrides", nargs="*", metavar="section.key=value",
                     help="e.g. data.packing_factor_estimate=2.0 (the packing factor the batch sizes assume)")
    args = parser.parse_args(argv)
    return command(["--config", args.config, "--dry-run"] + list(args.overrides))


def execution_main(argv: Optional[List[str]] = None) -> int:
    """``python -m ipu_packing.execution``."""
    return run_command(dry_run_command, argv)


def dry_run_main(argv: Optional[List[str]] = None) -> int:
    """The ``ipu-packing-dry-run`` console script: ``python -m ipu_packing.execution dry-run ...``."""
    import sys

    return execution_main(["dry-run"] + list(sys.argv[1:] if argv is None else argv))
