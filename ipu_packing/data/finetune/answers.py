"""Question answering after the model: token logits -> each question's best answer span -> its text; and the
official SQuAD v1.1 exact match and F1. numpy and the standard library only.

    search = AnswerSearch(n_best_size=20, max_answer_length=30)
    search.add(token_start_logits, token_end_logits, packs)   # (B, S) each, and the packs' fields; per batch
    predictions = search.predictions(examples)                # {example row: Prediction}, examples: read_examples
    squad_metrics({e.id: predictions[i].text ...}, {e.id: e.answer_texts ...})  # {"exact_match", "f1"} in percent

The rule is transformers' run_qa.py's (utils_qa.py `postprocess_qa_predictions`, SQuAD v1.1), per window on its own
tokens only: the n_best_size highest start logits and the n_best_size highest end logits of the window's own tokens
(its slot's positions in the pack: `sequence_ids == k`, never another sequence's or padding), every pair of them
whose start and end are both context tokens of the window (offsets not -1: never the question, [CLS] or [SEP]),
end >= start and at most max_answer_length tokens long, scored start_logit + end_logit. A question's candidates from
all of its windows, in window order, are sorted by score (stable: on a tie the earlier window, start and end of
run_qa.py's loop win), its best n_best_size kept, and the first is its prediction: the context's characters from the
start token's first to the end token's last (the offsets), and the combining marks that follow that last character
(`marks_end`: an uncased tokenizer strips a decomposed accent, so no token's offsets hold it, but it belongs to the
letter before it: "Cafe\u0301" is cut whole, not as "Cafe"). A question with no candidate at all gets the empty text
(run_qa.py writes the word "empty" there; no SQuAD answer is either).

Exact match and F1 are the official SQuAD v1.1 evaluation script's (evaluate-v1.1.py): each text normalised (lower
case, punctuation removed (string.punctuation), the articles a, an, the removed as whole words, white space folded),
exact match 1 when the normalised texts are equal, F1 the harmonic mean of precision and recall of the normalised
tokens' multiset overlap (0 without overlap), each the best over the question's gold answers, averaged over the
questions and given in percent, as the script prints them.
"""

from __future__ import annotations

import collections
import re
import string
import unicodedata
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

N_BEST_SIZE = 20
"""run_qa.py's --n_best_size."""
MAX_ANSWER_LENGTH = 30
"""run_qa.py's --max_answer_length (tokens)."""


@dataclass(frozen=True)
class Prediction:
    """A question's answer."""

    text: str
    """The answer's text, cut out of the context ("" without a candidate)."""
    score: float
    """start_logit + end_logit of the chosen span (0.0 without a candidate)."""
    feature: int
    """The window it came from (its feature id; -1 without a candidate)."""
    start_char: int
    end_char: int
    """The span's characters in the context, [start_char, end_char)."""


def marks_end(text: str, end: int) -> int:
    """``end`` moved past the combining marks (unicodedata.combining) that follow it in ``text``: a span's end that
    takes the accents of its last letter along."""
    while end < len(text) and unicodedata.combining(text[end]):
        end += 1
    return end


