"""Packed inference for sequence classification and extractive question answering: texts (or pairs) in, each
one's labels and scores out; or questions on contexts in, each one's answer out; in input order.

    python -m ipu_packing.predict --model DIR --input FILE --output FILE.jsonl [--max-seq-length 128]
        [--max-sequences-per-pack 32] [--sentence1-key X] [--sentence2-key Y] [--device cpu|cuda]

    from ipu_packing.predict import Predictor
    predictor = Predictor.from_pretrained("output/runs/finetune_demo/final")
    predictor.predict(["a text", "another text", ...])          # or pairs: [("a text", "its pair"), ...]
    # [{"index": 0, "label": "mail", "score": 0.93, "scores": {"concurrency": 0.01, ...}}, ...]

``DIR`` is any transformers BERT classifier directory (BertForSequenceClassification: this project's fine-tuning
export, or one transformers saved) with its tokenizer (tokenizer.json and/or vocab.txt, read with
tokenizer_config.json's options as transformers reads them; a tokenizer larger than the model's embeddings is
refused in one line naming both sizes, a smaller one said on stderr). The inputs are read as
``prepare --task`` reads a split (CSV, TSV, JSON Lines; Parquet and datasets directories with the datasets
extra; run_glue.py's columns, a label column ignored), tokenized with the model's own tokenizer as transformers'
``BertTokenizerFast(a, b, truncation=True, max_length=S)`` does, packed by the planner (LPFHP: SERVING_PLANNER) into
the one pack format (K sequences per pack, up to 32 at short S), run through the packed model in eval mode, and
unpacked back to input order by each sequence's example id. The scores are what transformers'
``text-classification`` pipeline returns for each input alone (its ``top_k=None`` scores): a softmax over the
labels for single-label classification, a sigmoid for multi-label (and for a single output without a problem type),
the raw output for regression. One JSON object per input in the output file, in input order.

Question answering (``DIR`` a BertForQuestionAnswering directory: this project's question-answering export, or one
transformers saved; chosen by its config.json's architectures):

    python -m ipu_packing.predict --model DIR --input FILE --output FILE.jsonl [--max-seq-length 384]
        [--doc-stride 128] [--max-query-length 64]
    # one {"id": ..., "prediction_text": ...} per question, in input order

The input is SQuAD v1.1 JSON, or JSON Lines (Parquet, datasets) with run_qa.py's columns id, question and context
(answers, when present, are ignored: neither read nor checked), read and checked by data/finetune/questions.py as
``prepare`` reads a question-answering split; each question + context is cut into windows exactly as
prepare cuts them (data/finetune/windows.py: run_qa.py's BertTokenizerFast call, questions over max_query_length tokens
cut at a word boundary), the windows packed by the same planner and pack builder, scored by the same loop as the
evaluation (train/evaluate.collect_answers), and each question's answer chosen by data/finetune/answers.py (run_qa.py's
n-best rule per window among its own context tokens, the best span over the question's windows, its text cut from
the context).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import tasks
from .errors import ArgumentParser, UserError, run_command

Text = Union[str, Tuple[str, str]]
"""One input: a text, or a (text, pair) tuple."""


SERVING_PLANNER = "lpfhp"
"""The planner ``Predictor.packs`` packs a request with: the plan changes how many packs run, never a score. LPFHP
makes as many packs as ``optimal`` on the demo task's 1,024 texts at S=128, K=32 (158) in a fifth of the time (10
against 54 ms: python -m ipu_packing.bench --classifier DIR, docs/finetuning.md, Serving packed)."""


SERVING_CALL_BYTES = 2 ** 20
"""Serving on CPU: packs per forward pass, unless given, are as many as keep one call's feed-forward activation
(packs x S x intermediate_size, fp32) within 1 MiB, or within one encoder layer's weights where those are larger:
a small model's layer then runs in a core's cache, and a large one's weights are read once for enough tokens.
Measured on the 2-core Xeon this project runs on (4 MiB of L2 a core), one thread, calls back to back
(``python tests/serving_calls.py MODEL``; docs/results.md, the peer table): the demo classifier (intermediate 256,
S=128) served the demo's 1,024 pair inputs at 6,563 sequences/s in calls of 8 packs, 6,825 in 16 and 4,902 in 32;
the tiny and small presets were fastest at 4 packs, BERT-Base at 8 (35.8 sequences/s, against 29.4 at 1, 34.1
at 16 and 32.9 at 32)."""


def packs_per_call(config: Any, max_seq_length: int, device: str) -> int:
    """The default packs per forward pass of a model with ``config`` (hidden and intermediate sizes) at S on
    ``device``: on CPU as SERVING_CALL_BYTES says (1 to 64), on CUDA 64."""
    if device != "cpu":
        return 64
    hidden, intermediate = int(config.hidden_size), int(config.intermediate_size)
    layer_weights = 4 * (4 * hidden * hidden + 2 * hidden * intermediate)  # fp32 bytes: q, k, v, output, FFN
    per_pack = max_seq_length * intermediate * 4
    return max(1, min(64, max(SERVING_CALL_BYTES, layer_weights) // per_pack))


def _load_served(model_class: Any, kind: str, directory: str, max_seq_length: int, max_sequences_per_pack: int,
                 batch_packs: Optional[int], device: str, attention: Optional[str],
                 execution: Any) -> Tuple[Any, Any, int]:
    """(model, tokenizer, packs a call) of a served model directory (``model_class``, a packed task model; ``kind``
    names it in messages): its weights, strictly, and its tokenizer, both checked; on ``device``, or as
    ``execution`` (an ExecutionConfig) says; attention: the fastest exact one for S there (train/model_section.py
    resolve_attention), unless given; packs a call: packs_per_call, unless given."""
    import warnings

    import torch

    from .data.vocab import load_tokenizer

    if not os.path.isdir(directory):
        raise UserError("--model %s is not a directory (a Hugging Face %s: config.json, weights, tokenizer)"
                        % (directory, kind))
    if not 1 <= max_sequences_per_pack <= 255:
        raise UserError("--max-sequences-per-pack must be in [1, 255], got %d" % (max_sequences_per_pack,))
    tokenizer = load_tokenizer(directory)
    if execution is not None:
        device = execution.device if execution.backend == "torch" else "cpu"
    if attention is None:
        attention = _fastest_attention(device, max_seq_length, execution)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a served directory holds every weight its model needs
        try:
            model = model_class.from_pretrained(directory, attention=attention, strict=True)
        except (OSError, ValueError, KeyError) as exc:
            raise UserError("--model %s is not a %s directory (%s)" % (directory, kind, exc))
    _check_tokenizer_size(tokenizer, model, directory)
    if max_seq_length > int(model.config.max_position_embeddings):
        raise UserError("--max-seq-length %d exceeds the model's max_position_embeddings %d"
                        % (max_seq_length, model.config.max_position_embeddings))
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA device")
    check_finite_weights(model, directory)
    model.to(torch.device(device)).eval()
    if batch_packs is None:
        batch_packs = packs_per_call(model.config, max_seq_length, device)
    return model, tokenizer, batch_packs


def _build_packs(instances: Any, lengths: np.ndarray, S: int, K: int, planner: str, cls_id: int, fields: Any,
                 num_sequences: int) -> "Packs":
    """``instances`` packed by ``planner`` and the writer's pack builder into Packs of the one format, with the
    field layout ``fields`` (data/format.py FieldLayout)."""
    from .data.format import as_batch
    from .data.instance_files import gather_instances
    from .data.write.packs import PackLayout, build_packs
    from .packing import assign_sequences, histogram_from_lengths, plan_packing

    plan = plan_packing(histogram_from_lengths(lengths, S), S, K, planner)
    assignment = assign_sequences(plan, lengths, 0)
    layout = PackLayout(S, K, 0, None, cls_id, fields, num_sequences=num_sequences)
    order = np.asarray(assignment.indices, dtype=np.int64)
    records = build_packs(gather_instances(instances, order), np.asarray(assignment.offsets, np.int64), layout)
    return Packs(as_batch(records, None))


class _Served:
    """What a served model's class (Predictor, QuestionAnswerer) shares: where its forward passes run."""

    model: Any
    execution: Any

    def runnable(self) -> Any:
        """The model, or its inference executable where ``execution`` says (compiled once, PopTorch, then reused)."""
        from .execution.inference import make_inference

        if self.execution is None:
            return self.model
        if getattr(self, "_infer", None) is None:
            self._infer = make_inference(self.model, self.execution)
        return self._infer


