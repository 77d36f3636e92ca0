"""Question + context windows, as transformers' run_qa.py makes its features, in the worker processes
(write/workers.py): a chunk of a split's questions -> its instance file.

Each worker builds the model's tokenizer once (`start_windows`), as run_qa.py calls BertTokenizerFast:

    tokenizer(question, context, truncation="only_second", max_length=S, stride=doc_stride,
              return_overflowing_tokens=True, return_offsets_mapping=True)

that is the tokenizer's own normalizer, pre-tokenizer, WordPiece and post-processor ([CLS] question [SEP] context
[SEP], token types 0 then 1), the context cut into windows of at most S tokens, each window sharing doc_stride
context tokens with the one before (the question whole in every window), windows in context order. A question
longer than max_query_length tokens is first cut, at a word boundary, to the words whose tokens all fit (the
legacy SQuAD scripts' --max_query_length 64, which cut the question's tokens; cutting its text instead keeps the
windows exactly what the tokenizer makes of the question as stored in the examples file).

Labels (`answer_positions`, run_qa.py's rule for training features, on the first answer): where the answer's
characters lie wholly inside the window's context, start is the window's last context token starting at or
before the answer's first character and end the first context token ending at or after its last; otherwise (the
answer outside the window, or only partly inside it, or no answer) both are the window's [CLS], position 0.
run_qa.py's own loop can step past the context onto the final [SEP] when the answer starts on the window's last
context token (its "edge case" comment); here the search stays inside the context, so that label is that token. The
answer's first and last characters are its first and last that a token may hold (`_no_tokens`): an uncased tokenizer
strips decomposed accents, so no token's offsets hold them ("Cafe\u0301" is the token "cafe" at 0..4), and BERT's
drops white space, controls and format characters (a soft hyphen, a zero-width space) and U+FFFD; counting such a
character would make the end the next token ("Cafe\u0301 au", "Cafe\u00ad au") or the start the one before; the
prediction takes trailing combining marks back (answers.py `marks_end`).

Offsets: each context token's [start, end) characters in its context (the tokenizer's offset mapping, as
return_offsets_mapping gives it); -1 for every other token. The instances carry start_positions and end_positions
relative to the window (the writer moves them to the pack position), example_ids (the question's row),
feature_ids (the window's place in the chunk, made the split's row by `shift_feature_ids`) and the offsets as a
per-token column. Tokenizing is deterministic, so the chunks do not depend on the workers.
"""

from __future__ import annotations

import unicodedata
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import DataError
from ..instance_files import Instances, load_instances, save_instances
from ..vocab import TokenizerSpec
from .encode import build_encoder

MAX_SEQ_LENGTH = 384
"""--max-seq-length's default for question answering (run_qa.py's)."""
DOC_STRIDE = 128
"""--doc-stride's default (run_qa.py's)."""
MAX_QUERY_LENGTH = 64
"""--max-query-length's default (the legacy SQuAD scripts')."""

CHUNK_QUESTIONS = 1 << 11
"""Questions of a split per worker task (bounds a task's memory: a SQuAD context yields a few windows of S
tokens, each token with two offsets; does not change the output)."""

NO_OFFSET = -1
"""The offsets of a token that is not the context's."""

_WORKER: Dict[str, object] = {}


def check_window_settings(max_seq_length: int, doc_stride: int, max_query_length: int) -> None:
    """Refuse settings that leave a window no context token to move on by: a window holds [CLS] question [SEP] ...
    [SEP], at most max_query_length + 3 tokens besides the context, and the context must advance by at least one
    token from window to window (doc_stride shared tokens)."""
    if max_query_length < 1:
        raise DataError("--max-query-length must be >= 1, got %d" % max_query_length)
    if doc_stride < 0:
        raise DataError("--doc-stride must be >= 0, got %d" % doc_stride)
    room = max_seq_length - max_query_length - 3  # context tokens of a window with the longest question
    if doc_stride >= room:
        raise DataError("--doc-stride %d must be less than --max-seq-length %d - --max-query-length %d - 3 = %d (the "
                        "context tokens of a window beside the longest question)"
                        % (doc_stride, max_seq_length, max_query_length, room))


