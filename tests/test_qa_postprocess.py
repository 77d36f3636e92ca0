"""Question-answering post-processing (data/finetune/answers.py): exact match and F1 are the official SQuAD v1.1
script's on hand-made cases (punctuation, articles, several gold answers, white space); the best span of each
question is run_qa.py's (utils_qa.py postprocess_qa_predictions) on its windows unpacked, whatever the packing; a
better-scoring span of another question in the same pack, or in the question itself, is never an answer."""

from __future__ import annotations

import collections
import os
import re
import string

import numpy as np
import pytest

from ipu_packing.data import open_dataset
from ipu_packing.data.finetune.answers import AnswerSearch, exact_match_score, f1_score, normalize_answer, squad_metrics
from ipu_packing.data.finetune.questions import read_examples
from qa_reference import run_qa_postprocess


# -- the official SQuAD v1.1 evaluation script (evaluate-v1.1.py), as published: the reference ----------------


def official_normalize_answer(s):
    def remove_articles(text):
        return re.sub(r'\b(a|an|the)\b', ' ', text)

    def white_space_fix(text):
        return ' '.join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return ''.join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def official_f1_score(prediction, ground_truth):
    prediction_tokens = official_normalize_answer(prediction).split()
    ground_truth_tokens = official_normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def official_exact_match_score(prediction, ground_truth):
    return (official_normalize_answer(prediction) == official_normalize_answer(ground_truth))


def official_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


def official_evaluate(dataset, predictions):
    f1 = exact_match = total = 0
    for article in dataset:
        for paragraph in article['paragraphs']:
            for qa in paragraph['qas']:
                total += 1
                if qa['id'] not in predictions:
                    continue
                ground_truths = list(map(lambda x: x['text'], qa['answers']))
                prediction = predictions[qa['id']]
                exact_match += official_metric_max_over_ground_truths(
                    official_exact_match_score, prediction, ground_truths)
                f1 += official_metric_max_over_ground_truths(
                    official_f1_score, prediction, ground_truths)
    exact_match = 100.0 * exact_match / total
    f1 = 100.0 * f1 / total
    return {'exact_match': exact_match, 'f1': f1}


# (prediction, gold answers, exact match, F1) worked out by hand from the official definitions
CASES = [
    ("The Eiffel Tower!", ["eiffel tower"], 1, 1.0),                     # case, punctuation, an article
    ("  New   York\tCity ", ["new york city"], 1, 1.0),                  # white space folded
    ("U.S.", ["US"], 1, 1.0),                                            # punctuation inside a word
    ("an apple a day", ["apple day"], 1, 1.0),                           # articles as whole words only ...
    ("theater", ["ater"], 0, 0.0),                                       # ... never inside one
    ("the big red dog", ["red dog"], 0, 0.8),                            # precision 2/3, recall 1
    ("red dog", ["the big red dog", "a dog", "red"], 0, 0.8),             # several gold answers: the best of each
    ("dog", ["red dog", "dog"], 1, 1.0),
    ("cat cat", ["cat"], 0, 2 * 0.5 * 1 / 1.5),                          # a multiset: one "cat" in common
    ("", ["anything"], 0, 0.0),                                          # the empty prediction
    ("...", ["!!"], 1, 0.0),                                             # both normalise to nothing: equal, no tokens
    ("Café au lait", ["cafe au lait"], 0, 2 * (2 / 3) * (2 / 3) / (4 / 3)),  # accents are not folded
    ("1,000", ["1000"], 1, 1.0),
    ("well-known", ["wellknown"], 1, 1.0),
]