def window_candidates(start_logits: np.ndarray, end_logits: np.ndarray, offsets: np.ndarray,
                      n_best_size: int = N_BEST_SIZE, max_answer_length: int = MAX_ANSWER_LENGTH
                      ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One window's candidates: its own tokens' logits (n,) each and offsets (n, 2) (-1: not a context token) ->
    (scores (m,) float64, starts (m,), ends (m,) token indices in the window), in run_qa.py's loop order (start
    index by falling start logit, then end index by falling end logit)."""
    starts = np.argsort(start_logits)[-1:-n_best_size - 1:-1]  # (n_best,) as run_qa.py takes them
    ends = np.argsort(end_logits)[-1:-n_best_size - 1:-1]
    context = offsets[:, 0] >= 0  # (n,)
    s, e = starts[:, None], ends[None, :]  # (n_best, 1), (1, n_best)
    valid = context[s] & context[e] & (e >= s) & (e - s + 1 <= max_answer_length)  # (n_best, n_best)
    rows, columns = np.nonzero(valid)  # row-major: start index major, end index minor
    scores = start_logits[starts[rows]].astype(np.float64) + end_logits[ends[columns]].astype(np.float64)
    return scores, starts[rows], ends[columns]


class AnswerSearch:
    """The candidates of every window seen (`add`, batch by batch), then each question's prediction."""

    def __init__(self, n_best_size: int = N_BEST_SIZE, max_answer_length: int = MAX_ANSWER_LENGTH) -> None:
        self.n_best_size = n_best_size
        self.max_answer_length = max_answer_length
        self.candidates: Dict[int, List[Tuple[int, np.ndarray, np.ndarray, np.ndarray]]] = {}
        """{example row: [(feature id, scores, start chars, end chars) of each window]}."""

    def add(self, token_start_logits: np.ndarray, token_end_logits: np.ndarray, packs: Mapping[str, Any]) -> None:
        """The candidates of every window of a batch of packs: the model's token logits (B, S) each, and the packs'
        sequence_ids (B, S), cls_positions, example_ids, feature_ids (B, K) and offsets (B, S, 2)."""
        sequence_ids = np.asarray(packs["sequence_ids"])
        cls = np.asarray(packs["cls_positions"])
        examples, features = np.asarray(packs["example_ids"]), np.asarray(packs["feature_ids"])
        offsets = np.asarray(packs["offsets"])
        start_logits, end_logits = np.asarray(token_start_logits), np.asarray(token_end_logits)
        for b, k in zip(*np.nonzero(features >= 0)):
            first = int(cls[b, k])
            end = first + int((sequence_ids[b] == k + 1).sum())  # the window's own tokens: [first, end)
            own = offsets[b, first:end]
            scores, starts, ends = window_candidates(start_logits[b, first:end], end_logits[b, first:end], own,
                                                     self.n_best_size, self.max_answer_length)
            self.candidates.setdefault(int(examples[b, k]), []).append(
                (int(features[b, k]), scores, own[starts, 0], own[ends, 1]))

    def n_best(self, example: int) -> List[Tuple[float, int, int, int]]:
        """(score, feature, start char, end char) of a question's best n_best_size candidates, best first."""
        windows = sorted(self.candidates.get(example, []), key=lambda w: w[0])  # window order
        if not windows:
            return []
        scores = np.concatenate([w[1] for w in windows])
        features = np.concatenate([np.full(len(w[1]), w[0]) for w in windows])
        starts = np.concatenate([w[2] for w in windows])
        ends = np.concatenate([w[3] for w in windows])
        order = np.argsort(-scores, kind="stable")[:self.n_best_size]
        return [(float(scores[i]), int(features[i]), int(starts[i]), int(ends[i])) for i in order]

    def predictions(self, contexts: Sequence[str]) -> Dict[int, Prediction]:
        """{example row: its Prediction} for every question of the split (`contexts`: each question's context, by
        row); a question none of whose windows was seen, or without a candidate, gets the empty text."""
        out = {}
        for example, context in enumerate(contexts):
            best = self.n_best(example)
            if not best:
                out[example] = Prediction("", 0.0, -1, 0, 0)
                continue
            score, feature, start, end = best[0]
            end = marks_end(context, end)
            out[example] = Prediction(context[start:end], score, feature, start, end)
        return out


# ---------------------------------------------------------------------------------------------------
# the official SQuAD v1.1 evaluation (evaluate-v1.1.py)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra white space (the official script's)."""

    def remove_articles(text: str) -> str:
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def f1_score(prediction: str, ground_truth: str) -> float:
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def squad_metrics(predictions: Mapping[str, str], gold: Mapping[str, Sequence[str]]) -> Dict[str, Optional[float]]:
    """{"exact_match", "f1"} in percent over the questions of `gold` ({id: its gold answers' texts}), each question's
    best over its gold answers; a question without a prediction scores 0 (the official script's rule). None for no
    questions."""
    if not gold:
        return {"exact_match": None, "f1": None}
    exact = f1 = 0.0
    for qid, answers in gold.items():
        if qid not in predictions:
            continue
        exact += max(float(exact_match_score(predictions[qid], a)) for a in answers)
        f1 += max(f1_score(predictions[qid], a) for a in answers)
    return {"exact_match": 100.0 * exact / len(gold), "f1": 100.0 * f1 / len(gold)}


__all__ = ["AnswerSearch", "MAX_ANSWER_LENGTH", "N_BEST_SIZE", "Prediction", "exact_match_score", "f1_score",
           "normalize_answer", "squad_metrics", "window_candidates"]