@dataclass
class Predictor(_Served):
    """A packed classifier and its tokenizer (``from_pretrained``), ready to score texts."""

    model: Any
    """PackedBertForSequenceClassification, in eval mode on its device."""
    tokenizer: Any
    """data/vocab.py TokenizerSpec of the model's directory."""
    max_seq_length: int = 128
    """S: tokens per pack (a longer input is truncated, as transformers truncates to max_length)."""
    max_sequences_per_pack: int = 32
    """K: sequences per pack (the planner packs fewer where lengths do not allow more)."""
    batch_packs: int = 64
    """Packs per forward pass (``from_pretrained``: packs_per_call unless given; PopTorch: the compiled batch, micro
    batch x device iterations x replicas)."""
    execution: Any = None
    """An ExecutionConfig: where the model runs (None: torch on ``device``); with backend poptorch, on IPUs through
    poptorch.inferenceModel with its parts placed as training places them (execution/inference.py)."""

    @classmethod
    def serve(cls, args: argparse.Namespace, execution: Any) -> str:
        """`ipu-packing-predict` on a classifier: score ``args.input``'s texts into ``args.output``; the line that
        says so."""
        predictor = cls.from_pretrained(args.model, 128 if args.max_seq_length is None else args.max_seq_length,
                                        args.max_sequences_per_pack, args.batch_packs, args.device,
                                        execution=execution)
        records = predictor.predict(read_inputs(args.input, args.sentence1_key, args.sentence2_key, args.label_key))
        write_records(args.output, records)
        return "predicted %d inputs of %s with %s -> %s" % (len(records), args.input, args.model, args.output)

    @classmethod
    def from_pretrained(cls, directory: str, max_seq_length: int = 128, max_sequences_per_pack: int = 32,
                        batch_packs: Optional[int] = None, device: str = "cpu", attention: Optional[str] = None,
                        execution: Any = None) -> "Predictor":
        """The classifier of ``directory`` (its weights and its tokenizer) on ``device``, or as ``execution`` (an
        ExecutionConfig) says; attention: the fastest exact one for S there, unless given."""
        from .model import PackedBertForSequenceClassification

        model, tokenizer, batch_packs = _load_served(
            PackedBertForSequenceClassification, "BERT classifier", directory, max_seq_length, max_sequences_per_pack,
            batch_packs, device, attention, execution)
        return cls(model, tokenizer, max_seq_length, max_sequences_per_pack, batch_packs, execution)

    @property
    def labels(self) -> List[str]:
        config = self.model.config
        return [str(config.id2label[i]) for i in range(int(config.num_labels))]

    def packs(self, texts: Sequence[Text]) -> Any:
        """The inputs as packs of the one format (a Dataset of the classification fields, example ids = input
        indices), by the planner and the writer's pack builder."""
        from .data.format import IGNORE_INDEX, FieldLayout
        from .data.instance_files import Instances
        from .data.finetune.encode import build_encoder, encode

        if not texts:
            raise UserError("no input to score")
        pairs = [t if isinstance(t, tuple) else (t, None) for t in texts]
        if len({b is None for _, b in pairs}) > 1:
            raise UserError("inputs mix single texts and pairs: give all of one kind")
        first = [a for a, _ in pairs]
        second = None if pairs[0][1] is None else [b for _, b in pairs]
        S, K = self.max_seq_length, self.max_sequences_per_pack
        ids = self.tokenizer.special_token_ids
        tokens, lengths, a_lengths, _ = encode(build_encoder(self.tokenizer, S), ids["[CLS]"], first, second)
        n = len(lengths)
        problem_type = self.problem_type
        float_labels = problem_type != "single_label_classification"
        shape = (n,) if (not float_labels or (problem_type == "regression" and self.model.config.num_labels == 1)) \
            else (n, int(self.model.config.num_labels))
        labels = np.zeros(shape, np.float32) if float_labels else np.full(n, IGNORE_INDEX, np.int32)
        zeros = np.zeros(n, np.int32)
        instances = Instances(tokens, lengths.astype(np.int32), a_lengths.astype(np.int32), zeros, zeros,
                              np.zeros(0, np.int32), np.zeros(0, np.int32),
                              extra={"labels": labels, "example_ids": np.arange(n, dtype=np.int32)})
        fields = FieldLayout(tasks.CLASSIFICATION.name, problem_type, int(self.model.config.num_labels), False)
        return _build_packs(instances, lengths, S, K, SERVING_PLANNER, ids["[CLS]"], fields, n)

    @property
    def problem_type(self) -> str:
        config = self.model.config
        if config.problem_type:
            return config.problem_type
        return "regression" if int(config.num_labels) == 1 else "single_label_classification"

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """The pipeline's scores of logits (N, L): softmax, sigmoid or the raw output (see the module docstring).
        Quietly: a sigmoid's exp overflows to its limit, and a row with an infinite logit scores NaN, which
        check_finite_scores then refuses in one line."""
        config = self.model.config
        if config.problem_type == "regression":
            return logits
        with np.errstate(over="ignore", invalid="ignore"):
            if config.problem_type == "multi_label_classification" or int(config.num_labels) == 1:
                return 1.0 / (1.0 + np.exp(-logits))
            e = np.exp(logits - logits.max(axis=-1, keepdims=True))  # (N, L)
            return e / e.sum(axis=-1, keepdims=True)

    def logits(self, texts: Sequence[Text]) -> np.ndarray:
        """(N, L) logits of each input, in input order (float64 of the model's float32)."""
        from .train.evaluate import collect

        got = collect(self.runnable(), self.packs(texts), self.batch_packs)
        if got["example_ids"].tolist() != list(range(len(texts))):  # every input exactly once: the format's rule
            raise AssertionError("the packs did not hold every input once")
        return got["logits"].astype(np.float64)

    def predict(self, texts: Sequence[Text]) -> List[Dict[str, Any]]:
        """One record per input, in input order: the top label and its score and every label's score
        (classification), or the output (regression)."""
        scores = self.scores(self.logits(texts))
        check_finite_scores(scores, "input")
        out = []
        if self.problem_type == "regression":
            for i, row in enumerate(scores):
                out.append({"index": i, "score": float(row[0]) if len(row) == 1 else [float(v) for v in row]})
            return out
        names = self.labels
        for i, row in enumerate(scores):
            best = int(np.argmax(row))
            out.append({"index": i, "label": names[best], "score": float(row[best]),
                        "scores": {name: float(v) for name, v in zip(names, row)}})
        return out


