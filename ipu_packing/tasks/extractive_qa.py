"""Extractive question answering, as transformers' run_qa.py fine-tunes it (SQuAD v1.1): each question's context
cut into windows of S tokens that overlap by the doc stride, a start and an end logit per token, each window's
answer among its own context tokens.

- fields: the four (S,) token fields, each window's [CLS], its answer's start and end, its question's row
  (example_ids, shared by the question's windows), the window's own row (feature_ids) and each context token's
  character offsets.
- manifest entry: the split, its questions and windows, the window settings and the examples file beside the
  shards (MANIFEST_KEYS; checked by data/format.py check_question_entry).
- preparation: SQuAD v1.1 JSON or run_qa.py's JSON Lines -> windows (data/finetune/qa_preparation.py, windows.py;
  the examples file: questions.py, the one reader).
- model: PackedBertForQuestionAnswering (model/question_answering.py); its parts: that module's
  pipeline_stages. Its dataset decides nothing about the model, so compile-only builds it without one.
- metrics: the loss ((start + end cross-entropy) / 2 over each window's own tokens), start and end accuracy;
  evaluation: each question's best span over its windows by run_qa.py's rule, SQuAD v1.1 exact match and F1
  (train/evaluate.py, data/finetune/answers.py); serving: predict.py ``QuestionAnswerer``; export:
  BertForQuestionAnswering.

Its field set in the one pack format (data/format.py, whose legend this uses):

    question_answering  (`prepare --task question_answering`, data/finetune/questions.py and windows.py: SQuAD's
                    question + context windows, as transformers' run_qa.py makes them)
                    input_ids, token_type_ids, position_ids, sequence_ids   (S,) as in format.py:
                                          [CLS] question [SEP] context window [SEP], token types 0 then 1
                    cls_positions   (K,)  as in format.py
                    start_positions (K,)  int: the answer's first token, a position in the pack (absolute, not
                                          relative to the window's [CLS]); the window's own [CLS] where the
                                          answer is not wholly inside the window (run_qa's rule for training
                                          features); IGNORE_INDEX in an empty slot
                    end_positions   (K,)  int: the answer's last token, likewise
                    example_ids     (K,)  int32: the question's row in its split (0-based, in file order; several
                                          windows of one context share it); -1 in an empty slot
                    feature_ids     (K,)  int32: the window's row in its split (0-based, windows in question
                                          order, each question's windows in context order; unique); -1 if empty
                    offsets         (S, 2) int32: a context token's [start, end) characters in its context;
                                          -1 for every other token (question, [CLS], [SEP], padding)

    The order is the model's forward order (the four token fields, start_positions, end_positions, with
    cls_positions, which a no-answer label points at, before them), then the ids and offsets (to cut an
    answer's text out of its context at evaluation). The questions and contexts themselves are beside the packs
    in the dataset directory (the manifest's task.examples_file, checksummed: data/finetune/questions.py).

    Invariants of a question-answering pack, besides format.py's sequences, positions, token types and [CLS]:

    example slots   example_ids[j] is used (not -1) exactly when j < k; feature slots likewise, and no
                    feature id appears twice in the dataset (every window of the split exactly once)
    offsets         offsets[t] is used (both values not -1) exactly on the context tokens: the tokens of token
                    type 1 but the last of their sequence (its final [SEP]); a used pair has 0 <= start <= end
    answer slots    start_positions[j] and end_positions[j] are used (not IGNORE_INDEX) exactly when j < k;
                    a used pair is either both sequence j + 1's [CLS] (no answer in the window) or both on
                    context tokens of sequence j + 1 with start <= end: an answer never points into the
                    question, another sequence or padding

    A question-answering dataset's `task` entry (MANIFEST_KEYS below), e.g.

        {"name": "question_answering", "split": "validation", "num_examples": 310, "answered": 310,
         "max_query_length": 64, "doc_stride": 128, "questions_truncated": 0, "windows_without_answer": 12,
         "examples_file": "examples.jsonl", "examples_sha256": "...", "tokenizer": "default (...)",
         "source": {"file": "dev-v1.1.json", "format": "squad", "rows": 310, "sha256": "..."}}
"""

from __future__ import annotations

from .spec import TOKEN_FIELDS, ManifestKeys, Task

MANIFEST_KEYS: ManifestKeys = {
    "name": (str, '"question_answering"'),
    "split": (str, '"train", "validation" or "test"'),
    "num_examples": (int, "questions (examples) of the split: example_ids lie in [0, num_examples)"),
    "answered": (int, "questions with at least one answer"),
    "max_query_length": (int, "tokens a question is cut to (at a word boundary)"),
    "doc_stride": (int, "tokens two consecutive windows of one context share"),
    "questions_truncated": (int, "questions cut to max_query_length"),
    "windows_without_answer": (int, "windows whose labels point at their [CLS]: the answer is not wholly inside"),
    "examples_file": (str, "JSON Lines of the split's examples (id, question, context, answers) in this directory"),
    "examples_sha256": (str, "sha256 of examples_file"),
    "tokenizer": (str, "where the tokenizer came from"),
    "source": (dict, "the split's input: {file, format, rows, sha256}"),
}
"""The keys of a question-answering manifest's `task` entry (all required)."""

QUESTION_ANSWERING = Task(
    name="question_answering",
    fields=TOKEN_FIELDS + ("cls_positions", "start_positions", "end_positions", "example_ids", "feature_ids",
                           "offsets"),
    metrics=("loss", "start_accuracy", "end_accuracy"),
    first_metrics=("loss", "start_accuracy", "end_accuracy"),
    last_metrics=("loss", "start_accuracy", "end_accuracy"),
    export="BertForQuestionAnswering",
    model_settings={"num_labels": 2},
    evaluated=True,
    unique_ids="feature_ids",
    manifest_keys=MANIFEST_KEYS,
    labelled_key="answered",
    companions=(("examples_file", "examples_sha256"),),
    max_seq_length=384,
    inputs="SQuAD v1.1 JSON, or run_qa.py's JSON Lines: id, question, context, answers",
    prepare_options={"doc_stride": None, "max_query_length": None},
    hooks={
        "check_entry": "ipu_packing.data.format:check_question_entry",
        "check_counts": "ipu_packing.data.format:check_question_counts",
        "broken_slots": "ipu_packing.data.shards:broken_answer_slots",
        "first_broken_slot": "ipu_packing.data.shards:first_broken_answer_slot",
        "inspect": "ipu_packing.data.finetune.qa_preparation:inspect_lines",
        "check_prepare": "ipu_packing.data.finetune.qa_preparation:check_options",
        "prepare": "ipu_packing.data.finetune.qa_preparation:prepare_questions",
        "prepared": "ipu_packing.data.finetune.qa_preparation:prepared_lines",
        "hint_options": "ipu_packing.data.finetune.windows:hint_options",
        "model": "ipu_packing.model.question_answering:PackedBertForQuestionAnswering",
        "stages": "ipu_packing.model.question_answering:pipeline_stages",
        "check_eval_data": "ipu_packing.data.finetune.questions:read_examples",
        "evaluate": "ipu_packing.train.evaluate:evaluate_questions",
        "predictor": "ipu_packing.predict:QuestionAnswerer",
    },
)

__all__ = ["MANIFEST_KEYS", "QUESTION_ANSWERING"]
