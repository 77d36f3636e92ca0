"""What a task is: the one class each task's module (pretraining.py, sequence_classification.py,
extractive_qa.py) fills in.

A task says everything that differs between training BERT on one kind of data and another: the fields of its
packs and its manifest entry, how its data is prepared, which model head it trains and how that model is split
into pipeline stages, which of the model output's fields are its step metrics, how a run is evaluated and what
serves it. The pack format (data/), the model (model/), the dry run (execution/), the run machinery (train/), the
commands and the benches read a task only through these members; a new task is one module that makes a ``Task``
plus one line in the registry (tasks/__init__.py).

This room sits on the ground floor, so that every floor can read it (tests/test_layout.py): a task declares its
facts as values, and names the code that does its work by where it lives (``hooks``: "module:attribute", as
transformers' auto classes name theirs), which is imported when a floor at or above that code calls it. The
code stays with its floor's owner: the manifest checks with the pack format, the stages with the model, the
evaluation with the run.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

ManifestKeys = Dict[str, Tuple[Any, str]]

TOKEN_FIELDS = ("input_ids", "token_type_ids", "position_ids", "sequence_ids")
"""The (S,) fields every task's packs begin with, in the model's forward order."""

HOOKS = {
    "check_entry": "a manifest `task` entry's values checked on their own (path, entry) -> None (data/format.py)",
    "check_counts": "a manifest's task counts against its sequence counts (path, manifest) -> None (data/format.py)",
    "broken_slots": "(arrays, used, layout) -> (P,) bool: packs whose task slots break an invariant (data/shards.py)",
    "first_broken_slot": "(pack, count, layout) -> the first broken task slot of one pack in words, or None",
    "inspect": "(directory, manifest) -> `inspect`'s lines on the dataset's task (its files read)",
    "check_prepare": "(PrepareConfig) -> None: the task's `prepare` options checked, their defaults filled",
    "prepare": "(PrepareConfig) -> a PrepareResult (pretraining) or a TaskResult (a task's splits)",
    "prepared": "(output, PrepareResult) -> the lines `prepare` prints on what it wrote",
    "hint_options": "(max_seq_length) -> the options the `prepare` command a run suggests adds after --max-seq-length",
    "model": "the packed model class a BertConfig builds (model/)",
    "stages": "(num_layers, layers_per_ipu) -> the model's pipeline parts, without building it (model/stages.py)",
    "check_eval_data": "(path, manifest) -> None: a held-out split checked before the first step",
    "evaluate": "(model, data, task, batch_packs, split) -> {split, examples, loss, metrics} (train/evaluate.py)",
    "predictor": "the class that serves a fine-tuned model of the task (predict.py)",
}
"""Every hook a task may name, with what it is called with and gives."""


@dataclass(frozen=True)
class Task:
    """One task: its registered facts, and the settings of one dataset of it (``for_dataset``)."""

    name: str
    """The task's one name: `prepare --task`, task.name in a run config, a manifest's task entry, a model's TASK,
    logs and summary.json."""
    fields: Tuple[str, ...]
    """Its packs' fields, in the model's forward order (data/format.py describes each)."""
    metrics: Tuple[str, ...]
    """The model output's step metrics, "loss" first (the runner reads these fields of each micro batch's output)."""
    first_metrics: Tuple[str, ...]
    """Metrics whose mean over the first steps summary.json keeps (``first_steps``)."""
    last_metrics: Tuple[str, ...]
    """Metrics whose mean over the last steps summary.json keeps (``last_steps``), and the done line shows."""
    export: str
    """What a run exports to final/: transformers' class of the same modules (config.json ``architectures``)."""
    hooks: Dict[str, str]
    """{hook: "module:attribute"}: the code that does the task's work (HOOKS says each one's call)."""
    labels: Dict[str, str] = field(default_factory=dict)
    """How the done line names a metric (default: the name with "_" as " ")."""
    compared: Tuple[str, ...] = ()
    """The metrics `python -m ipu_packing.compare` reads from two runs' metrics.jsonl and plots."""
    model_settings: Dict[str, Any] = field(default_factory=dict)
    """BertConfig settings the task adds to ``model:`` (a classifier's num_labels, problem_type, label maps)."""
    problem_type: Optional[str] = None
    """A classification dataset's problem type (transformers' names); None for the other tasks."""
    evaluated: bool = False
    """Whether a run is evaluated per example on a held-out split (the ``evaluate`` hook)."""
    unique_ids: str = "example_ids"
    """The (K,) field whose used values appear once in a dataset."""
    presence: str = "example_ids"
    """The (K,) field whose unused slots (its empty value) say which slots hold no sequence."""
    manifest_keys: ManifestKeys = field(default_factory=dict)
    """The keys of a manifest's `task` entry (all required), each with its type(s) and meaning; empty: a dataset of
    this task has no `task` entry (pretraining)."""
    labelled_key: str = ""
    """The `task` entry key that is false (or 0) for a split without labels to train on or score against."""
    companions: Tuple[Tuple[str, str], ...] = ()
    """(name key, sha256 key) of each `task` entry that names a file beside the shards, and its checksum."""
    max_seq_length: int = 128
    """S when `prepare` is not given --max-seq-length."""
    launcher: str = "run_finetuning.py"
    """The script a PopRun launch of this task runs (the dry run prints it)."""
    dataset_decides_model: bool = False
    """Whether its model needs the dataset (a classifier's labels), so compile-only cannot build it without one."""
    inputs: str = ""
    """What `prepare --task NAME` reads, in words (its --help)."""
    prepare_options: Dict[str, Any] = field(default_factory=dict)
    """`prepare`'s options of this task alone, each with its value when not given (PrepareConfig's field names):
    another task refuses them (data/text/pipeline.py ``refuse_other_tasks_options``)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.hooks) - set(HOOKS))
        if unknown:
            raise ValueError("task %s names hooks that do not exist: %s" % (self.name, ", ".join(unknown)))

    # ---- facts derived from the members above

    @property
    def fine_tuning(self) -> bool:
        """Whether a run of this task starts from pretrained weights and reads a task dataset (a `task` entry)."""
        return bool(self.manifest_keys)

    @property
    def has_mlm(self) -> bool:
        """Whether the task predicts masked tokens: an MLM head tied to the word embedding, whose forward keeps
        (M, V) logits (the dry run's memory table)."""
        return "mlm_positions" in self.fields

    def label(self, metric: str) -> str:
        return self.labels.get(metric, metric.replace("_", " "))

    def describe(self, summary: Dict[str, Any]) -> str:
        """"loss 9.7 -> 6.6; MLM accuracy 0.03 -> 0.09; NSP accuracy 0.5": each last metric, from its first-steps
        mean where summary.json keeps one; then the last evaluation's metrics, where there was one."""
        first, last = summary["first_steps"], summary["last_steps"]
        parts = []
        for name in self.last_metrics:
            if name in first:
                parts.append("%s %.3f -> %.3f" % (self.label(name), first[name], last[name]))
            else:
                parts.append("%s %.3f" % (self.label(name), last[name]))
        evaluation = summary.get("evaluation") or {}
        shown = ["%s %s" % (k.replace("_", " "), "%.4f" % v if isinstance(v, float) else v)
                 for k, v in sorted((evaluation.get("metrics") or {}).items()) if k != "loss"]
        if shown:
            parts.append("%s: %s" % (evaluation.get("split", "evaluation"), ", ".join(shown)))
        return "; ".join(parts)

    def labelled(self, entry: Mapping[str, Any]) -> bool:
        """Whether a split (its manifest `task` entry) has labels to train on and score against."""
        return not self.labelled_key or bool(entry.get(self.labelled_key, True))

    def companion_files(self, entry: Mapping[str, Any]) -> List[Tuple[str, str, str, str]]:
        """[(file name, its sha256, the entry keys of both)] of the files beside the shards."""
        return [(entry[name], entry[sha], name, sha) for name, sha in self.companions]

    def for_dataset(self, entry: Optional[Mapping[str, Any]]) -> "Task":
        """This task with the settings of a dataset whose manifest `task` entry is ``entry`` (None: no dataset)."""
        return self

    def replace(self, **changes: Any) -> "Task":
        return dataclasses.replace(self, **changes)

    # ---- the hooks

    def hook(self, name: str) -> Any:
        """The code the task names for ``name`` (HOOKS), imported now; LookupError where it names none."""
        if name not in self.hooks:
            raise LookupError("task %s has no %s hook (%s)" % (self.name, name, HOOKS[name]))
        module, attribute = self.hooks[name].split(":")
        return getattr(importlib.import_module(module), attribute)

    def has_hook(self, name: str) -> bool:
        return name in self.hooks

    def model_class(self) -> type:
        return self.hook("model")

    def stages(self, num_layers: int, layers_per_ipu: Sequence[int] = ()) -> Any:
        return self.hook("stages")(num_layers, layers_per_ipu)

    def evaluate(self, model: Any, data: Any, batch_packs: int, split: str) -> Dict[str, Any]:
        return self.hook("evaluate")(model, data, self, batch_packs, split)


__all__ = ["HOOKS", "ManifestKeys", "TOKEN_FIELDS", "Task"]
