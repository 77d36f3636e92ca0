"""`prepare --task question_answering` makes the windows transformers' run_qa.py makes: every window of every pack
(packed and padded) has the ids, token types and offsets of BertTokenizerFast(question, context,
truncation="only_second", max_length=S, stride=doc_stride, return_overflowing_tokens=True,
return_offsets_mapping=True), in its order, with its example (overflow_to_sample_mapping), and the answer positions
of run_qa.py's prepare_train_features; on hand-made contexts whose answers sit at the start, in the middle, at the
end, across a window boundary and outside most windows, read from SQuAD JSON and from JSON Lines, with a question
longer than --max-query-length."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from ipu_packing.data import open_dataset
from ipu_packing.data.cli import main as data_main

S, STRIDE, MAX_QUERY, K = 40, 8, 12, 3

CONTEXT_A = ("Alpha begins this context about the tokenizer. The packer places several windows in each row, and the "
             "planner chooses which ones share a row. A window holds the question and part of the context; the "
             "stride decides how many context tokens two windows share. Unbelievably long words are cut into pieces "
             "by WordPiece. The answer may sit at the very end: omega")
CONTEXT_B = ("Short context: the reader keeps offsets for every token, so the text of an answer is cut out of "
             "the context exactly.")


def _answer(context, text, occurrence=0):
    start = -1
    for _ in range(occurrence + 1):
        start = context.index(text, start + 1)
    return {"text": [text], "answer_start": [start]}


EXAMPLES = [
    ("q-start", "Which word begins the context?", CONTEXT_A, _answer(CONTEXT_A, "Alpha")),
    ("q-middle", "Who chooses which windows share a row?", CONTEXT_A, _answer(CONTEXT_A, "the planner")),
    ("q-end", "Which word ends the context?", CONTEXT_A, _answer(CONTEXT_A, "omega")),
    ("q-across", "What decides how many tokens two windows share?", CONTEXT_A,
     _answer(CONTEXT_A, "the stride decides how many context tokens two windows share")),
    ("q-subword", "Which words are cut?", CONTEXT_A, _answer(CONTEXT_A, "believably long")),
    ("q-long", "   " + " ".join(["what", "does", "the", "reader", "keep", "for", "every", "single", "token", "of",
                                 "the", "context", "when", "it", "cuts", "answers"]) + "?", CONTEXT_B,
     _answer(CONTEXT_B, "offsets")),
    ("q-short", "What is cut out?", CONTEXT_B, _answer(CONTEXT_B, "the text of an answer")),
]


def _squad(examples):
    paragraphs = {}
    for qid, question, context, answers in examples:
        paragraphs.setdefault(context, []).append({"id": qid, "question": question, "answers": [
            {"text": t, "answer_start": s} for t, s in zip(answers["text"], answers["answer_start"])]})
    return {"version": "1.1", "data": [{"title": "hand-made", "paragraphs": [
        {"context": c, "qas": qas} for c, qas in paragraphs.items()]}]}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The hand-made examples as train (SQuAD JSON) and validation (JSON Lines), an export-like uncased tokenizer
    directory (vocab.txt, tokenizer_config.json) trained on their text, and the prepared dataset."""
    from ipu_packing.data.vocab import hf_tokenizer_files, train_vocab, vocab_text

    root = tmp_path_factory.mktemp("qa")
    tokenizer = str(root / "tokenizer")
    os.makedirs(tokenizer)
    texts = [CONTEXT_A, CONTEXT_B] + [e[1] for e in EXAMPLES]
    spec = train_vocab(lambda: iter(texts * 3), 300, lower_case=True)
    with open(os.path.join(tokenizer, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write(vocab_text(spec.vocab))
    for name, content in hf_tokenizer_files(True, 512, strip_accents=True).items():
        with open(os.path.join(tokenizer, name), "w") as f:
            json.dump(content, f)
    train, validation = str(root / "train.json"), str(root / "validation.jsonl")
    with open(train, "w") as f:
        json.dump(_squad(EXAMPLES), f)
    with open(validation, "w") as f:
        for qid, question, context, answers in EXAMPLES:
            f.write(json.dumps({"id": qid, "question": question, "context": context, "answers": answers}) + "\n")
    out = str(root / "out")
    with contextlib.redirect_stdout(io.StringIO()):
        code = data_main(["prepare", "--task", "question_answering", "--train", train, "--validation", validation,
                          "--tokenizer", tokenizer, "--output", out, "--max-seq-length", str(S), "--doc-stride",
                          str(STRIDE), "--max-query-length", str(MAX_QUERY), "--max-sequences-per-pack", str(K),
                          "--workers", "1", "--quiet"])
    assert code == 0
    return tokenizer, out


def windows_of(directory):
    """{feature id: (example id, ids, token types, offsets, start, end relative to the window)} of every window."""
    ds = open_dataset(directory, as_tensors=False)
    found = {}
    for i in range(len(ds)):
        pack = ds[i]
        for j, feature in enumerate(pack["feature_ids"].tolist()):
            if feature == -1:
                continue
            first = int(pack["cls_positions"][j])
            end = first + int((pack["sequence_ids"] == j + 1).sum())
            assert feature not in found
            found[feature] = (int(pack["example_ids"][j]), pack["input_ids"][first:end].tolist(),
                              pack["token_type_ids"][first:end].tolist(), pack["offsets"][first:end].tolist(),
                              int(pack["start_positions"][j]) - first, int(pack["end_positions"][j]) - first)
    return ds, found


def run_qa_positions(tokenized, i, answers, cls_id):
    """transformers' run_qa.py prepare_train_features for feature i, verbatim (pad_on_right)."""
    input_ids = tokenized["input_ids"][i]
    offsets = tokenized["offset_mapping"][i]
    cls_index = input_ids.index(cls_id)
    sequence_ids = tokenized.sequence_ids(i)
    if len(answers["answer_start"]) == 0:
        return cls_index, cls_index
    start_char = answers["answer_start"][0]
    end_char = start_char + len(answers["text"][0])
    token_start_index = 0
    while sequence_ids[token_start_index] != 1:
        token_start_index += 1
    token_end_index = len(input_ids) - 1
    while sequence_ids[token_end_index] != 1:
        token_end_index -= 1
    if not (offsets[token_start_index][0] <= start_char and offsets[token_end_index][1] >= end_char):
        return cls_index, cls_index
    while token_start_index < len(offsets) and offsets[token_start_index][0] <= start_char:
        token_start_index += 1
    start = token_start_index - 1
    while offsets[token_end_index][1] >= end_char:
        token_end_index -= 1
    return start, token_end_index + 1


def reference(tokenizer_dir, questions):
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast.from_pretrained(tokenizer_dir)
    contexts = [e[2] for e in EXAMPLES]
    return tokenizer, tokenizer(questions, contexts, truncation="only_second", max_length=S, stride=STRIDE,
                                return_overflowing_tokens=True, return_offsets_mapping=True)


@pytest.mark.parametrize("split", ["train", "validation"])
def test_every_window_is_the_tokenizers_with_run_qas_labels(prepared, split):
    tokenizer_dir, out = prepared
    ds, _ = windows_of(os.path.join(out, split, "packed"))
    from ipu_packing.data.finetune.questions import read_examples

    questions = [e.question for e in read_examples(ds.directory, ds.manifest)]
    tokenizer, tokenized = reference(tokenizer_dir, questions)
    cls_id = tokenizer.cls_token_id
    mapping = tokenized["overflow_to_sample_mapping"]
    cases = {"inside": 0, "cls": 0, "edge": 0}
    for kind in ("packed", "padded"):
        ds, found = windows_of(os.path.join(out, split, kind))
        assert sorted(found) == list(range(len(tokenized["input_ids"])))  # every window once, in run_qa's order
        for i in range(len(tokenized["input_ids"])):
            example, ids, types, offsets, start, end = found[i]
            assert example == mapping[i]
            assert ids == tokenized["input_ids"][i] and types == tokenized["token_type_ids"][i], (kind, i)
            sequence_ids = tokenized.sequence_ids(i)
            assert offsets == [list(o) if s == 1 else [-1, -1]
                               for o, s in zip(tokenized["offset_mapping"][i], sequence_ids)], (kind, i)
            answers = EXAMPLES[mapping[i]][3]
            theirs = run_qa_positions(tokenized, i, answers, cls_id)
            if theirs[0] < len(ids) and sequence_ids[theirs[0]] is None and theirs[0] != 0:
                # run_qa.py's edge case: an answer starting on the window's last context token steps onto [SEP]
                assert theirs[0] == len(ids) - 1 and (start, end) == (len(ids) - 2, theirs[1]), (kind, i)
                cases["edge"] += 1
                continue
            assert (start, end) == theirs, (kind, i)
            if start == 0:
                cases["cls"] += 1
                continue
            cases["inside"] += 1
            context = EXAMPLES[mapping[i]][2]
            text = context[offsets[start][0]:offsets[end][1]]
            assert answers["text"][0] in text and len(text) <= len(answers["text"][0]) + 12, (text, answers)
    assert cases["inside"] and cases["cls"] and cases["edge"], cases  # every case is exercised


def test_answers_at_the_start_middle_end_and_across_a_window_boundary(prepared):
    """Per hand-made question: how many windows hold its answer whole, and the answer's text from the offsets."""
    _, out = prepared
    ds, found = windows_of(os.path.join(out, "validation", "packed"))
    from ipu_packing.data.finetune.questions import read_examples

    examples = read_examples(ds.directory, ds.manifest)
    by_example = {}
    for feature, (example, ids, types, offsets, start, end) in sorted(found.items()):
        text = examples[example].context[offsets[start][0]:offsets[end][1]] if start else None
        by_example.setdefault(examples[example].id, []).append(text)
    assert by_example["q-start"][0] == "Alpha" and set(by_example["q-start"][1:]) == {None}
    assert by_example["q-end"][-1] == "omega" and set(by_example["q-end"][:-1]) == {None}
    middle = by_example["q-middle"]
    assert "the planner" in middle and len(middle) >= 3 and None in middle  # outside most windows
    across = by_example["q-across"]
    assert across.count(None) == len(across) - 1  # in one window only: the ones it crosses into point at [CLS]
    assert "believably long" not in by_example["q-subword"] and "Unbelievably long" in by_example["q-subword"]
    assert by_example["q-long"] == ["offsets"] and by_example["q-short"] == ["the text of an answer"]


def test_a_long_question_is_cut_at_a_word_boundary_to_the_query_length(prepared):
    from transformers import BertTokenizerFast

    tokenizer_dir, out = prepared
    ds = open_dataset(os.path.join(out, "train", "packed"), as_tensors=False)
    from ipu_packing.data.finetune.questions import read_examples

    examples = {e.id: e for e in read_examples(ds.directory, ds.manifest)}
    tokenizer = BertTokenizerFast.from_pretrained(tokenizer_dir)
    original = dict((e[0], e[1]) for e in EXAMPLES)
    long = examples["q-long"].question
    assert original["q-long"].lstrip().startswith(long) and long != original["q-long"].lstrip()
    tokens = tokenizer(long, add_special_tokens=False)["input_ids"]
    assert len(tokens) <= MAX_QUERY and tokens == tokenizer(original["q-long"].lstrip(),
                                                            add_special_tokens=False)["input_ids"][:len(tokens)]
    assert examples["q-short"].question == original["q-short"]
    assert ds.manifest["task"]["questions_truncated"] == 1


CAFE = "Cafe\u0301"  # "Café" with a decomposed accent: "e" then U+0301 COMBINING ACUTE ACCENT
ACCENTED = [
    ("decomposed-then-more", "The %s au lait is hot." % CAFE, CAFE),
    ("decomposed-in-a-longer-answer", "The %s au lait is hot." % CAFE, "The %s" % CAFE),
    ("decomposed-at-the-end", "We met at the %s" % CAFE, CAFE),
    ("composed", "The Caf\u00e9 au lait is hot.", "Caf\u00e9"),
    ("decomposed-inside", "The Cafe\u0301s au lait.", "Cafe\u0301s"),
]


@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_a_perfect_model_scores_1_on_answers_near_combining_characters(lower_case):
    """The labels of an answer that ends on a decomposed accent are its own tokens (an uncased tokenizer strips the
    accent: no token's offsets hold it), and the span a model puts its logits on is cut with the accent: a model
    whose start and end logits peak at the labels scores exact match 100."""
    import numpy as np

    from ipu_packing.data.finetune.answers import AnswerSearch, squad_metrics
    from ipu_packing.data.finetune.windows import build_window_tokenizers, window_examples
    from ipu_packing.data.vocab import TokenizerSpec

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "where", "?", "the", "cafe", "au", "lait", "is", "hot", ".",
             "we", "met", "at", "##s", "caf", "##e", "Cafe", "The", "We", "Caf", "##\u00e9", "##e\u0301"]
    spec = TokenizerSpec(vocab, lower_case)
    pair, _ = build_window_tokenizers(spec, 32, 8)
    contexts = [context for _, context, _ in ACCENTED]
    answers = [(context.index(text), text) for _, context, text in ACCENTED]
    tokens, lengths, _, starts, ends, owner, offsets = window_examples(
        pair, 2, ["where?"] * len(contexts), contexts, answers, "test")
    n, width = len(lengths), int(lengths.max())
    packs = {"sequence_ids": np.zeros((n, width), np.int32), "cls_positions": np.zeros((n, 1), np.int32),
             "example_ids": owner[:, None], "feature_ids": np.arange(n, dtype=np.int32)[:, None],
             "offsets": np.full((n, width, 2), -1, np.int32)}
    start_logits, end_logits = np.zeros((n, width)), np.zeros((n, width))
    first = np.cumsum(lengths) - lengths
    for w in range(n):
        packs["sequence_ids"][w, :lengths[w]] = 1
        packs["offsets"][w, :lengths[w]] = offsets[first[w]:first[w] + lengths[w]]
        start_logits[w, starts[w]], end_logits[w, ends[w]] = 10.0, 10.0  # the labels: a perfect model
    search = AnswerSearch()
    search.add(start_logits, end_logits, packs)
    predictions = search.predictions(contexts)
    assert [predictions[i].text for i in range(len(contexts))] == [text for _, _, text in ACCENTED]
    gold = {name: [text] for name, _, text in ACCENTED}
    got = {name: predictions[i].text for i, (name, _, _) in enumerate(ACCENTED)}
    assert squad_metrics(got, gold) == {"exact_match": 100.0, "f1": 100.0}


# (id, context, answer, the characters of the context its labelled tokens cover): an answer whose first or last
# characters are ones no token holds (white space, a soft hyphen, a zero-width space, a control, U+FFFD: BERT's
# tokenizer drops them)
INVISIBLE_EDGES = [
    ("soft-hyphen-after", "The Cafe\u00ad au lait.", "Cafe\u00ad", "Cafe"),
    ("zero-width-space-after", "The Cafe\u200b au lait.", "Cafe\u200b", "Cafe"),
    ("replacement-character-after", "The Cafe\ufffd au lait.", "Cafe\ufffd", "Cafe"),
    ("nul-after", "The Cafe\x00 au lait.", "Cafe\x00", "Cafe"),
    ("space-after", "The Cafe au lait.", "Cafe ", "Cafe"),
    ("soft-hyphen-before", "The \u00adCafe au lait.", "\u00adCafe", "Cafe"),
    ("space-before", "The Cafe au lait.", " Cafe", "Cafe"),
    ("accent-and-soft-hyphen-after", "The Cafe\u0301\u00ad au lait.", "Cafe\u0301\u00ad", "Cafe"),
]


@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
@pytest.mark.parametrize("context, answer, covered", [e[1:] for e in INVISIBLE_EDGES],
                         ids=[e[0] for e in INVISIBLE_EDGES])
def test_an_answer_is_labelled_by_its_own_tokens_whatever_invisible_characters_bound_it(context, answer, covered,
                                                                                        lower_case):
    """Characters no token holds at an answer's edges do not move its labels onto the neighbouring words (counting a
    trailing soft hyphen, as run_qa.py's rule does, made the end the next token: 'Cafe\\u00ad au')."""
    from ipu_packing.data.finetune.windows import build_window_tokenizers, window_examples
    from ipu_packing.data.vocab import TokenizerSpec

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "where", "?", "the", "cafe", "au", "lait", ".", "The",
             "Cafe", "##e\u0301"]
    pair, _ = build_window_tokenizers(TokenizerSpec(vocab, lower_case), 32, 8)
    _, lengths, _, starts, ends, _, offsets = window_examples(pair, 2, ["where?"], [context],
                                                              [(context.index(answer), answer)], "test")
    assert len(lengths) == 1
    assert context[offsets[starts[0]][0]:offsets[ends[0]][1]] in (covered, covered.replace("e", "e\u0301"))