def hint_options(max_seq_length: int) -> str:
    """`prepare`'s window options for S: run_qa.py's doc stride (DOC_STRIDE) where the windows leave room for it,
    else half the context tokens of a window beside the longest question (check_window_settings accepts it)."""
    room = max_seq_length - MAX_QUERY_LENGTH - 3
    return " --doc-stride %d" % (DOC_STRIDE if DOC_STRIDE < room else max(0, room // 2))


def start_windows(spec: TokenizerSpec, max_seq_length: int, doc_stride: int, max_query_length: int) -> None:
    """A worker's state for `window_chunk` (the tokenizers are built at the first chunk)."""
    _WORKER.clear()
    _WORKER.update(spec=spec, max_seq_length=max_seq_length, doc_stride=doc_stride, max_query_length=max_query_length,
                   tokenizers=None)


def build_window_tokenizers(spec: TokenizerSpec, max_seq_length: int, doc_stride: int):
    """(pair tokenizer: run_qa.py's call, see the module notes; question tokenizer: no special tokens, no
    truncation, to measure and cut a question)."""
    pair = build_encoder(spec, max_seq_length, stride=doc_stride, strategy="only_second")
    alone = build_encoder(spec, max_seq_length)
    alone.no_truncation()
    return pair, alone


def cut_question(tokenizer, question: str, max_query_length: int, where: str) -> Optional[str]:
    """The question cut to its whole words whose tokens fit in max_query_length (None: it fits as it is)."""
    encoding = tokenizer.encode(question, add_special_tokens=False)
    if len(encoding.ids) <= max_query_length:
        return None
    words = encoding.word_ids
    first = max_query_length  # the first token of the word that does not fit whole
    while first > 0 and words[first - 1] == words[max_query_length]:
        first -= 1
    if first == 0:
        raise DataError("%s: the question's first word alone is more than --max-query-length %d tokens"
                        % (where, max_query_length))
    return question[:encoding.offsets[first][0]].rstrip()


def _no_tokens(char: str) -> bool:
    """Whether ``char`` may be held by no token: white space, what BERT's tokenizer drops (controls and format
    characters such as a soft hyphen or a zero-width space, NUL, U+FFFD) and a combining mark (an uncased tokenizer
    strips accents). Such characters at an answer's edges are not counted in its labels."""
    return char.isspace() or char == "\ufffd" or unicodedata.category(char).startswith("C") or \
        bool(unicodedata.combining(char))


def answer_positions(sequence_ids: Sequence[Optional[int]], offsets: Sequence[Tuple[int, int]],
                     answer_start: Optional[int], answer_text: Optional[str]) -> Tuple[int, int]:
    """(start, end) token positions in one window (module notes: run_qa.py's rule, kept inside the context);
    (0, 0), the window's [CLS], when the answer is not wholly inside it or there is none."""
    context = [t for t, s in enumerate(sequence_ids) if s == 1]
    if answer_start is None or answer_text is None or not context:
        return 0, 0
    first, last = context[0], context[-1]
    begin, length = 0, len(answer_text)
    while length - begin > 1 and _no_tokens(answer_text[length - 1]):
        length -= 1
    while length - begin > 1 and _no_tokens(answer_text[begin]):
        begin += 1
    start_char, end_char = answer_start + begin, answer_start + length
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return 0, 0
    t = first
    while t <= last and offsets[t][0] <= start_char:
        t += 1
    start = t - 1
    t = last
    while t >= first and offsets[t][1] >= end_char:
        t -= 1
    end = t + 1
    if end < start:  # an answer of white space only, between two tokens: no token holds it
        return 0, 0
    return start, end


def window_examples(pair, cls_id: int, questions: Sequence[str], contexts: Sequence[str],
                    answers: Sequence[Tuple[Optional[int], Optional[str]]], where: str):
    """Tokenize a batch of (question, context) into windows -> (tokens (T,) int32, lengths (n,), a_lengths (n,),
    starts (n,), ends (n,) relative to the window, example index (n,) into the batch, offsets (T, 2) int32)."""
    encodings = pair.encode_batch(list(zip(questions, contexts)), add_special_tokens=True)
    tokens: List[np.ndarray] = []
    offsets: List[np.ndarray] = []
    lengths, a_lengths, starts, ends, owner = [], [], [], [], []
    for i, encoding in enumerate(encodings):
        for window in [encoding] + list(encoding.overflowing):
            ids = window.ids
            if not ids or ids[0] != cls_id:
                raise DataError("%s: the tokenizer's post-processor does not start a sequence with [CLS] (id %d): "
                                "not a BERT tokenizer" % (where, cls_id))
            sequence_ids = window.sequence_ids
            spans = window.offsets
            start, end = answer_positions(sequence_ids, spans, *answers[i])
            mine = np.full((len(ids), 2), NO_OFFSET, dtype=np.int32)
            context = [t for t, s in enumerate(sequence_ids) if s == 1]
            if context:
                mine[context] = np.asarray([spans[t] for t in context], dtype=np.int32)
            tokens.append(np.asarray(ids, dtype=np.int32))
            offsets.append(mine)
            lengths.append(len(ids))
            a_lengths.append(len(ids) - sum(window.type_ids))
            starts.append(start)
            ends.append(end)
            owner.append(i)
    as_int = lambda values: np.asarray(values, dtype=np.int32)  # noqa: E731
    return (np.concatenate(tokens) if tokens else np.zeros(0, np.int32), as_int(lengths), as_int(a_lengths),
            as_int(starts), as_int(ends), as_int(owner),
            np.concatenate(offsets) if offsets else np.zeros((0, 2), np.int32))


def window_chunk(index: int, first_row: int, questions: List[str], contexts: List[str],
                 answers: List[Tuple[Optional[int], Optional[str]]], where: List[str], path: str
                 ) -> Tuple[np.ndarray, List[Tuple[int, str]], int]:
    """Worker: questions first_row, first_row + 1, ... of a split -> their windows' instance file at `path`;
    returns (lengths (n,) uint16 or int32, [(row, the question as cut)] for the questions cut to max_query_length,
    windows without the answer)."""
    spec = _WORKER["spec"]
    s = int(_WORKER["max_seq_length"])
    if _WORKER["tokenizers"] is None:
        _WORKER["tokenizers"] = build_window_tokenizers(spec, s, int(_WORKER["doc_stride"]))
    pair, alone = _WORKER["tokenizers"]
    cut = []
    questions = list(questions)
    for i, question in enumerate(questions):
        shorter = cut_question(alone, question, int(_WORKER["max_query_length"]), where[i])
        if shorter is not None:
            questions[i] = shorter
            cut.append((first_row + i, shorter))
    tokens, lengths, a_lengths, starts, ends, owner, offsets = window_examples(
        pair, spec.special_token_ids["[CLS]"], questions, contexts, answers, spec.source)
    n = len(lengths)
    zeros = np.zeros(n, dtype=np.int32)
    extra = {"start_positions": starts, "end_positions": ends, "example_ids": owner + np.int32(first_row),
             "feature_ids": np.arange(n, dtype=np.int32)}
    instances = Instances(tokens, lengths, a_lengths, zeros, zeros, np.zeros(0, np.int32), np.zeros(0, np.int32),
                          extra, {"offsets": offsets})
    save_instances(path, instances, len(spec.vocab))
    without = int(np.sum((starts == 0) & (ends == 0)))
    return lengths.astype(np.uint16 if s < 1 << 16 else np.int32), cut, without


def shift_feature_ids(path: str, first: int, vocab_size: int) -> None:
    """Worker: number a chunk's windows from `first` (the windows of the chunks before it) in its instance file."""
    instances = load_instances(path)
    instances.extra["feature_ids"] = instances.extra["feature_ids"] + np.int32(first)
    save_instances(path, instances, vocab_size)


__all__ = ["CHUNK_QUESTIONS", "DOC_STRIDE", "MAX_QUERY_LENGTH", "MAX_SEQ_LENGTH", "answer_positions",
           "build_window_tokenizers", "check_window_settings", "cut_question", "shift_feature_ids", "start_windows",
           "window_chunk", "window_examples"]
