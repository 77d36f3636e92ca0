"""A finished run is immutable (rule 5): no command rewrites its outputs, whatever is missing from it.

A run directory holds a finished run when any trace of the end is there: summary.json, the export final/,
or a checkpoint at the step count its own config trained to. Such a run is never trained, exported or
summarised again, and nothing in it is written (the run lock included: `plan_run` decides it, and
`execute` returns before taking the lock):

- complete (summary.json, config.json, the last checkpoint, metrics.jsonl where logging.jsonl was on,
  final/ with its config.json and weights where checkpoint.export was on) and asked for again with the
  same fingerprints: "already finished", nothing written, its summary returned;
- anything missing: refused in one line naming what is missing;
- a forced change, or a resume from another run's checkpoint into it: refused in one line.

To start from a finished run, train into another checkpoint.output_dir with checkpoint.init_from set to it.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from . import checkpoint as ckpt
from .. import jsonin
from ..errors import one_line
from ..errors import UserError


def _read_json(path: str) -> Any:
    try:
        with open(path, "r", encoding="utf-8") as f:
            return jsonin.load(f)
    except (OSError, ValueError, RecursionError) as exc:
        raise UserError("run directory %s: %s is unreadable (%s): a finished run is not rewritten"
                        % (os.path.dirname(path), os.path.basename(path), one_line(exc)[:120]))


def _recorded_config(run_dir: str, state) -> Dict[str, Any]:
    if state is not None and isinstance(state.config, dict):
        return state.config
    path = os.path.join(run_dir, "config.json")
    config = _read_json(path) if os.path.isfile(path) else None
    return config if isinstance(config, dict) else {}


def _section(config: Dict[str, Any], name: str) -> Dict[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def check_finished(config, resume_path: Optional[str], resume_state, forced: List[Any]) -> Optional[Dict[str, Any]]:
    """None when config.run_dir holds no finished run; else the run's summary (complete, asked for as it was
    trained), or a UserError (one line) naming what is missing or what would be rewritten."""
    run_dir = config.run_dir
    summary_path, final = os.path.join(run_dir, "summary.json"), os.path.join(run_dir, "final")
    latest = ckpt.latest_checkpoint(run_dir)
    state = resume_state if (latest is not None and resume_path == latest) else (
        ckpt.load_checkpoint(latest) if latest is not None else None)
    recorded = _recorded_config(run_dir, state)
    steps = _section(recorded, "training").get("steps")
    at_end = state is not None and isinstance(steps, int) and int(state.step) >= steps
    if not (os.path.exists(summary_path) or os.path.exists(final) or at_end):
        return None
    summary = _read_json(summary_path) if os.path.isfile(summary_path) else None
    if not isinstance(steps, int):
        steps = summary.get("steps") if isinstance(summary, dict) else None
    missing = []  # type: List[str]
    if summary is None:
        missing.append("summary.json")
    if not os.path.isfile(os.path.join(run_dir, "config.json")):
        missing.append("config.json")
    if not at_end:
        missing.append("its last checkpoint (checkpoints/step_%07d.pt)" % steps if isinstance(steps, int)
                       else "its checkpoints")
    if _section(recorded, "logging").get("jsonl", True) and not os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
        missing.append("metrics.jsonl")
    if _section(recorded, "checkpoint").get("export", True):
        if not os.path.isdir(final):
            missing.append("final/")
        elif not os.path.isfile(os.path.join(final, "config.json")) or not ckpt.is_hf_dir(final):
            missing.append("final/'s config.json or weights")
    where = "run %s finished%s" % (run_dir, " at step %d" % steps if isinstance(steps, int) else "")
    how = ("a finished run is not rewritten: train into another checkpoint.output_dir (checkpoint.init_from=%s "
           "starts from its weights)" % (run_dir,))
    if missing:
        raise UserError("%s but lacks %s; %s" % (where, ", ".join(missing), how))
    if forced or resume_path != latest:
        raise UserError("%s; %s%s" % (where, "checkpoint.resume=force would change %s; " % ", ".join(
            k for k, _, _ in forced) if forced else "checkpoint.resume names another checkpoint; ", how))
    return summary


__all__ = ["check_finished"]
