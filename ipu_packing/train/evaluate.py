"""Evaluating a fine-tuning run per example: the packed held-out split through the model, back to its examples.

    result = evaluate(model, data, task, batch_packs=64)
    # {"split": "validation", "examples": N, "loss": ..., "metrics": {"accuracy": ..., "f1": ...}}
    # question answering: "examples" counts questions, "metrics": {"exact_match": ..., "f1": ...} (percent)

Every pack of the split runs once, in stored order, in ``eval`` mode without gradients, on the model's device
(a half-precision model is evaluated as a float32 copy on the CPU, where torch has no half kernels). Each used
sequence slot gives its example's logits (``example_ids`` names the example; an empty slot has -1), so every
example of the split is scored exactly once, whichever pack holds it; the metrics are then computed per example
(train/task_metrics.py), as transformers' ``run_glue.py`` computes them on the unpacked split. Evaluation draws
no random number (no dropout, no shuffling), so a run resumed from a checkpoint evaluates and trains bitwise as
an uninterrupted one.

Question answering: every window (feature) is scored once the same way, and data/finetune/answers.py turns the token
logits into each question's best span over its windows (run_qa.py's rule, each window's candidates among its own
context tokens only) and scores the span's text with the official SQuAD v1.1 exact match and F1 against the
question's gold answers from the split's examples file (data/finetune/questions.py, the one reader).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from .run_dir import RunDirectory
from .task_metrics import task_metrics


def scored_batches(model: Any, dataset: Any, batch_packs: int) -> Iterator[Tuple[Dict[str, torch.Tensor], Any, int]]:
    """(batch of n packs (n, ...) on the CPU, the model's output for a batch whose first n rows they are, n) for
    the packs of ``dataset`` in stored order. ``model``: a torch module (run as execution/inference.py's
    TorchInference: eval mode, no gradients, its device; a half-precision one on the CPU as a float32 copy) or an
    inference runner (PopTorch's compiles one batch size, to which the last batch is padded with empty packs, never
    read back). The one loop both tasks' evaluations run."""
    from ..execution.inference import TorchInference

    if isinstance(model, torch.nn.Module):
        params = next(model.parameters())
        if params.device.type == "cpu" and params.dtype in (torch.float16, torch.bfloat16):
            model = _float_copy(model)  # torch has no CPU kernels for several half ops
        model = TorchInference(model)
    per_call = model.packs_per_call or batch_packs
    for start in range(0, len(dataset), per_call):
        stop = min(len(dataset), start + per_call)
        if hasattr(dataset, "rows"):  # packs held in memory (predict.Packs): one slice per field, no per-pack copy
            batch = dataset.rows(start, stop)
        else:
            rows = [dataset[i] for i in range(start, stop)]
            batch = {k: torch.stack([torch.as_tensor(r[k]) for r in rows]) for k in rows[0]}  # (B, ...)
        n = stop - start
        padded = batch
        if model.packs_per_call and n < per_call:  # empty packs: every slot unused, never read back
            padded = {k: torch.cat([v, torch.full((per_call - n,) + tuple(v.shape[1:]), -1 if k == "example_ids"
                                                  else 0, dtype=v.dtype)])
                      for k, v in batch.items()}
        yield batch, model(padded), n


def collect(model: Any, dataset: Any, batch_packs: int) -> Dict[str, np.ndarray]:
    """Run every pack of ``dataset`` through ``model`` (a torch module, or an inference runner of
    execution/inference.py: PopTorch's compiles one batch size, to which the last batch is padded with empty
    packs); returns {"example_ids": (N,), "logits": (N, L), "labels": (N,) or (N, L), "loss_sum": (), "count": ()}
    over the used slots, in example order."""
    ids: List[np.ndarray] = []
    logits: List[np.ndarray] = []
    labels: List[np.ndarray] = []
    loss_sum, count = 0.0, 0.0
    for batch, out, n in scored_batches(model, dataset, batch_packs):
        used = batch["example_ids"] >= 0  # (n, K)
        ids.append(batch["example_ids"][used].numpy())
        logits.append(out.logits[:n].float().cpu()[used].numpy())
        labels.append(batch["labels"][used].numpy())
        if out.loss is not None:
            loss_sum += float(out.loss) * float(out.count)
            count += float(out.count)
    example_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    order = np.argsort(example_ids, kind="stable")
    return {"example_ids": example_ids[order], "logits": np.concatenate(logits)[order] if logits else np.zeros((0, 1)),
            "labels": np.concatenate(labels)[order] if labels else np.zeros(0), "loss_sum": loss_sum, "count": count}


QUESTION_FIELDS = ("sequence_ids", "cls_positions", "example_ids", "feature_ids", "offsets")
"""The pack fields question-answering post-processing reads besides the logits (data/finetune/answers.py)."""


def collect_answers(model: Any, dataset: Any, batch_packs: int, search: Any) -> Tuple[float, float]:
    """Run every pack of a question-answering ``dataset`` through ``model`` (as ``collect``), each window's
    candidate spans into ``search`` (data/finetune/answers.py AnswerSearch) from the token logits (B, S); returns
    (loss summed over the start and end labels, their count)."""
    loss_sum, count = 0.0, 0.0
    for batch, out, n in scored_batches(model, dataset, batch_packs):
        search.add(out.token_start_logits[:n].float().cpu().numpy(), out.token_end_logits[:n].float().cpu().numpy(),
                   {k: batch[k].numpy() for k in QUESTION_FIELDS})
        if out.loss is not None:
            loss_sum += float(out.start_loss) * float(out.start_count) + float(out.end_loss) * float(out.end_count)
            count += float(out.start_count) + float(out.end_count)
    return loss_sum, count


def _float_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float32 twin of a half-precision task model, by its state dict: a model placed for PopTorch holds
    hooks and module references that deepcopy cannot copy. Building the twin initialises weights, so the
    random state is put back afterwards: evaluation draws no random number."""
    with torch.random.fork_rng(devices=[]):
        twin = type(model)(model.config, attention=model.attention_implementation)
    twin.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    return twin


def evaluate(model: torch.nn.Module, data: Any, task: Any, batch_packs: int, split: str) -> Dict[str, Any]:
    """The evaluation of ``model`` on ``data`` (a TrainingData of the task's ``split``): per-example metrics of
    ``task``'s problem type (question answering: SQuAD v1.1 exact match and F1 per question), the mean loss per
    labelled sequence (per start and end label), how many examples were scored."""
    return task.evaluate(model, data, batch_packs, split)


def evaluate_examples(model: torch.nn.Module, data: Any, task: Any, batch_packs: int, split: str) -> Dict[str, Any]:
    """Classification: every example of the split scored once, the metrics of ``task``'s problem type per
    example."""
    got = collect(model, data.dataset, batch_packs)
    num_labels = int(task.model_settings["num_labels"])
    duplicated = len(got["example_ids"]) - len(np.unique(got["example_ids"]))
    if duplicated:  # the format's invariants forbid it; a check here costs nothing
        raise ValueError("%d examples of %s were scored twice" % (duplicated, data.path))
    metrics = task_metrics(task.problem_type, got["logits"], got["labels"], num_labels)
    return {"split": split, "examples": int(len(got["example_ids"])),
            "loss": got["loss_sum"] / got["count"] if got["count"] else None, "metrics": metrics}


def evaluate_questions(model: Any, data: Any, task: Any, batch_packs: int, split: str) -> Dict[str, Any]:
    """Question answering: every window of the split scored once, each question's best span over its windows as
    run_qa.py chooses it, its text cut from the context (the split's examples file), exact match and F1 as the
    official SQuAD v1.1 script computes them, in percent."""
    from ..data.finetune.answers import AnswerSearch, squad_metrics
    from ..data.finetune.questions import read_examples

    examples = read_examples(data.path, data.manifest)
    search = AnswerSearch()
    loss_sum, count = collect_answers(model, data.dataset, batch_packs, search)
    predictions = search.predictions([e.context for e in examples])
    metrics = squad_metrics({e.id: predictions[i].text for i, e in enumerate(examples)},
                            {e.id: e.answer_texts for e in examples if e.answer_texts})
    return {"split": split, "examples": len(examples), "loss": loss_sum / count if count else None,
            "metrics": metrics}


__all__ = ["QUESTION_FIELDS", "collect", "collect_answers", "evaluate", "evaluate_questions", "scored_batches"]


class Validator:
    """A fine-tuning run's evaluation on its held-out split, as the loop sees it: due after a host call every
    task.eval_every_steps and at the last step; appended to eval.jsonl with one log line; run first on a resumed
    run whose checkpoint's evaluation eval.jsonl lacks; and the final one for the summary. A run without a held-out
    split (pretraining, or task.eval_split empty) has a Validator that is never due."""

    def __init__(self, plan) -> None:
        self.plan = plan
        self.data = plan.eval_data
        self.every = plan.config.task.eval_every_steps
        self.total = plan.config.training.steps
        self.calls = plan.accounting.execution.optimizer_steps_per_call

    def due(self, step: int) -> bool:
        """Whether the host call that ended at ``step`` crosses a multiple of task.eval_every_steps or ends the
        run."""
        if self.data is None:
            return False
        return step >= self.total or bool(self.every and step // self.every > (step - self.calls) // self.every)

    def run(self, runner, step: int, log) -> Optional[Dict[str, Any]]:
        """Evaluate the model as it is after ``step`` on the writer (every process syncs the model first: a
        collective on a pipeline); the record goes to eval.jsonl."""
        plan = self.plan
        runner.sync_model()
        if not runner.is_writer:
            return None
        result = evaluate(runner.model, self.data, plan.task, plan.config.task.eval_batch_packs,
                          plan.config.task.eval_split)
        record = dict(result, step=step)
        plan.run_dir.append_evaluation(record)
        log("evaluation at step %d on %s (%d examples): %s" % (step, result["split"], result["examples"], ", ".join(
            "%s %s" % (k, "%.4f" % v if isinstance(v, float) else v) for k, v in sorted(result["metrics"].items()))))
        return record

    def resume(self, runner, step: int, log) -> None:
        """A resumed run whose checkpoint's step was due an evaluation that eval.jsonl lacks (the run was stopped
        during it, by a second signal or a kill) evaluates first. Every process agrees (``runner.agree``: the
        writer decides from eval.jsonl), since evaluating syncs the model on all of them."""
        if self.plan.resume_state is None or not self.due(step):
            return
        missing = runner.is_writer and not any(r.get("step") == step for r in self._records())
        if runner.agree(int(missing)):
            log("the evaluation after step %d is missing from %s (the run was stopped during it): running it first"
                % (step, RunDirectory.EVAL))
            self.run(runner, step, log)

    def final(self, runner, log) -> Optional[Dict[str, Any]]:
        """The last step's evaluation for summary.json: eval.jsonl's, or run now (a run resumed at its last
        step); None without a held-out split, and on the processes that do not write."""
        if self.data is None:
            return None
        done = [r for r in self._records() if r.get("step") == self.total]
        final = done[-1] if done else self.run(runner, self.total, log)
        return None if final is None else {k: final[k] for k in ("split", "step", "examples", "loss", "metrics")}

    def _records(self) -> List[Dict[str, Any]]:
        return self.plan.run_dir.read_metrics(RunDirectory.EVAL)