def check_finite_weights(model: Any, directory: str) -> None:
    """Refuse (UserError, one line) a model whose weights hold inf or NaN: its scores would not be numbers."""
    from .train.state import non_finite_tensors

    bad = non_finite_tensors(model.state_dict())
    if bad:
        raise UserError("--model %s: %d weights hold inf or NaN (first: %s): its scores would not be numbers"
                        % (directory, len(bad), bad[0]))


def check_finite_scores(scores: np.ndarray, what: str) -> None:
    """Refuse (UserError, one line naming the first) scores that are not finite numbers: JSON has no NaN, and a
    score that is not a number is no prediction."""
    bad = np.flatnonzero(~np.isfinite(scores).reshape(len(scores), -1).all(axis=1)) if len(scores) else []
    if len(bad):
        raise UserError("the model's scores of %d %ss are not finite numbers (first: %s %d): nothing was written"
                        % (len(bad), what, what, int(bad[0])))


MIN_SEQ_LENGTH = 3
"""The shortest S: [CLS], one token and [SEP]."""


def model_architecture(directory: str) -> str:
    """The first of config.json's architectures in a model directory ("" when it names none)."""
    from .jsonin import load_path

    path = os.path.join(directory, "config.json")
    if not os.path.lexists(path):
        return ""  # from_pretrained names what is wrong with the directory
    try:
        value = load_path(path, error=UserError)  # a FIFO or a device refused at once, the size bounded
    except (ValueError, RecursionError):
        return ""  # not JSON: from_pretrained names what is wrong with it
    names = value.get("architectures") if isinstance(value, dict) else None
    return str(names[0]) if isinstance(names, list) and names else ""


