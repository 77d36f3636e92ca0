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


# ---- a corpus of the user's own, cased (tests/test_data_own_vocab.py, test_export_tokenizer.py) -------------

CASED_NAMES = ["Python", "Bug", "Fixed", "Zorbleflax", "Guido", "Release", "Parser", "Compiler", "London", "Paris"]
CASED_WORDS = "the a of to and in is was for on that with as by it at from new two has had not but".split()


def write_cased_corpus(path, documents=80, seed=0):
    """BERT format, with capitalised names and one made-up word (Zorbleflax) that no other vocabulary holds."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(documents):
            for _ in range(rng.randint(2, 9)):
                words = [rng.choice(CASED_NAMES if rng.random() < 0.4 else CASED_WORDS)
                         for _ in range(rng.randint(4, 14))]
                f.write(" ".join(words) + ".\n")
            f.write("Fixed a Bug in Python.\n\n")
    return path


def prepare_args(corpus, output, *extra):
    return ["prepare", "--input", corpus, "--output", output, "--max-seq-length", "32", "--max-sequences-per-pack",
            "3", "--dupe-factor", "2", "--workers", "1", "--quiet"] + list(extra)
