"""A vocabulary's identity is its content (data/vocab.py): a dataset's vocab.txt is what its manifest says,
a tokenizer directory's tokenizer.json and vocab.txt are one vocabulary, the accents `prepare` stripped (or
kept) are what the export's tokenizer strips, and two vocabularies are compared token by token.

Every row is one case; its action returns the one line the code gives (an error, a difference) or "same",
and the row says what that line must contain."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.data.cli import main as data_main
from ipu_packing.errors import UserError
from ipu_packing.fsutil import sha256_file

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return fx.write_prepared(str(tmp_path_factory.mktemp("vocab")), S=32, K=3, V=64, num_sequences=60)


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def _write_lines(path, lines, ending="\n", bom=False):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(("\ufeff" if bom else "") + "".join(line + ending for line in lines))


def _refusal(action):
    """The one line `action` is refused with (UserError), or "accepted"."""
    try:
        action()
    except UserError as error:
        message = str(error)
        assert "\n" not in message, message
        return message
    return "accepted"


# -- a dataset's vocab.txt against its own manifest (the vocab_checksum rewritten: only the content check can
#    refuse it) --------------------------------------------------------------------------------------------

def dataset_vocab(change):
    def action(prepared, tmp_path, capsys):
        directory = str(tmp_path / "packed")
        shutil.copytree(os.path.join(prepared, "packed"), directory)
        path = os.path.join(directory, "vocab.txt")
        _write_lines(path, change(_lines(path)))
        with open(os.path.join(directory, "manifest.json")) as f:
            manifest = json.load(f)
        manifest["vocab_checksum"] = sha256_file(path)
        with open(os.path.join(directory, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        line = _refusal(lambda: open_dataset(directory))
        if line != "accepted":  # inspect says the same
            assert data_main(["inspect", directory]) == 2
            assert capsys.readouterr().err == "error: %s\n" % line
        return line
    return action


def _swap(i, j):
    def change(lines):
        lines[i], lines[j] = lines[j], lines[i]
        return lines
    return change


def _set(i, token):
    def change(lines):
        lines[i] = token
        return lines
    return change


# -- a tokenizer directory whose tokenizer.json and vocab.txt disagree --------------------------------------

WORDS = ["the", "a", "cafe", "café", "Café", "uber", "über", "Über", "naive", "naïve", "zurich", "zürich", "met",
         "in", "and", ".", ",", "!", "paris", "Paris", "bug", "Bug"]
ALPHABET = sorted(set("".join(WORDS)) - set(".,!a"))
VOCAB = SPECIAL + WORDS + ALPHABET + ["##" + c for c in ALPHABET + ["a"]]


def _tokenizer_dir(path, lowercase, strip_accents, vocab_txt=None):
    """A Hugging Face tokenizer directory as BertTokenizerFast.save_pretrained writes it: tokenizer.json
    (BertNormalizer with these options over VOCAB), tokenizer_config.json (the same options) and vocab.txt (VOCAB,
    or `vocab_txt`)."""
    from tokenizers.implementations import BertWordPieceTokenizer

    os.makedirs(path)
    tokenizer = BertWordPieceTokenizer({t: i for i, t in enumerate(VOCAB)}, lowercase=lowercase,
                                       strip_accents=strip_accents)
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase, "strip_accents": strip_accents}, f)
    _write_lines(os.path.join(path, "vocab.txt"), VOCAB if vocab_txt is None else vocab_txt)
    return path


def _corpus(path):
    sentences = ["Café met über in Paris.", "the naïve Bug met the cafe in zurich!", "a Zürich café, a Paris bug.",
                 "Über the naive cafe and the Bug.", "the bug met a café in Zürich."]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(60):
            f.write(" ".join(sentences[(i + j) % len(sentences)] for j in range(3)) + "\n")
            if i % 4 == 3:
                f.write("\n")
    return path


def _prepare(tmp_path, vocab):
    out = str(tmp_path / "out")
    code = data_main(["prepare", "--input", _corpus(str(tmp_path / "corpus.txt")), "--output", out, "--vocab", vocab,
                      "--max-seq-length", "32", "--dupe-factor", "2", "--workers", "1", "--quiet"])
    return code, out


def tokenizer_directory(vocab_txt):
    def action(prepared, tmp_path, capsys):
        directory = _tokenizer_dir(str(tmp_path / "hf"), True, None, vocab_txt(list(VOCAB)))
        code, out = _prepare(tmp_path, directory)
        err = capsys.readouterr().err
        if code == 0:
            return "accepted"
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert not os.path.exists(out)
        return err[len("error: "):].strip()
    return action


# -- the accents prepare stripped are the export's ----------------------------------------------------------

def export_accents(lowercase, strip_accents):
    def action(prepared, tmp_path, capsys):
        import transformers

        from ipu_packing.data.vocab import hf_tokenizer_files, load_tokenizer, tokenizer_options

        directory = _tokenizer_dir(str(tmp_path / "hf"), lowercase, strip_accents)
        code, out = _prepare(tmp_path, directory)
        assert code == 0, capsys.readouterr().err
        with open(os.path.join(out, "packed", "manifest.json")) as f:
            manifest = json.load(f)
        export = str(tmp_path / "export")  # what the training run's export writes beside its weights
        os.makedirs(export)
        shutil.copyfile(os.path.join(out, "packed", "vocab.txt"), os.path.join(export, "vocab.txt"))
        for name, content in hf_tokenizer_files(model_max_length=32, **tokenizer_options(manifest)).items():
            with open(os.path.join(export, name), "w", encoding="utf-8") as f:
                json.dump(content, f)
        sentences = ["Café Über naïve Zürich", "the café met über", "Paris BUG"]
        ours = load_tokenizer(directory).encoder()(sentences)  # as prepare tokenized
        for cls in (transformers.BertTokenizerFast, transformers.BertTokenizer):
            theirs = [cls.from_pretrained(export)(s, add_special_tokens=False)["input_ids"] for s in sentences]
            if theirs != ours:
                return "export tokenizes %r as %s, prepare as %s (%s)" % (sentences, theirs, ours, cls.__name__)
        return "same; manifest strip_accents %s" % manifest.get("strip_accents", "absent")
    return action


# -- two vocabularies compared by content -------------------------------------------------------------------

def compared(a, b, **write):
    def action(prepared, tmp_path, capsys):
        from ipu_packing.data.vocab import vocab_path_difference

        paths = []
        for name, tokens in (("a", a), ("b", b)):
            directory = tmp_path / name
            directory.mkdir()
            if tokens is not None:
                _write_lines(str(directory / "vocab.txt"), tokens, **(write if name == "b" else {}))
            paths.append(str(directory))
        try:
            return vocab_path_difference(*paths) or "same"
        except UserError as error:
            return str(error)
    return action


def recorded_digest(change):
    """A vocabulary against the content digest a checkpoint (or a dataset's manifest) recorded."""
    def action(prepared, tmp_path, capsys):
        from ipu_packing.data.vocab import read_vocab, vocab_digest_difference

        packed = os.path.join(prepared, "packed")
        recorded = sha256_file(os.path.join(packed, "vocab.txt"))  # what checkpoints record as vocab_sha256
        path = str(tmp_path / "vocab.txt")
        lines, write = change(_lines(os.path.join(packed, "vocab.txt")))
        _write_lines(path, lines, **write)
        return vocab_digest_difference(read_vocab(path), recorded) or "same"
    return action


def export_files(change_vocab, vocab_size=None):
    """An export directory: the dataset's vocab.txt (changed by `change_vocab`), then the tokenizer files
    written beside it from the dataset's manifest; with `vocab_size`, the export's vocabulary against a model
    of that many embedding rows."""
    def action(prepared, tmp_path, capsys):
        from ipu_packing.data.vocab import check_vocab_size, write_export_tokenizer

        packed = os.path.join(prepared, "packed")
        with open(os.path.join(packed, "manifest.json")) as f:
            manifest = json.load(f)
        export = tmp_path / "final"
        export.mkdir()
        _write_lines(str(export / "vocab.txt"), change_vocab(_lines(os.path.join(packed, "vocab.txt"))))
        old = os.umask(0o027)
        try:
            if vocab_size is not None:
                check_vocab_size(str(export / "vocab.txt"), vocab_size, "model.vocab_size")
            written = write_export_tokenizer(str(export), manifest, 32)
        except UserError as error:
            return str(error)
        finally:
            os.umask(old)
        with open(str(export / "tokenizer_config.json")) as f:
            config = json.load(f)
        modes = sorted({"%o" % (os.stat(str(export / name)).st_mode & 0o777) for name in written})
        return "written %s, mode %s, do_lower_case %s, strip_accents %s" % (
            ",".join(sorted(written)), ",".join(modes), config["do_lower_case"], config["strip_accents"])
    return action


BASE = SPECIAL + ["w%d" % i for i in range(20)]

ROWS = [
    # a dataset's vocab.txt
    ("dataset-line-removed", dataset_vocab(lambda v: v[:-1]), "holds 63 tokens, but manifest field 'vocab_size'"),
    ("dataset-line-added", dataset_vocab(lambda v: v + ["extra"]), "holds 65 tokens"),
    ("dataset-mask-swapped-with-a-word", dataset_vocab(_swap(4, 10)), "gives [MASK] id 4"),
    ("dataset-cls-sep-swapped", dataset_vocab(_swap(2, 3)), "gives [CLS] id 2"),
    ("dataset-token-twice", dataset_vocab(_set(21, "tok20")), "'tok20' appears twice"),
    ("dataset-pad-renamed", dataset_vocab(_set(0, "<pad>")), "it has no [PAD]"),
    ("dataset-mask-missing", dataset_vocab(_set(4, "unmasked")), "gives [MASK] id 4"),
    ("dataset-special-token-moved", dataset_vocab(lambda v: v[:4] + [v[5], v[4]] + v[6:]), "[MASK] is on line 6"),
    # a tokenizer directory: tokenizer.json against vocab.txt
    ("tokenizer-words-swapped", tokenizer_directory(lambda v: v[:7] + [v[8], v[7]] + v[9:]),
     "first difference at id 7: 'café' (vocab.txt) against 'cafe' (tokenizer.json)"),
    ("tokenizer-vocab-txt-shorter", tokenizer_directory(lambda v: v[:-1]), "vocab.txt has %d tokens, tokenizer.json %d"
     % (len(VOCAB) - 1, len(VOCAB))),
    ("tokenizer-vocab-txt-longer", tokenizer_directory(lambda v: v + ["extra"]), "tokenizer.json %d" % len(VOCAB)),
    ("tokenizer-cased-vocab-txt", tokenizer_directory(lambda v: [t.capitalize() if t == "zurich" else t for t in v]),
     "'Zurich' (vocab.txt) against 'zurich' (tokenizer.json)"),
    # accents: what prepare did is what the export does
    ("accents-kept-uncased", export_accents(True, False), "same; manifest strip_accents False"),
    ("accents-stripped-cased", export_accents(False, True), "same; manifest strip_accents True"),
    ("accents-by-the-rule-uncased", export_accents(True, None), "same; manifest strip_accents absent"),
    ("accents-by-the-rule-cased", export_accents(False, None), "same; manifest strip_accents absent"),
    # the export: its vocab.txt is the dataset's and the model's, its tokenizer files the dataset's tokenizer
    ("export-writes-the-tokenizer", export_files(lambda v: v, vocab_size=64),
     "written special_tokens_map.json,tokenizer_config.json, mode 640, do_lower_case True, strip_accents True"),
    ("export-vocab-not-the-datasets", export_files(_swap(7, 8)), "is not the dataset's vocabulary"),
    ("export-vocab-not-the-models", export_files(lambda v: v, vocab_size=30522), "has vocab_size 30522"),
    # two vocabularies by content
    ("compare-sizes-differ", compared(BASE, BASE + ["w20"]), "has 25 tokens, "),
    ("compare-one-token-differs", compared(BASE, BASE[:9] + ["W4"] + BASE[10:]),
     "first difference at id 9: 'w4'"),
    ("compare-crlf-and-bom-same-content", compared(BASE, BASE, ending="\r\n", bom=True), "same"),
    ("compare-directory-without-vocab", compared(BASE, None), "has no vocab.txt: its vocabulary cannot be checked"),
    ("digest-same-content-other-bytes", recorded_digest(lambda v: (v, {"ending": "\r\n"})), "same"),
    ("digest-other-content", recorded_digest(lambda v: (v[:-1], {})), "is not the recorded one"),
]


@pytest.mark.parametrize("name, action, words", ROWS, ids=[r[0] for r in ROWS])
def test_a_vocabulary_is_its_content(name, action, words, prepared, tmp_path, capsys):
    line = action(prepared, tmp_path, capsys)
    assert words in line, line
