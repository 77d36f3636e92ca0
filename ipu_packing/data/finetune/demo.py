"""The embedded demo task: sentences of the default corpus (data/text/corpus.py: the standard library's
docstrings), each labelled by the family of modules it documents. Nothing is downloaded.

    concurrency   asyncio, concurrent, multiprocessing, queue, sched, selectors, subprocess, threading
    mail          email, imaplib, mailbox, mimetypes, nntplib, poplib, quopri, smtplib
    networking    cgi, ftplib, http, ipaddress, socket, socketserver, ssl, urllib, wsgiref, xmlrpc
    testing       bdb, cProfile, doctest, pdb, profile, timeit, trace, traceback, unittest

Why the labels are learnable: each family documents its own things in its own words (event loops, tasks,
futures, processes; messages, headers, MIME parts, mailboxes; requests, URLs, servers, sockets; tests, assertions,
debuggers, frames), so a sentence's words say its family far more often than not, while no sentence is given away
by its form alone: every family's docstrings are the same kind of English prose.

Recipe (`demo_rows`): every sentence of those modules' docstrings, white space folded to single spaces, of 4 to 60
words, that occurs exactly once in the whole standard library (a sentence shared by two modules, such as "Return
the result.", could carry two labels, and would sit in two splits); then, per family in the order above, a seeded
permutation (numpy's default_rng(seed)) chooses PER_CLASS sentences (or as many as the smallest family has, where
it has fewer: another Python's standard library) and cuts them 80/10/10 into train, validation and test, so every
split is balanced; each split's rows are then put in a seeded random order. The files (`write_demo_task`) are TSV
with the columns sentence1 and label, as `prepare --task classification --train ... --validation ... --test ...`
reads them; `prepare --task classification --input default` writes them into its work directory and reads them
from there.
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import numpy as np

from ...errors import DataError

FAMILIES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("concurrency", ("asyncio", "concurrent", "multiprocessing", "queue", "sched", "selectors", "subprocess",
                     "threading")),
    ("mail", ("email", "imaplib", "mailbox", "mimetypes", "nntplib", "poplib", "quopri", "smtplib")),
    ("networking", ("cgi", "ftplib", "http", "ipaddress", "socket", "socketserver", "ssl", "urllib", "wsgiref",
                    "xmlrpc")),
    ("testing", ("bdb", "cProfile", "doctest", "pdb", "profile", "timeit", "trace", "traceback", "unittest")),
)
"""(label, the top-level modules whose docstrings it takes), in label order."""

PER_CLASS = 900
"""Sentences of each family: 720 train, 90 validation, 90 test."""
MIN_PER_CLASS = 100
"""Fewer sentences in a family (another Python's standard library) is refused: too few to learn from."""
MIN_WORDS, MAX_WORDS = 4, 60
SPLIT_FRACTIONS = (("train", 0.8), ("validation", 0.1), ("test", 0.1))
DEMO_SEED = 12345
"""The demo task's own seed (its examples do not change with prepare's --seed, which seeds the packing)."""


def family_sentences() -> List[Tuple[str, List[str]]]:
    """(label, its sentences in corpus order) of each family: the recipe's filter, before sampling."""
    from ..text.corpus import stdlib_documents

    family_of = {module: label for label, modules in FAMILIES for module in modules}
    counts: Dict[str, int] = {}
    found: List[Tuple[str, str]] = []  # (label, sentence) in corpus order
    for module, document in stdlib_documents():
        label = family_of.get(module)
        for sentence in document:
            text = " ".join(sentence.split())
            counts[text] = counts.get(text, 0) + 1
            if label is not None and MIN_WORDS <= len(text.split()) <= MAX_WORDS:
                found.append((label, text))
    return [(label, [text for own, text in found if own == label and counts[text] == 1]) for label, _ in FAMILIES]


def demo_rows(seed: int = DEMO_SEED) -> Dict[str, List[Tuple[str, str]]]:
    """{split: [(sentence, label)]} of the demo task (the module notes' recipe)."""
    families = family_sentences()
    per_class = min(PER_CLASS, min(len(sentences) for _, sentences in families))
    if per_class < MIN_PER_CLASS:
        label, sentences = min(families, key=lambda item: len(item[1]))
        raise DataError("the demo task: this Python's standard library has only %d sentences for %r (at least %d "
                        "are needed)" % (len(sentences), label, MIN_PER_CLASS))
    rng = np.random.default_rng(seed)
    splits: Dict[str, List[Tuple[str, str]]] = {name: [] for name, _ in SPLIT_FRACTIONS}
    for label, sentences in families:
        chosen = [sentences[i] for i in rng.permutation(len(sentences))[:per_class].tolist()]
        start = 0
        for i, (name, fraction) in enumerate(SPLIT_FRACTIONS):
            end = per_class if i == len(SPLIT_FRACTIONS) - 1 else start + int(round(fraction * per_class))
            splits[name].extend((text, label) for text in chosen[start:end])
            start = end
    for name, _ in SPLIT_FRACTIONS:
        rows = splits[name]
        splits[name] = [rows[i] for i in rng.permutation(len(rows)).tolist()]
    return splits


def write_demo_task(directory: str, seed: int = DEMO_SEED) -> Dict[str, str]:
    """Write the demo task as DIRECTORY/train.tsv, validation.tsv and test.tsv (columns sentence1, label; the
    directory is made if needed); returns {split: path}."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, rows in demo_rows(seed).items():
        paths[name] = os.path.join(directory, name + ".tsv")
        with open(paths[name], "w", encoding="utf-8", newline="\n") as f:
            f.write("sentence1\tlabel\n")
            f.writelines("%s\t%s\n" % row for row in rows)
    return paths
