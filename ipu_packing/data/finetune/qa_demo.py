"""The embedded question-answering demo task: cloze questions on passages of the default corpus (data/text/corpus.py:
the standard library's docstrings), in SQuAD v1.1's format. Nothing is downloaded.

Recipe (`demo_questions`):

1. Passages: each standard-library file's docstring sentences (white space folded to single spaces), in order, cut
   into consecutive runs of MIN_WORDS_PER_CONTEXT to MAX_WORDS_PER_CONTEXT words (a sentence that would take a
   run past the maximum starts the next one; a run that never reaches the minimum is dropped).
2. Questions (SQuAD asks several per paragraph too): each of the passage's sentences of MIN_QUESTION_WORDS to
   MAX_QUESTION_WORDS words that occurs exactly once in the whole standard library and holds an answer word
   (letters only, at least MIN_ANSWER_LETTERS of them, a whole word, not a stop word (STOP_WORDS), once in the
   sentence, and such that the sentence with it blanked out matches one place of the passage only: the question
   has one answer), in passage order, gives a question for each of a seeded choice of up to ANSWERS_PER_SENTENCE
   of its answer words (in sentence order). The question is the sentence with that word replaced by BLANK; the
   answer is the word, at its place in the passage (answer_start: its first character in the context). A
   question's id is module-passage-sentence-character (the answer's first character in its sentence).
3. Splits: the passages in a seeded order; their questions fill the train split to TRAIN_QUESTIONS, then the
   following passages' the validation split to VALIDATION_QUESTIONS (a passage's questions are in one split
   only; the last passage of a split may give fewer than all of its). Seed DEMO_SEED, its own: prepare's --seed
   changes the packing only.

Why it is learnable: the question is a sentence of its own context with one word blanked out, so the answer is
found by matching: the passage's sentence that shares the question's words, in the question's order, holds the
answer where the question holds the blank; in a short passage (mostly the question's sentence and at most one
other), the answer is the passage word the question lacks. That is what BERT's attention does (a token attends to
the equal token of the other segment), and a skill SQuAD asks for too (many SQuAD answers sit in the sentence
that shares the question's words); the answer is never guessable from the question alone (the blanked word is
not in it). `align` solves it by exactly that matching (a regular expression of the question's words around the
blank over the context): it answers every question of both splits (docs/data.md gives the command), so the
questions are well posed; a model must learn the matching from the examples. The passages are short (6 to 24
words) because the demo BERT (2 layers, hidden 64, 350 pretraining steps) learns the matching there: its
validation exact match sits near a random guess for about 3,000 steps, then jumps to about 20 and, in some runs
(which ones depends on the seed), on to about 53: what telling the passage's words found in the question from
the others gives (`guess_levels`; docs/finetuning.md, question answering, has the runs). On passages of 15 to 40
words it stayed near a random guess for 5,000 steps.

The files (`write_qa_demo`) are SQuAD v1.1 JSON (train.json and validation.json, one article per standard-library
file, one paragraph per passage); the QA task's `prepare --input default` writes them into its work directory
and reads them from there.
"""

from __future__ import annotations

import json
import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...errors import DataError

DEMO_SEED = 2107
"""The demo task's own seed."""
TRAIN_QUESTIONS = 20000
VALIDATION_QUESTIONS = 300
MIN_WORDS_PER_CONTEXT, MAX_WORDS_PER_CONTEXT = 6, 24
MIN_QUESTION_WORDS, MAX_QUESTION_WORDS = 6, 24
MIN_ANSWER_LETTERS = 4
ANSWERS_PER_SENTENCE = 3
BLANK = "___"
"""What stands for the answer in a question."""
STOP_WORDS = frozenset((
    "about above after again against also although among another because been before being below between both "
    "cannot could does doing down during each either else even ever every from further have having here however "
    "into itself just many might more most much must neither never none only other otherwise over same should "
    "since some such than that their them then there these they this those though through thus under until upon "
    "very were what when where whether which while whom whose will with within without would your yours").split())