@dataclass
class QuestionAnswerer(_Served):
    """A packed BertForQuestionAnswering and its tokenizer (``from_pretrained``), ready to answer questions."""

    model: Any
    """PackedBertForQuestionAnswering, in eval mode on its device."""
    tokenizer: Any
    """data/vocab.py TokenizerSpec of the model's directory."""
    max_seq_length: int = 384
    """S: tokens per window and per pack (run_qa.py's max_seq_length)."""
    doc_stride: int = 128
    """Context tokens two consecutive windows of a question share (run_qa.py's doc_stride)."""
    max_query_length: int = 64
    """A question longer than this many tokens is cut at a word boundary (as prepare cuts it)."""
    max_sequences_per_pack: int = 32
    """K: windows per pack (the planner packs fewer where lengths do not allow more)."""
    batch_packs: int = 64
    """Packs per forward pass (PopTorch: the compiled batch, micro batch x device iterations x replicas)."""
    execution: Any = None
    """An ExecutionConfig: where the model runs (None: torch on ``device``), as for Predictor."""

    @classmethod
    def serve(cls, args: argparse.Namespace, execution: Any) -> str:
        """`ipu-packing-predict` on a question-answering model: answer ``args.input``'s questions into
        ``args.output``; the line that says so."""
        answerer = cls.from_pretrained(
            args.model, 384 if args.max_seq_length is None else args.max_seq_length, args.doc_stride,
            args.max_query_length, args.max_sequences_per_pack, args.batch_packs, args.device, execution=execution)
        records = answerer.predict(read_questions_input(args.input))
        write_records(args.output, records)
        return "answered %d questions of %s with %s -> %s" % (len(records), args.input, args.model, args.output)

    @classmethod
    def from_pretrained(cls, directory: str, max_seq_length: int = 384, doc_stride: int = 128,
                        max_query_length: int = 64, max_sequences_per_pack: int = 32,
                        batch_packs: Optional[int] = None, device: str = "cpu", attention: Optional[str] = None,
                        execution: Any = None) -> "QuestionAnswerer":
        """The question-answering model of ``directory`` (its weights and its tokenizer) on ``device``, or as
        ``execution`` (an ExecutionConfig) says."""
        from .data.finetune.windows import check_window_settings
        from .model import PackedBertForQuestionAnswering

        check_window_settings(max_seq_length, doc_stride, max_query_length)
        model, tokenizer, batch_packs = _load_served(
            PackedBertForQuestionAnswering, "BERT question-answering model", directory, max_seq_length,
            max_sequences_per_pack, batch_packs, device, attention, execution)
        return cls(model, tokenizer, max_seq_length, doc_stride, max_query_length, max_sequences_per_pack,
                   batch_packs, execution)

    def packs(self, questions: Sequence[str], contexts: Sequence[str]) -> Any:
        """The questions' windows as packs of the one format (the question-answering fields; example ids = input
        indices, feature ids = windows in input order), cut by data/finetune/windows.py as prepare cuts them, packed
        by the planner and the writer's pack builder."""
        from .data.format import FieldLayout
        from .data.instance_files import Instances
        from .data.finetune.windows import build_window_tokenizers, cut_question, window_examples

        if not questions:
            raise UserError("no question to answer")
        S, K = self.max_seq_length, self.max_sequences_per_pack
        cls_id = self.tokenizer.special_token_ids["[CLS]"]
        pair, alone = build_window_tokenizers(self.tokenizer, S, self.doc_stride)
        questions = [q.lstrip() for q in questions]
        for i, question in enumerate(questions):
            shorter = cut_question(alone, question, self.max_query_length, "question %d" % i)
            if shorter is not None:
                questions[i] = shorter
        n = len(questions)
        tokens, lengths, a_lengths, starts, ends, owner, offsets = window_examples(
            pair, cls_id, questions, list(contexts), [(None, None)] * n, self.tokenizer.source)
        windows = len(lengths)
        zeros = np.zeros(windows, np.int32)
        instances = Instances(tokens, lengths, a_lengths, zeros, zeros, np.zeros(0, np.int32), np.zeros(0, np.int32),
                              {"start_positions": starts, "end_positions": ends, "example_ids": owner,
                               "feature_ids": np.arange(windows, dtype=np.int32)}, {"offsets": offsets})
        return _build_packs(instances, lengths, S, K, "optimal", cls_id,
                            FieldLayout(tasks.QUESTION_ANSWERING.name, num_examples=n), n)

    def answers(self, questions: Sequence[str], contexts: Sequence[str]) -> List[Any]:
        """Each question's data/finetune/answers.py Prediction (its text, score, window, characters), in input order."""
        from .data.finetune.answers import AnswerSearch
        from .train.evaluate import collect_answers

        search = AnswerSearch()
        collect_answers(self.runnable(), self.packs(questions, contexts), self.batch_packs, search)
        predictions = search.predictions(list(contexts))
        return [predictions[i] for i in range(len(contexts))]

    def predict(self, examples: Sequence[Tuple[str, str, str]]) -> List[Dict[str, Any]]:
        """(id, question, context) each -> {"id", "prediction_text"} each, in input order."""
        answers = self.answers([q for _, q, _ in examples], [c for _, _, c in examples])
        check_finite_scores(np.asarray([answer.score for answer in answers], np.float64), "question")
        return [{"id": qid, "prediction_text": answer.text} for (qid, _, _), answer in zip(examples, answers)]


