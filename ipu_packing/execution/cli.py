"""Command line for the execution package:

    python -m ipu_packing.execution dry-run --config NAME|PATH [section.key=value ...]

prints placement, weight memory per IPU/stage and batch sizes for a config. It is the same command as
`run_pretraining.py --config NAME --dry-run`: the config goes through the application's one loader
(ipu_packing.train.loader), so the keys accepted, `base:`, overrides, the derived gradient accumulation
(global batch and packing factor estimate) and the one-line `error: ...`, exit 2, are the same.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from ..errors import ArgumentParser, run_command


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(_main, argv)


def dry_run_main(argv: Optional[List[str]] = None) -> int:
    """The `ipu-packing-dry-run` console script: `python -m ipu_packing.execution dry-run ...`."""
    return main(["dry-run"] + list(sys.argv[1:] if argv is None else argv))


def _main(argv: Optional[List[str]]) -> int:
    from ipu_packing.train import cli as train_cli  # train imports execution: import it only when run

    parser = ArgumentParser(prog="python -m ipu_packing.execution")
    sub = parser.add_subparsers(dest="command", required=True)
    dry = sub.add_parser("dry-run", help="placement, memory per IPU and batch sizes of a config (no poptorch needed)")
    dry.add_argument("--config", required=True, help="config name in configs/ or a YAML path")
    dry.add_argument("overrides", nargs="*", metavar="section.key=value",
                     help="e.g. data.packing_factor_estimate=2.0 (the packing factor the batch sizes assume)")
    args = parser.parse_args(argv)
    return train_cli.command(["--config", args.config, "--dry-run"] + list(args.overrides))
