"""The run directory, owned once: its layout, its lock, its checkpoints, resume, finished runs and the export.

    RUN/config.json                       the config as run (written before the first step)
    RUN/metrics.jsonl                     one StepRecord a line (train/metrics.py)
    RUN/eval.jsonl                        a fine-tuning run's evaluations, one a line (train/evaluate.py)
    RUN/tensorboard/                      TensorBoard event files
    RUN/checkpoints/step_NNNNNNN.pt       TrainingState (train/state.py), the newest ``checkpoint.keep`` kept
    RUN/final/                            the Hugging Face export (``checkpoint.export``)
    RUN/summary.json                      written last: its presence is what "finished" means
    RUN/run.lock                          held by the process that trains in the directory
    RUN/forced_changes.jsonl              what each ``checkpoint.resume=force`` changed, one line each
    RUN/config.before_step_NNNNNNN.json   the config a forced resume replaced
    RUN/.instances/                       where PopRun instances without horovod meet (execution/poprun_group.py)

``RunDirectory`` is the only code that spells these names. What it guarantees:

- Only its own directory is written (`check_target`, before any work, by fsutil.check_output's rule): the
  directory is absent, empty, or a run directory this program made (`made_here`: it holds run.lock or
  checkpoints/, and no name outside the layout above). A model directory, a directory of the user's files, a
  file, a symlink, or a directory that is or holds the dataset or model the run reads is refused in one line,
  and nothing in it is touched.
- One run per directory: an advisory ``flock`` on run.lock for as long as the run lives (the kernel drops it
  when its holder exits for any reason, SIGKILL included), opened without following a symlink. The file holds
  the holder's pid and host, so a second run is refused naming them.
- Checkpoints are written atomically (temporary file, fsync, rename, fsync of the directory): a kill leaves the
  old set or the new one, never a torn file; a state holding inf or NaN is never written. Reading goes through
  ``TrainingState.load`` (no code runs; every field checked).
- Resume (`resume_point`): ``checkpoint.resume`` auto (the latest), force (the same, taking the new values),
  never, or a checkpoint path; what the checkpoint records is compared with the run (train/fingerprint.py).
- A finished run is immutable (`finished`): with summary.json present, nothing is trained, exported or
  written, the lock included; a run missing any other trace of its end is refused naming what is missing.
  A run stopped during its export (its last checkpoint written, no summary.json) is not finished: the same
  command resumes it at its last step, which exports and writes the summary, so its result can always be
  produced.
- A finished run is never the target of a forced change or of another run's checkpoint: to start from it,
  train into another directory with ``checkpoint.init_from`` set to it.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from typing import Any, Callable, Dict, List, Optional, Sequence

from .. import jsonin, jsonout
from ..errors import UserError, one_line
from ..fsutil import (LockBusy, atomic_write_text, atomic_write_with, check_output, fsync_directory, open_regular,
                      publish_directory, release_lock, remove_stale_temporaries, take_lock)
from .fingerprint import Difference, describe

_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


class RunDirectoryInUse(UserError):
    """Another live process holds the run directory."""


class NonFiniteState(UserError):
    """The state to save holds inf or NaN (the run diverged): it is not written."""


class RunDirectory:
    """``RunDirectory(path)``: the files of one training run (see the module docstring for the layout)."""

    CONFIG = "config.json"
    METRICS = "metrics.jsonl"
    EVAL = "eval.jsonl"
    TENSORBOARD = "tensorboard"
    CHECKPOINTS = "checkpoints"
    FINAL = "final"
    SUMMARY = "summary.json"
    LOCK = "run.lock"
    FORCED = "forced_changes.jsonl"
    INSTANCES = ".instances"

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock_fd = None  # type: Optional[int]

    _OWN_NAME = re.compile(r"^(config\.json|metrics\.jsonl|eval\.jsonl|tensorboard|checkpoints|final|final\.old|"
                           r"summary\.json|run\.lock|forced_changes\.jsonl|config\.before_step_\d+\.json|"
                           r"\..+\.tmp|\.final\..+|\.instances)$")
    """Every name a run directory holds (the layout above, with the temporaries of its atomic writes)."""

    @classmethod
    def made_here(cls, path: str) -> bool:
        """Whether the directory ``path`` is a run directory this program made: its run.lock (taken before
        anything else is written), its checkpoints/ or the PopRun instances' meeting place, and no name outside the
        layout."""
        try:
            names = os.listdir(path)
        except OSError:
            return False
        marked = bool({cls.LOCK, cls.CHECKPOINTS, cls.INSTANCES} & set(names))
        return marked and all(cls._OWN_NAME.match(name) for name in names)

    def check_target(self, reading: Sequence[str] = ()) -> None:
        """Refuse (UserError, one line) a directory this run must not write into (fsutil.check_output: the rule of
        every output): ``reading``, the dataset and model directories the run reads."""
        check_output(self.path, "checkpoint.output_dir", directory=True, reading=reading, ours=self.made_here,
                     error=UserError)

    def file(self, name: str) -> str:
        """The path of one of the names above inside the directory."""
        return os.path.join(self.path, name)

    @staticmethod
    def checkpoint_name(step: int) -> str:
        """The file name of step ``step``'s checkpoint in CHECKPOINTS."""
        return "step_%07d.pt" % int(step)

    # ---- checkpoints -------------------------------------------------------------------------------------------

    def checkpoints(self) -> List[str]:
        """Step checkpoints, oldest first."""
        directory = self.file(self.CHECKPOINTS)
        if not os.path.isdir(directory):
            return []
        found = []
        for name in os.listdir(directory):
            match = _STEP_FILE.match(name)
            if match:
                found.append((int(match.group(1)), os.path.join(directory, name)))
        return [path for _, path in sorted(found)]

    def latest(self) -> Optional[str]:
        found = self.checkpoints()
        return found[-1] if found else None

    def checkpoint_path(self, step: int) -> str:
        """Where the checkpoint of ``step`` is written (checkpoints/step_<step>.pt)."""
        return os.path.join(self.file(self.CHECKPOINTS), self.checkpoint_name(step))

    def save(self, state, keep: int) -> str:
        """Write ``state`` (a TrainingState) as step_<step>.pt atomically, then delete all but the newest ``keep``.
        Raises NonFiniteState, writing nothing, if a model or optimizer tensor is not finite."""
        import torch  # here: reading a run directory (compare) needs no torch

        from .state import non_finite_tensors

        bad = non_finite_tensors({"model": state.model, "optimizer": state.optimizer})
        if bad:
            raise NonFiniteState("step %d: %d tensors hold inf or NaN (first: %s)"
                                 % (int(state.step), len(bad), bad[0]))
        directory = self.file(self.CHECKPOINTS)
        path = self.checkpoint_path(state.step)
        atomic_write_with(path, lambda f: torch.save(state.to_dict(), f))  # refused: one line, nothing left
        for old in self.checkpoints()[:-keep]:
            os.unlink(old)
        fsync_directory(directory)
        return path

    def resume_point(self, mode: str) -> Optional[str]:
        """The checkpoint ``checkpoint.resume=mode`` continues from, or None (a fresh start)."""
        latest = self.latest()
        if mode in ("auto", "force"):
            return latest
        if mode == "never":
            if latest is not None:
                raise UserError("run directory %s already has checkpoints (%s); use checkpoint.resume=auto or another "
                                "checkpoint.output_dir" % (self.path, os.path.basename(latest)))
            return None
        if os.path.isdir(mode):
            found = RunDirectory(mode).latest()
            if found is None:
                raise UserError("checkpoint.resume: %s holds no checkpoints" % (mode,))
            return found
        if not os.path.isfile(mode):
            raise UserError("checkpoint.resume: %s is neither auto, never, nor an existing checkpoint" % (mode,))
        return mode

    # ---- finished runs ---------------------------------------------------------------------------------------

    def finished(self, recorded: Optional[Dict[str, Any]], resume_path: Optional[str],
                 forced: List[Difference], export: bool = False) -> Optional[Dict[str, Any]]:
        """The summary of the finished run this directory holds, asked for again as it was trained (then
        nothing may be written); None when it holds no finished run. Raises UserError (one line) for a finished
        run missing a trace of its end, and for a forced change or another run's checkpoint aimed at it.
        ``recorded``: the config its latest checkpoint records; ``resume_path``: the checkpoint this run would
        resume from; ``export``: whether this run exports (a run finished without an export, asked for one, is not
        finished: resumed at its last step, it trains nothing and exports, as a run stopped during its export)."""
        latest = self.latest()
        if recorded is None:
            recorded = self._read_json(self.CONFIG) if os.path.isfile(self.file(self.CONFIG)) else None
        recorded = recorded if isinstance(recorded, dict) else {}
        steps = _section(recorded, "training").get("steps")
        summary = self._read_json(self.SUMMARY) if os.path.exists(self.file(self.SUMMARY)) else None
        final_exists = os.path.exists(self.file(self.FINAL))
        if summary is None and not final_exists:
            return None  # not finished, or stopped during its export: resuming at the last step completes it
        if not isinstance(steps, int):
            steps = summary.get("steps") if isinstance(summary, dict) else None
        at_end = latest is not None and isinstance(steps, int) and _step_of(latest) >= steps
        if summary is None and at_end:
            return None  # killed between the export and summary.json: the export is redone, then the summary
        if export and at_end and not final_exists and not _section(recorded, "checkpoint").get("export", True):
            return None  # trained with checkpoint.export=false, now asked for the export: it is made, nothing else
        missing = []  # type: List[str]
        if summary is None:
            missing.append(self.SUMMARY)
        if not os.path.isfile(self.file(self.CONFIG)):
            missing.append(self.CONFIG)
        if not at_end:
            missing.append("its last checkpoint (%s/%s)" % (self.CHECKPOINTS, self.checkpoint_name(steps))
                           if isinstance(steps, int) else "its checkpoints")
        if _section(recorded, "logging").get("jsonl", True) and not os.path.isfile(self.file(self.METRICS)):
            missing.append(self.METRICS)
        if _section(recorded, "checkpoint").get("export", True):
            from ..model.pretrained import is_hf_dir  # the owner of the Hugging Face file names (imports torch)

            if not final_exists:
                missing.append(self.FINAL + "/")
            elif not is_hf_dir(self.file(self.FINAL)):
                missing.append("%s/'s config.json or weights" % (self.FINAL,))
        where = "run %s finished%s" % (self.path, " at step %d" % steps if isinstance(steps, int) else "")
        how = ("a finished run is not rewritten: train into another checkpoint.output_dir (checkpoint.init_from=%s "
               "starts from its weights)" % (self.path,))
        if missing:
            raise UserError("%s but lacks %s; %s" % (where, ", ".join(missing), how))
        if forced or resume_path != latest:
            raise UserError("%s; %s%s" % (where, "checkpoint.resume=force would change %s; " % ", ".join(
                k for k, _, _ in forced) if forced else "checkpoint.resume names another checkpoint; ", how))
        return summary

    def _read_json(self, name: str) -> Any:
        path = self.file(name)
        try:
            return jsonin.load_path(path, error=UserError)
        except (OSError, ValueError, RecursionError) as exc:
            raise UserError("run directory %s: %s is unreadable (%s): a finished run is not rewritten"
                            % (self.path, name, one_line(exc)[:120]))

    # ---- the lock ----------------------------------------------------------------------------------------------

    def lock(self) -> None:
        """Take run.lock (creating the directory); RunDirectoryInUse (one line, naming the holder) when another
        live process holds it. A lock file left by a killed run is stale by construction and taken over."""
        os.makedirs(self.path, exist_ok=True)
        path = self.file(self.LOCK)
        try:
            self._lock_fd = take_lock(path, UserError)  # fsutil's one lock: never through a symlink
        except LockBusy as busy:
            raise RunDirectoryInUse("run directory %s is in use by %s (lock %s): wait for it, or choose another "
                                    "directory" % (self.path, busy.holder, path))

    def unlock(self) -> None:
        if self._lock_fd is None:
            return
        fd, self._lock_fd = self._lock_fd, None
        release_lock(fd)  # the file emptied: it reads as "nobody"

    @property
    def locked(self) -> bool:
        return self._lock_fd is not None

    # ---- the writer's files ------------------------------------------------------------------------------------

    def prepare(self, config: Dict[str, Any], resumed_step: Optional[int], log: Callable[[str], None]) -> None:
        """Before the first step (under the lock): stale temporaries gone, config.json written, metrics.jsonl cut
        back to the checkpoint's step (a torn last line dropped, in one line) or, on a fresh start, removed."""
        os.makedirs(self.path, exist_ok=True)
        remove_stale_temporaries(self.path)
        remove_stale_temporaries(self.file(self.CHECKPOINTS))
        atomic_write_text(self.file(self.CONFIG), json.dumps(config, indent=2, sort_keys=True) + "\n")
        for name in (self.METRICS, self.EVAL):
            if resumed_step is not None:
                from .metrics import repair_jsonl

                repair_jsonl(self.file(name), resumed_step, log)
            elif os.path.exists(self.file(name)):
                os.unlink(self.file(name))

    def record_forced(self, step: int, checkpoint: Optional[str], old_config: Dict[str, Any],
                      differences: List[Difference]) -> str:
        """A forced resume's trace: the checkpoint's config as config.before_step_N.json, and one line appended to
        forced_changes.jsonl (step, time, checkpoint, each key's old and new value). Returns the line to log."""
        before = self.file("config.before_step_%07d.json" % step)
        atomic_write_text(before, json.dumps(old_config, indent=2, sort_keys=True) + "\n")
        path = self.file(self.FORCED)
        previous = ""
        if os.path.lexists(path):
            with open_regular(path, "r", encoding="utf-8", error=UserError) as f:
                previous = f.read()
            if previous and not previous.endswith("\n"):
                previous += "\n"
        record = {"step": int(step), "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "checkpoint": checkpoint, "changes": {k: {"old": old, "new": new} for k, old, new in differences}}
        atomic_write_text(path, previous + jsonout.jsonl_text([record], default=str))
        return ("checkpoint.resume=force: continuing from step %d with %s (recorded in %s; the old config is in %s)"
                % (step, describe(differences), path, before))

    def append_evaluation(self, record: Dict[str, Any]) -> None:
        """One evaluation's line at the end of eval.jsonl (flushed: a kill leaves the lines before it whole)."""
        with open(self.file(self.EVAL), "a", encoding="utf-8") as f:
            f.write(jsonout.jsonl_text([record]))

    def read_metrics(self, name: str = METRICS) -> List[Dict[str, Any]]:
        """The records of metrics.jsonl, or of eval.jsonl (none when it is absent)."""
        path = self.file(name)
        if not os.path.lexists(path):
            return []
        with open_regular(path, "rb", error=UserError) as f:
            text = f.read().decode("utf-8")
        return [jsonin.loads(line) for _, line in jsonin.jsonl_lines(text)]

    def export(self, save: Callable[[str], None]) -> str:
        """final/, written whole by ``save(directory)`` into a temporary directory (umask applied) and renamed into
        place: a kill leaves the old export or the new one. What an export killed midway left beside it (its
        temporary .final.*, the final.old it was swapping out) is removed first: under the lock, nobody's but
        ours."""
        import shutil

        directory = self.file(self.FINAL)
        for name in os.listdir(self.path):
            if name.startswith("." + self.FINAL + ".") or name == self.FINAL + ".old":
                shutil.rmtree(self.file(name))
        publish_directory(directory, save, "." + self.FINAL + ".", replace=True)  # fsutil's one publish
        return directory

    def write_summary(self, summary: Dict[str, Any]) -> None:
        """summary.json, last of all: from here on the run is finished."""
        atomic_write_text(self.file(self.SUMMARY), jsonout.dumps(summary, indent=2, sort_keys=True) + "\n")


def _step_of(path: str) -> int:
    match = _STEP_FILE.match(os.path.basename(path))
    return int(match.group(1)) if match else -1


def _section(config: Dict[str, Any], name: str) -> Dict[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}


__all__ = ["NonFiniteState", "RunDirectory", "RunDirectoryInUse"]
