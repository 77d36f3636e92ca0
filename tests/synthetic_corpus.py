"""A tiny synthetic corpus and vocabulary (deterministic, no downloads) for fast tests.

    corpus, vocab = make_inputs(directory)
    python -m ipu_packing.data prepare --input CORPUS --vocab VOCAB --output DIR --max-seq-length 64 ...

The corpus is BERT format (a sentence per line, blank line between documents) built from a fixed
word list; a few long words are not in the vocabulary, so they split into "##" pieces. Random instances
without text (token ids straight into the pack format) are random_instances.py's.
"""

import os
import random

from ipu_packing.data.format import SPECIAL_TOKENS

WORDS = ("the a of to and in is was for on that with as by it at from his her an were are which this be "
         "or has had not but one their also its after first new two they who been have more other all "
         "time there when into would she only most about over years may many some between during under "
         "city world state school music team season film family history group game war river church").split()
LONG_WORDS = ["packing", "sequences", "attention", "tokenizer", "wordpiece", "masking", "contamination"]


def write_vocab(path):
    specials = list(SPECIAL_TOKENS) + ["[unused0]"]  # first, so their ids are format.py's
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [".", ","]
    tokens = specials + letters + ["##" + c for c in letters] + WORDS + ["pack", "##ing", "sequence", "##s"]
    seen, unique = set(), []
    for t in tokens:
        if t not in seen:
            seen.add(t)
            unique.append(t)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(unique) + "\n")
    return path


def sentence(rng):
    words = [rng.choice(WORDS + LONG_WORDS) for _ in range(rng.randint(3, 18))]
    return " ".join(words).capitalize() + "."


def write_bert_corpus(path, documents=60, seed=0):
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(documents):
            for _ in range(rng.randint(1, 14)):
                f.write(sentence(rng) + "\n")
            f.write("\n")
    return path


def make_inputs(directory):
    os.makedirs(directory, exist_ok=True)
    vocab = write_vocab(os.path.join(directory, "vocab.txt"))
    corpus = write_bert_corpus(os.path.join(directory, "corpus.txt"))
    return corpus, vocab