"""Words never chosen as answers (no content of their own)."""

_WORD = re.compile(r"[A-Za-z]+")


def documents() -> List[Tuple[str, List[str]]]:
    """(module, its docstring sentences, white space folded) of every standard-library file, in corpus order."""
    from ..text.corpus import stdlib_documents

    out = []
    for module, document in stdlib_documents():
        out.append((module, [" ".join(sentence.split()) for sentence in document]))
    return out


def _runs(sentences: List[str]) -> List[List[str]]:
    """Consecutive runs of sentences of MIN_WORDS_PER_CONTEXT to MAX_WORDS_PER_CONTEXT words."""
    runs, current, words = [], [], 0
    for sentence in sentences:
        n = len(sentence.split())
        if current and words + n > MAX_WORDS_PER_CONTEXT:
            if words >= MIN_WORDS_PER_CONTEXT:
                runs.append(current)
            current, words = [], 0
        if n > MAX_WORDS_PER_CONTEXT:
            continue
        current.append(sentence)
        words += n
    if current and words >= MIN_WORDS_PER_CONTEXT:
        runs.append(current)
    return runs


def _content_word(word: str) -> bool:
    """Whether a word (letters only) can be an answer: at least MIN_ANSWER_LETTERS letters, not a stop word."""
    return len(word) >= MIN_ANSWER_LETTERS and word.lower() not in STOP_WORDS


def _answer_words(sentence: str, context: str) -> List[Tuple[int, str]]:
    """(first character, word) of each word of `sentence` that may be an answer in `context` (recipe step 2)."""
    found = [(m.start(), m.group()) for m in _WORD.finditer(sentence)]
    counts: Dict[str, int] = {}
    for _, word in found:
        counts[word] = counts.get(word, 0) + 1
    out = []
    for start, word in found:
        before = sentence[start - 1] if start else " "
        after = sentence[start + len(word)] if start + len(word) < len(sentence) else " "
        whole = not (before.isalnum() or before in "_.'-") and not (after.isalnum() or after in "_'-")
        if (whole and _content_word(word) and counts[word] == 1
                and _one_place(sentence[:start], sentence[start + len(word):], context)):
            out.append((start, word))
    return out


def demo_questions(seed: int = DEMO_SEED) -> Dict[str, List[Dict[str, object]]]:
    """{split: [{"title", "context", "id", "question", "answer", "answer_start"}]} of the demo task (the module
    notes' recipe)."""
    files = documents()
    counts: Dict[str, int] = {}
    for _, sentences in files:
        for sentence in sentences:
            counts[sentence] = counts.get(sentence, 0) + 1
    rng = np.random.default_rng(seed)
    made = []  # per passage, its questions
    number = 0  # passages so far: a question's id is its passage's and its sentence's number
    for module, sentences in files:
        for run in _runs(sentences):
            number += 1
            context = " ".join(run)
            answerable = {i: _answer_words(s, context) for i, s in enumerate(run)
                          if counts[s] == 1 and MIN_QUESTION_WORDS <= len(s.split()) <= MAX_QUESTION_WORDS}
            choices = [i for i, words in answerable.items() if words]
            if not choices:
                continue
            questions = []
            for i in choices:
                sentence = run[i]
                words = answerable[i]
                for k in sorted(rng.permutation(len(words))[:ANSWERS_PER_SENTENCE].tolist()):
                    start, word = words[k]
                    at = len(" ".join(run[:i])) + (1 if i else 0) + start
                    assert context[at:at + len(word)] == word
                    questions.append({"title": module, "context": context, "question": sentence[:start] + BLANK
                                      + sentence[start + len(word):], "answer": word, "answer_start": at,
                                      "id": "%s-%d-%d-%d" % (module, number, i, start)})
            made.append(questions)
    splits: Dict[str, List[Dict[str, object]]] = {"train": [], "validation": []}
    wanted = (("train", TRAIN_QUESTIONS), ("validation", VALIDATION_QUESTIONS))
    order = iter(rng.permutation(len(made)).tolist())
    for name, count in wanted:
        for index in order:
            splits[name].extend(made[index][:count - len(splits[name])])
            if len(splits[name]) == count:
                break
        if len(splits[name]) < count:
            raise DataError("the question-answering demo task: this Python's standard library gives %d questions "
                            "(%d are needed)" % (sum(len(q) for q in made), TRAIN_QUESTIONS + VALIDATION_QUESTIONS))
    return splits