def read_questions_input(path: str) -> List[Tuple[str, str, str]]:
    """(id, question, context) of each question of an input file (SQuAD JSON, or JSON Lines, Parquet, datasets
    with id, question and context), read and checked as prepare reads a question-answering split."""
    from .data.finetune.questions import read_questions

    return [(e.id, e.question, e.context) for e in read_questions(path, "input", False, answers_column=False).examples]


class Packs:
    """Packs built in memory as a Dataset: item i is {field: tensor} of pack i (the fields in the format's order)."""

    def __init__(self, arrays: Dict[str, np.ndarray]) -> None:
        self.arrays = arrays  # {field: (P, ...)}

    def __len__(self) -> int:
        return int(self.arrays["input_ids"].shape[0])

    def __getitem__(self, i: int) -> Dict[str, Any]:
        import torch

        return {name: torch.from_numpy(np.ascontiguousarray(array[i])) for name, array in self.arrays.items()}

    def rows(self, start: int, stop: int) -> Dict[str, Any]:
        """Packs [start, stop) as one batch {field: tensor (stop - start, ...)}: what stacking the items gives, in
        one slice per field (train/evaluate.py scored_batches)."""
        import torch

        return {name: torch.from_numpy(np.ascontiguousarray(array[start:stop])) for name, array in self.arrays.items()}


