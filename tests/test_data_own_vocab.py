"""`prepare` on a corpus of the user's own: a vocabulary is asked for (--vocab PATH or --train-vocab N),
--train-vocab trains on that input, deterministically and in either case, and the manifest says which; a vocab.txt
with a UTF-8 BOM reads as without it (data/vocab.py drops a BOM before the first token)."""

import json
import os
import subprocess
import sys

import pytest

from existing_datasets import pack_args
from ipu_packing.data.cli import main
from synthetic_corpus import prepare_args, write_cased_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _manifest(output):
    with open(os.path.join(output, "packed", "manifest.json")) as f:
        return json.load(f)


def _vocab(output):
    with open(os.path.join(output, "packed", "vocab.txt"), encoding="utf-8") as f:
        return f.read().splitlines()


def test_own_corpus_without_a_vocabulary_is_refused_naming_both_options(tmp_path, capsys):
    corpus = write_cased_corpus(str(tmp_path / "corpus.txt"))
    output = str(tmp_path / "out")
    assert main(prepare_args(corpus, output)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert corpus in err and "--vocab PATH" in err and "--train-vocab N" in err, err
    assert not os.path.exists(output)
    assert main(prepare_args(corpus, output, "--vocab", "default", "--train-vocab", "500")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exclude each other" in err, err


def test_train_vocab_trains_on_the_input_keeps_the_case_asked_for_and_is_deterministic(tmp_path, capsys):
    corpus = write_cased_corpus(str(tmp_path / "corpus.txt"))
    cased = str(tmp_path / "cased")
    assert main(prepare_args(corpus, cased, "--train-vocab", "300", "--lower-case", "no")) == 0
    vocab = _vocab(cased)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert {"Python", "Zorbleflax", "Fixed"} <= set(vocab)  # the input's own words, with their case
    assert "python" not in vocab and "def" not in vocab  # nothing of the default (CPython docstrings) corpus
    manifest = _manifest(cased)
    assert manifest["do_lower_case"] is False and manifest["vocab_size"] == len(vocab) <= 300
    assert manifest["recipe"]["vocab_source"] == "WordPiece trained on %s, %d tokens, cased" % (corpus, len(vocab))

    uncased = str(tmp_path / "uncased")
    assert main(prepare_args(corpus, uncased, "--train-vocab", "300")) == 0  # --lower-case auto: lower-cased
    assert _manifest(uncased)["do_lower_case"] is True
    assert "zorbleflax" in _vocab(uncased) and not any(ch.isupper() for t in _vocab(uncased)[5:] for ch in t)

    # the same input gives the same vocab.txt bytes in another process with another hash seed
    again = str(tmp_path / "again")
    run = subprocess.run([sys.executable, "-m", "ipu_packing.data"] + prepare_args(
        corpus, again, "--train-vocab", "300", "--lower-case", "no"), cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, PYTHONHASHSEED="123", PYTHONPATH=ROOT), timeout=300)
    assert run.returncode == 0, run.stderr
    with open(os.path.join(cased, "packed", "vocab.txt"), "rb") as a, \
            open(os.path.join(again, "packed", "vocab.txt"), "rb") as b:
        assert a.read() == b.read()
    assert _manifest(again)["vocab_checksum"] == manifest["vocab_checksum"]


def test_vocab_from_a_tokenizer_directory_reads_its_casing(tmp_path, capsys):
    corpus = write_cased_corpus(str(tmp_path / "corpus.txt"))
    first = str(tmp_path / "first")
    assert main(prepare_args(corpus, first, "--train-vocab", "300", "--lower-case", "no")) == 0
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "vocab.txt").write_text("\n".join(_vocab(first)) + "\n", encoding="utf-8")
    (hf / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}), encoding="utf-8")
    out = str(tmp_path / "from_hf")
    assert main(prepare_args(corpus, out, "--vocab", str(hf))) == 0
    assert _manifest(out)["do_lower_case"] is False and _vocab(out) == _vocab(first)


# -- vocab.txt with a UTF-8 BOM ----------------------------------------------------------------------------

@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_a_vocab_with_a_bom_is_read_as_without(newline, pack_inputs, tmp_path, capsys):
    with open(pack_inputs["vocab"], encoding="utf-8") as f:
        tokens = f.read().split()
    bom = tmp_path / "bom-vocab.txt"
    bom.write_bytes(b"\xef\xbb\xbf" + newline.join(tokens).encode("utf-8") + newline.encode())
    inputs = dict(pack_inputs, vocab=str(bom))
    assert main(pack_args(inputs, tmp_path / "out")) == 0, capsys.readouterr().err
    with open(str(tmp_path / "out" / "packed" / "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["special_token_ids"] == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    with open(str(tmp_path / "out" / "packed" / "vocab.txt"), "rb") as f:
        assert f.read() == ("\n".join(tokens) + "\n").encode("utf-8")
