"""The task registry (ipu_packing/tasks/): each task one module, every other module reading tasks through it."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from ipu_packing import tasks
from ipu_packing.tasks.spec import HOOKS, TOKEN_FIELDS, Task

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import house  # noqa: E402  (tests/house.py: the counts docs/architecture.md quotes)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", tasks.NAMES)
def test_every_hook_of_a_task_names_code_that_exists(name):
    task = tasks.get(name)
    for hook in task.hooks:
        module, attribute = task.hooks[hook].split(":")
        assert callable(getattr(importlib.import_module(module), attribute)), (name, hook)


@pytest.mark.parametrize("name", tasks.NAMES)
def test_a_tasks_model_declares_the_task_and_exports_its_architecture(name):
    task = tasks.get(name)
    model = task.model_class()
    assert model.TASK == name
    assert model.HF_ARCHITECTURE == task.export
    assert task.fields[:4] == TOKEN_FIELDS and len(set(task.fields)) == len(task.fields)
    assert task.metrics[0] == "loss" and set(task.first_metrics) | set(task.last_metrics) <= set(task.metrics)


def test_the_pack_format_and_the_run_config_take_their_tasks_from_the_registry():
    from ipu_packing.data import format as fmt
    from ipu_packing.data.text.pipeline import TASKS as PREPARE_TASKS
    from ipu_packing.train.sections import TASKS as RUN_TASKS

    assert fmt.FIELD_SETS == {name: task.fields for name, task in tasks.TASKS.items()}
    assert sorted(fmt.TASK_KEYS) == ["classification", "question_answering"]
    assert PREPARE_TASKS == RUN_TASKS == tasks.NAMES == ("pretraining", "classification", "question_answering")


def test_a_task_that_names_a_hook_nobody_calls_is_refused():
    with pytest.raises(ValueError, match="hooks that do not exist: evaluat"):
        Task(name="x", fields=TOKEN_FIELDS, metrics=("loss",), first_metrics=("loss",), last_metrics=("loss",),
             export="BertModel", hooks={"evaluat": "ipu_packing.train.evaluate:evaluate_examples"})


def test_a_hook_a_task_lacks_is_named_in_one_line():
    with pytest.raises(LookupError, match="task pretraining has no evaluate hook"):
        tasks.PRETRAINING.evaluate(None, None, 1, "validation")
    assert set(HOOKS) >= set().union(*(t.hooks for t in tasks.TASKS.values()))


def test_an_unknown_task_is_one_line_naming_the_choices():
    from ipu_packing.errors import UserError

    with pytest.raises(UserError, match="task 'ner': not one of pretraining, classification, question_answering"):
        tasks.get("ner")


def test_a_served_directory_finds_its_task_by_its_architecture():
    assert tasks.served("BertForQuestionAnswering") is tasks.QUESTION_ANSWERING
    assert tasks.served("BertForSequenceClassification") is tasks.CLASSIFICATION
    assert tasks.served("") is tasks.CLASSIFICATION  # the classifier's loading says what is wrong
    assert tasks.served("BertForPreTraining") is tasks.CLASSIFICATION  # pretraining has no predictor


def test_no_module_outside_the_tasks_spells_a_tasks_name():
    mods = house.modules(REPO)
    assert {name: house.naming(mods, name) for name in house.TASK_NAMES} == {name: [] for name in house.TASK_NAMES}
    assert house.task_lists(mods) == []


def test_the_question_answering_task_is_named_only_by_its_recipe_and_its_model():
    """Its name is no word of the prose, so its text shows where the task reaches: its recipe, its model module
    and the model package's export of it; the CLI help, option refusals, messages and docs elsewhere read the
    registry or say what the recipe says."""
    assert house.mentions(house.modules(REPO), "question_answering") == [
        os.path.join("ipu_packing", *path) for path in (("model", "__init__.py"), ("model", "question_answering.py"),
                                                        ("tasks", "extractive_qa.py"))]


def test_the_name_check_finds_a_branch_on_a_task_name():
    mods = {os.path.join("ipu_packing", "train", "x.py"): 'if task.name == "question_answering":\n    pass\n',
            os.path.join("ipu_packing", "tasks", "y.py"): 'NAME = "question_answering"\n',
            os.path.join("ipu_packing", "train", "z.py"): '"""Docs may say "question_answering"."""\n'}
    assert house.naming(mods, "question_answering") == [os.path.join("ipu_packing", "train", "x.py")]


GIVEN = {"doc_stride": 8, "max_query_length": 8, "sentence1_key": "s1", "sentence2_key": "s2", "label_key": "y",
         "problem_type": "regression"}
"""A value, other than the unset one, for each task's own `prepare` option."""


@pytest.mark.parametrize("owner, other", [(a, b) for a in tasks.NAMES for b in tasks.NAMES
                                          if a != b and tasks.get(a).prepare_options])
def test_a_tasks_own_prepare_options_are_refused_by_every_other_task(owner, other, tmp_path):
    """Each task's recipe names its own `prepare` options; `prepare --task OTHER` refuses every one of them,
    naming the task it belongs to, before anything is read or written."""
    from ipu_packing.data.text.pipeline import PrepareConfig
    from ipu_packing.errors import DataError

    assert set(tasks.get(owner).prepare_options) <= set(GIVEN)
    for name in tasks.get(owner).prepare_options:
        with pytest.raises(DataError) as caught:
            PrepareConfig(input="default", output=str(tmp_path / "out"), task=other, **{name: GIVEN[name]})
        assert str(caught.value).startswith("--%s is an option of --task %s (--task %s reads "
                                            % (name.replace("_", "-"), owner, other)), (name, str(caught.value))
    assert not (tmp_path / "out").exists()