def _check_tokenizer_size(tokenizer: Any, model: Any, directory: str) -> None:
    """The model directory's tokenizer against its embeddings (data/vocab.py tokenizer_fit): larger is refused in
    one line naming both sizes; smaller is said on stderr."""
    from .data.vocab import tokenizer_fit

    note = tokenizer_fit(len(tokenizer.vocab), int(model.config.vocab_size), "--model %s" % (directory,))
    if note:
        print("note: " + note, file=sys.stderr)


def _fastest_attention(device: str, max_seq_length: int, execution: Any = None) -> str:
    from .execution import ExecutionConfig
    from .train.model_section import resolve_attention

    return resolve_attention({}, execution or ExecutionConfig(device=device), max_seq_length)


def read_inputs(path: str, sentence1_key: Optional[str], sentence2_key: Optional[str],
                label_key: str = "label") -> List[Text]:
    """The texts (or pairs) of an input file, as ``prepare --task`` reads a split (run_glue.py's columns); says on
    stderr which columns it reads."""
    from .data.finetune.labels import describe_columns, text_columns, texts
    from .data.finetune.rows import read_split

    table = read_split(path)
    columns = text_columns(table, sentence1_key, sentence2_key, label_key)
    values = [texts(table, column) for column in columns]
    if not len(values[0]):
        raise UserError("%s: no input to score (its columns, and no row)" % (path,))
    print("%s: %s" % (path, describe_columns(columns, label_key if label_key in table.columns else None,
                                             "(not read)")), file=sys.stderr)
    return list(values[0]) if len(values) == 1 else list(zip(values[0], values[1]))


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m ipu_packing.predict", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face BERT classifier directory (with its tokenizer)")
    p.add_argument("--input", required=True, help="CSV, TSV or JSON Lines (run_glue.py's columns), or Parquet; "
                   "question answering: SQuAD JSON, or JSON Lines with id, question, context")
    p.add_argument("--output", required=True, help="JSON Lines: one object per input, in input order")
    p.add_argument("--max-seq-length", type=int, default=None,
                   help="S (default: 128; a question-answering model: 384, run_qa.py's)")
    p.add_argument("--doc-stride", type=int, default=128,
                   help="question answering: context tokens two windows share (default: %(default)s)")
    p.add_argument("--max-query-length", type=int, default=64,
                   help="question answering: longer questions are cut at a word boundary (default: %(default)s)")
    p.add_argument("--max-sequences-per-pack", type=int, default=32)
    p.add_argument("--batch-packs", type=int, default=None,
                   help="packs per forward pass (default on CPU: as many as keep a call's feed-forward activation "
                   "within 1 MiB or within one layer's weights, e.g. 8 for a model of hidden size 64 and "
                   "intermediate size 256 at S=128, 18 for BERT-Base; on CUDA: 64)")
    p.add_argument("--sentence1-key", default=None)
    p.add_argument("--sentence2-key", default=None)
    p.add_argument("--label-key", default="label", help="a column to leave out of the texts (default: label)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--config", default=None, help="run on the execution of this training config (configs/NAME.yaml "
                   "or a path): e.g. a fine-tuning config with execution.backend poptorch serves on IPUs")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="with --config: its overrides")
    return p


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse, before any work, numbers out of range and an output this command must not replace
    (fsutil.check_output: the input, the model directory or anything in it, a device, a FIFO, a symlink, a
    directory)."""
    from .fsutil import check_output

    for name in ("max_seq_length", "batch_packs", "doc_stride", "max_query_length"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError("--%s must be a positive integer, got %d" % (name.replace("_", "-"), value))
    if args.max_seq_length is not None and args.max_seq_length < MIN_SEQ_LENGTH:
        raise UserError("--max-seq-length must be at least %d ([CLS], a token, [SEP]), got %d"
                        % (MIN_SEQ_LENGTH, args.max_seq_length))
    check_output(args.output, "--output", reading=[args.input, args.model, args.config or ""])


def write_records(path: str, records: List[Dict[str, Any]]) -> None:
    """The output file: one JSON object a line (jsonout.jsonl_text), written atomically."""
    from .fsutil import atomic_write_text
    from .jsonout import jsonl_text

    atomic_write_text(path, jsonl_text(records))


def command(argv: Optional[List[str]]) -> int:
    args = build_parser().parse_args(argv)
    check_arguments(args)
    execution = None
    if args.config:
        from .train import load_config

        execution = load_config(args.config, args.overrides).execution
    elif args.overrides:
        raise UserError("overrides (%s) need --config" % (args.overrides[0],))
    message = tasks.served(model_architecture(args.model)).hook("predictor").serve(args, execution)
    print(message, file=sys.stderr)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(command, argv)


if __name__ == "__main__":
    sys.exit(main())