@pytest.mark.parametrize("prediction, gold, exact, f1", CASES, ids=[repr(c[0]) for c in CASES])
def test_exact_match_and_f1_are_the_official_scripts(prediction, gold, exact, f1):
    assert normalize_answer(prediction) == official_normalize_answer(prediction)
    ours_exact = max(float(exact_match_score(prediction, g)) for g in gold)
    ours_f1 = max(f1_score(prediction, g) for g in gold)
    assert ours_exact == official_metric_max_over_ground_truths(official_exact_match_score, prediction, gold) == exact
    assert ours_f1 == pytest.approx(official_metric_max_over_ground_truths(official_f1_score, prediction, gold))
    assert ours_f1 == pytest.approx(f1)


def test_the_split_metrics_are_the_official_evaluate():
    dataset = [{"paragraphs": [{"qas": [{"id": "q%d" % i, "answers": [{"text": g} for g in gold]}
                                        for i, (_, gold, _, _) in enumerate(CASES)]}]}]
    predictions = {"q%d" % i: p for i, (p, _, _, _) in enumerate(CASES) if i != 3}  # one question unanswered
    ours = squad_metrics(predictions, {"q%d" % i: gold for i, (_, gold, _, _) in enumerate(CASES)})
    theirs = official_evaluate(dataset, predictions)
    assert ours == pytest.approx(theirs)
    assert ours["exact_match"] == pytest.approx(100.0 * 7 / len(CASES))


# -- the best span: run_qa.py's rule, per window, packed or not ---------------------------------------------------


@pytest.fixture(scope="module")
def demo(qa_demo_task):
    """The demo task at S=64 (short windows: most questions have several) with the default vocabulary."""
    return qa_demo_task


def _logits(ds, seed):
    """Random token logits (P, S) for start and end, float32, the same for a token whichever layout holds it: drawn
    per (window, position in the window)."""
    rng = np.random.default_rng(seed)
    starts, ends = [], []
    for i in range(len(ds)):
        pack = ds[i]
        start, end = np.zeros(ds.max_seq_length, np.float32), np.zeros(ds.max_seq_length, np.float32)
        for k, feature in enumerate(pack["feature_ids"].tolist()):
            if feature < 0:
                continue
            first = int(pack["cls_positions"][k])
            n = int((pack["sequence_ids"] == k + 1).sum())
            window = np.random.default_rng([seed, feature]).normal(size=(2, n)).astype(np.float32)
            start[first:first + n], end[first:first + n] = window
        starts.append(start)
        ends.append(end)
    del rng
    return np.stack(starts), np.stack(ends)


def _search(ds, starts, ends, batch=7):
    search = AnswerSearch()
    for a in range(0, len(ds), batch):
        rows = [ds[i] for i in range(a, min(len(ds), a + batch))]
        packs = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
        search.add(starts[a:a + len(rows)], ends[a:a + len(rows)], packs)
    return search


def _features(ds, starts, ends):
    """Every window unpacked, in feature order: (example, start logits, end logits, offsets with None)."""
    found = {}
    for i in range(len(ds)):
        pack = ds[i]
        for k, feature in enumerate(pack["feature_ids"].tolist()):
            if feature < 0:
                continue
            first = int(pack["cls_positions"][k])
            n = int((pack["sequence_ids"] == k + 1).sum())
            offsets = [tuple(o) if o[0] >= 0 else None for o in pack["offsets"][first:first + n].tolist()]
            found[feature] = (int(pack["example_ids"][k]), starts[i, first:first + n], ends[i, first:first + n],
                              offsets)
    return [found[f] for f in sorted(found)]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_best_span_is_run_qas_on_the_windows_unpacked_packed_or_padded(demo, seed):
    answers = {}
    for kind in ("packed", "padded"):
        ds = open_dataset(os.path.join(demo, "validation", kind), as_tensors=False)
        examples = read_examples(ds.directory, ds.manifest)
        starts, ends = _logits(ds, seed)
        predictions = _search(ds, starts, ends).predictions([e.context for e in examples])
        theirs = run_qa_postprocess(examples, _features(ds, starts, ends))
        ours = {e.id: predictions[i].text for i, e in enumerate(examples)}
        assert ours == dict(theirs), kind
        answers[kind] = ours
    assert answers["packed"] == answers["padded"]
    windows = open_dataset(os.path.join(demo, "validation", "packed")).manifest["num_sequences"]
    assert windows > 1.5 * 300  # most questions have several windows: the best is chosen across them


