"""The tasks: each one recipe module, all read through this registry.

    from ipu_packing import tasks
    task = tasks.get("classification")      # a Task (tasks/recipe.py)
    task.fields, task.metrics, task.stages(12), task.hook("prepare")(config), task.evaluate(model, data, 64, "val")

A task is one module that makes a spec.Task (pretraining.py, sequence_classification.py, extractive_qa.py) and one
line in TASKS below; nothing else in the package branches on a task's name.
"""

from __future__ import annotations

from typing import Dict

from ..errors import UserError
from .sequence_classification import CLASSIFICATION
from .pretraining import PRETRAINING
from .extractive_qa import QUESTION_ANSWERING
from .spec import TOKEN_FIELDS, Task

TASKS: Dict[str, Task] = {task.name: task for task in (
    PRETRAINING,
    CLASSIFICATION,
    QUESTION_ANSWERING,
)}
"""Every task by its name, in the order the commands list them."""

NAMES = tuple(TASKS)
"""The tasks' names: `prepare --task` and task.name's choices."""


def served(architecture: str) -> Task:
    """The task whose fine-tuned model a directory of ``architecture`` (config.json's first) holds: the one that
    exports it, and that has a predictor; a directory that names another is served as a classifier, whose loading
    says what is wrong with it."""
    for task in TASKS.values():
        if task.export == architecture and task.has_hook("predictor"):
            return task
    return CLASSIFICATION


def get(name: str) -> Task:
    """The task named ``name`` (UserError, one line, naming the choices)."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise UserError("task %r: not one of %s" % (name, ", ".join(NAMES))) from None


__all__ = ["CLASSIFICATION", "NAMES", "PRETRAINING", "QUESTION_ANSWERING", "TASKS", "TOKEN_FIELDS", "Task", "get",
           "served"]