def squad_json(questions: List[Dict[str, object]]) -> Dict[str, object]:
    """SQuAD v1.1 JSON of a split's questions: an article per module (in order of first appearance), a paragraph
    per passage."""
    articles: Dict[str, List[Dict[str, object]]] = {}
    for q in questions:
        articles.setdefault(str(q["title"]), []).append({
            "context": q["context"],
            "qas": [{"id": q["id"], "question": q["question"],
                     "answers": [{"text": q["answer"], "answer_start": q["answer_start"]}]}]})
    return {"version": "1.1", "data": [{"title": title, "paragraphs": paragraphs}
                                        for title, paragraphs in articles.items()]}


def write_qa_demo(directory: str, seed: int = DEMO_SEED) -> Dict[str, str]:
    """Write the demo task as DIRECTORY/train.json and validation.json (SQuAD v1.1 JSON; the directory is made if
    needed); returns {split: path}."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, questions in demo_questions(seed).items():
        paths[name] = os.path.join(directory, name + ".json")
        with open(paths[name], "w", encoding="utf-8", newline="\n") as f:
            json.dump(squad_json(questions), f, ensure_ascii=False, sort_keys=True)
            f.write("\n")
    return paths


def guess_levels(questions: List[Dict[str, object]]) -> Tuple[float, float]:
    """The exact match (in percent) that two guesses without a model score on average over `questions`: a random
    content word of the passage (letters only, at least MIN_ANSWER_LETTERS, not a stop word: what an answer can
    be), and a random one of those that is not a word of the question. A model that only tells the passage's words
    found in the question from the others scores about the second.

        python -c "from ipu_packing.data.finetune.qa_demo import *; print(guess_levels(demo_questions()['validation']))"
    """
    anywhere, absent = [], []
    for q in questions:
        words = {w for w in _WORD.findall(str(q["context"])) if _content_word(w)}
        rest = words - set(_WORD.findall(str(q["question"])))
        anywhere.append(100.0 * (str(q["answer"]) in words) / max(1, len(words)))
        absent.append(100.0 * (str(q["answer"]) in rest) / max(1, len(rest)))
    return float(np.mean(anywhere)), float(np.mean(absent))


def align(question: str, context: str) -> Optional[str]:
    """The demo's questions solved by matching (module notes): the word of `context` standing where the question
    has BLANK, between the question's words before and after it; None where the context has no such place."""
    before, _, after = question.partition(BLANK)
    match = re.search(_blanked(before, after), context)
    return match.group(1) if match else None


def _one_place(before: str, after: str, context: str) -> bool:
    """Whether the question `before` BLANK `after` matches one place of `context` (it matches at least one: its
    own sentence). A match holds `before` and `after` at its own places, so a text that occurs once decides it."""
    for text in (before, after):
        if text and context.find(text) == context.rfind(text):
            return True
    return len(re.findall(_blanked(before, after), context)) == 1


def _blanked(before: str, after: str) -> str:
    """The pattern of a question's words around its blank, the blank a word."""
    return re.escape(before) + r"([A-Za-z]+)" + re.escape(after)


__all__ = ["BLANK", "align", "demo_questions", "guess_levels", "squad_json", "write_qa_demo"]