def test_another_questions_better_span_in_the_same_pack_is_never_the_answer(demo):
    """A pack holding windows of two questions; the second window's context, and the first window's question, hold
    far higher logits than any span of the first window's context: the first question's answer is still the
    best span of its own context, the second's the best of its own."""
    ds = open_dataset(os.path.join(demo, "validation", "packed"), as_tensors=False)
    examples = read_examples(ds.directory, ds.manifest)
    p = next(i for i in range(len(ds)) if len(set(ds[i]["example_ids"].tolist()) - {-1}) >= 2)
    pack = ds[p]
    owner = pack["example_ids"].tolist()
    k1 = 0
    k2 = next(k for k in range(1, len(owner)) if owner[k] not in (-1, owner[0]))
    start = np.zeros((1, ds.max_seq_length), np.float32)
    end = np.zeros((1, ds.max_seq_length), np.float32)
    sid, offsets = pack["sequence_ids"], pack["offsets"]
    context1 = np.flatnonzero((sid == k1 + 1) & (offsets[:, 0] >= 0))
    context2 = np.flatnonzero((sid == k2 + 1) & (offsets[:, 0] >= 0))
    question1 = np.flatnonzero((sid == k1 + 1) & (pack["token_type_ids"] == 0))[1:]  # after [CLS]
    start[0, context2], end[0, context2] = 100.0, 100.0  # the other question's context: far better
    start[0, question1], end[0, question1] = 90.0, 90.0  # the question's own words: better too
    middle = len(context1) // 2
    before, s, e, after = context1[middle - 1:middle + 3]
    start[0, s], end[0, e] = 5.0, 5.0  # the best span of the question's own context
    start[0, after], end[0, before] = 8.0, 8.0  # an end before its start scores higher (16): never taken
    search = AnswerSearch()
    packs = {key: value[None] for key, value in pack.items()}
    search.add(start, end, packs)
    chosen = search.n_best(owner[k1])[0]
    assert chosen[0] == pytest.approx(10.0) and chosen[1] == int(pack["feature_ids"][k1])
    assert (chosen[2], chosen[3]) == (int(offsets[s, 0]), int(offsets[e, 1]))
    text = search.predictions([ex.context for ex in examples])[owner[k1]].text
    assert text == examples[owner[k1]].context[offsets[s, 0]:offsets[e, 1]]
    other = search.n_best(owner[k2])[0]
    assert other[0] == pytest.approx(200.0) and other[1] == int(pack["feature_ids"][k2])


def test_a_span_longer_than_max_answer_length_is_never_chosen():
    offsets = np.array([[-1, -1]] + [[2 * i, 2 * i + 1] for i in range(40)] + [[-1, -1]])  # [CLS] 40 tokens [SEP]
    start, end = np.zeros(42, np.float32), np.zeros(42, np.float32)
    start[1], end[40] = 50.0, 50.0  # 40 tokens: too long
    start[10], end[12] = 1.0, 1.0
    packs = {"sequence_ids": np.ones((1, 42), np.int64), "cls_positions": np.zeros((1, 1), np.int64),
             "example_ids": np.zeros((1, 1), np.int64), "feature_ids": np.zeros((1, 1), np.int64),
             "offsets": offsets[None]}
    search = AnswerSearch(max_answer_length=30)
    search.add(start[None], end[None], packs)
    score, _, first, last = search.n_best(0)[0]
    # tokens 1 .. 40 (score 100) and 10 .. 40 (51) are over 30 tokens long; 1 .. 12 is the best that is not
    assert score == 51.0 and (first, last) == (0, 23)
