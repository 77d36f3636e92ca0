"""Command line for the execution package: ``dry-run`` prints placement, memory and batch sizes for a
config file (sections ``model:`` = transformers.BertConfig fields, ``execution:`` = ExecutionConfig fields;
other sections are ignored here). Bad input: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from .config import ExecutionConfig
from .dry_run import OPTIMIZER_STATES, dry_run_report


class UsageError(Exception):
    pass


def read_sections(path: str, seen=()) -> dict:
    """A config file's sections, with ``base: NAME`` resolved the way the application's loader does it
    (NAME.yaml beside the file; the file's sections update the base's, key by key)."""
    import yaml

    real = os.path.realpath(path)
    if real in seen:
        raise UsageError("config %s extends itself (base cycle)" % path)
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise UsageError("cannot read config %s: %s" % (path, exc.strerror))
    except yaml.YAMLError as exc:
        raise UsageError("config %s is not valid YAML: %s" % (path, " ".join(str(exc).split())))
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise UsageError("config %s must be a mapping with model: and execution: sections" % path)
    base = doc.pop("base", None)
    if base is None:
        return doc
    name = str(base) if str(base).endswith((".yaml", ".yml")) else str(base) + ".yaml"
    merged = read_sections(os.path.join(os.path.dirname(path), name), seen + (real,))
    for key, value in doc.items():
        section = dict(merged.get(key) or {})
        section.update(value or {})
        merged[key] = section
    return merged


def load_sections(path: str):
    """(transformers.BertConfig, ExecutionConfig) from a YAML file's model: and execution: sections."""
    import transformers

    doc = read_sections(path)
    model = doc.get("model") or {}
    execution = doc.get("execution") or {}
    if not isinstance(model, dict) or not isinstance(execution, dict):
        raise UsageError("config %s: model: and execution: must be mappings" % path)
    known = set(ExecutionConfig.__dataclass_fields__)
    unknown = sorted(set(execution) - known)
    if unknown:
        raise UsageError("config %s: unknown execution key(s): %s" % (path, ", ".join(unknown)))
    defaults = transformers.BertConfig().to_dict()
    unknown = sorted(k for k in model if k not in defaults)
    if unknown:
        raise UsageError("config %s: unknown model key(s): %s" % (path, ", ".join(unknown)))
    try:
        return transformers.BertConfig(**model), ExecutionConfig(**execution)
    except (TypeError, ValueError) as exc:
        raise UsageError("config %s: %s" % (path, exc))


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ipu_packing.execution")
    sub = parser.add_subparsers(dest="command", required=True)
    dry = sub.add_parser("dry-run", help="placement, memory per IPU and batch sizes of a config (no poptorch needed)")
    dry.add_argument("--config", required=True, help="YAML file with model: and execution: sections")
    dry.add_argument("--sequences-per-pack", type=float, default=1.0, help="the dataset's packing factor")
    dry.add_argument("--optimizer", default="lamb", choices=sorted(OPTIMIZER_STATES))
    dry.add_argument(
        "--gradient-accumulation",
        type=int,
        default=None,
        help="micro batches per replica step, as run (the application derives it from the global batch; "
        "run_pretraining.py --dry-run does that for you)",
    )
    args = parser.parse_args(argv)
    try:
        model_config, execution = load_sections(args.config)
        if args.gradient_accumulation is not None:
            execution = ExecutionConfig(**dict(vars(execution), gradient_accumulation=args.gradient_accumulation))
        report = dry_run_report(model_config, execution, args.sequences_per_pack, args.optimizer)
    except (UsageError, ValueError) as exc:
        print("error: %s" % exc, file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(report)
