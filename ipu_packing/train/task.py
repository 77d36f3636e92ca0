"""Which task a run trains: its config's task (tasks/), with the settings of the dataset it reads.

The loop, the run directory, checkpoints, resume, stopping and metrics are the same for every task (train/); a
task (tasks/recipe.py ``Task``) says what differs: its model class, its step metrics and which of them summarise
the run, whether and how the run is evaluated, and what the export is. ``task_for(config, manifest)`` gives a
run's task from its config and its dataset's manifest, refusing a dataset of another task.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from .. import tasks
from ..errors import UserError
from ..tasks import PRETRAINING, QUESTION_ANSWERING, Task


def task_for(config, manifest: Optional[Dict[str, Any]]) -> Task:
    """The task ``config`` trains on the dataset whose manifest is ``manifest`` (None: no dataset opened, as
    compile-only may run). Refuses (UserError, one line) a dataset of another task than the config's."""
    kind = (manifest or {}).get("task") if manifest is not None else None
    task = tasks.get(config.task.name)
    wanted = task.name
    if not task.fine_tuning:
        if isinstance(kind, dict):
            raise UserError("dataset %s is a %s dataset, but the config trains %s: set task.name=%s"
                            % (config.data.path, kind.get("name"), wanted, kind.get("name")))
        return task
    if manifest is None and not task.dataset_decides_model:
        return task
    if manifest is None:
        raise UserError("task.name=%s needs its prepared dataset (%s) to know its labels: prepare it with "
                        "`python -m ipu_packing.data prepare --task %s ...`" % (wanted, config.data.path, wanted))
    if not isinstance(kind, dict) or kind.get("name") != wanted:
        raise UserError("dataset %s is not a %s dataset (%s): prepare it with `python -m ipu_packing.data prepare "
                        "--task %s ...`" % (config.data.path, wanted, "a %s dataset" % kind.get("name")
                                            if isinstance(kind, dict) else "pretraining data", wanted))
    return task.for_dataset(kind)


def check_labelled(manifest: Dict[str, Any], path: str, use: str) -> None:
    """Refuse (UserError, one line) to train on or evaluate a split without labels (a test split prepared without a
    label column, or a question-answering split without answers): its labels are placeholders, so training would
    learn nothing and an evaluation would score against nothing. ``use`` names the setting that chose it."""
    task = manifest.get("task")
    if not isinstance(task, dict) or task.get("name") not in tasks.TASKS:
        return
    unlabelled = not tasks.TASKS[task["name"]].labelled(task)
    if unlabelled:
        raise UserError("dataset %s (the %s split) has no labels, so it cannot be %s: %s; predict its examples with "
                        "`ipu-packing-predict --model DIR --input FILE --output FILE.jsonl` instead"
                        % (path, task.get("split", "?"), "trained on" if use == "data.split" else "evaluated",
                           "set data.split=train" if use == "data.split"
                           else "set task.eval_split=validation, or task.eval_split= for none"))


__all__ = ["PRETRAINING", "QUESTION_ANSWERING", "Task", "check_labelled", "task_for"]
