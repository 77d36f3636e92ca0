"""The export tokenizes as training did: prepare a cased (or uncased) corpus with a vocabulary trained on it,
train a few steps, export, and transformers' AutoTokenizer on RUN/final gives the ids of `prepare`'s own
tokenizer, which are the ids in the prepared packs."""

import json
import os

import numpy as np
import pytest

from ipu_packing.data import open_dataset
from ipu_packing.data.cli import main as data_main
from ipu_packing.data.vocab import TokenizerSpec
from ipu_packing.train import load_config
from ipu_packing.train.loop import execute, plan_run

from synthetic_corpus import prepare_args, write_cased_corpus

pytestmark = pytest.mark.usefixtures("one_thread")
SENTENCES = ["Fixed a Bug in Python", "Fixed a Bug in Python.", "Zorbleflax met Guido in London, then Paris!",
             "the Parser and the compiler", "Café Zürich: naïve déjà vu, 東京"]


def _restored(pack):
    """A pack's input ids with the masked positions holding their labels again (the ids `prepare` tokenized)."""
    ids = np.array(pack["input_ids"], dtype=np.int64)
    valid = np.asarray(pack["mlm_labels"]) != -100
    ids[np.asarray(pack["mlm_positions"])[valid]] = np.asarray(pack["mlm_labels"])[valid]
    return ids[np.asarray(pack["sequence_ids"]) != 0]


@pytest.mark.parametrize("case", ["no", "yes"])
def test_autotokenizer_on_the_export_gives_the_training_ids(tmp_path, case, capsys):
    import transformers

    corpus = write_cased_corpus(str(tmp_path / "corpus.txt"))
    data = str(tmp_path / "data")
    assert data_main(prepare_args(corpus, data, "--train-vocab", "300", "--lower-case", case)) == 0
    packed = os.path.join(data, "packed")
    manifest = open_dataset(packed, as_tensors=False).manifest
    assert manifest["do_lower_case"] is (case == "yes")
    run = str(tmp_path / "run")
    config = load_config("demo", [
        "model.vocab_size=%d" % manifest["vocab_size"], "model.hidden_size=32", "model.intermediate_size=64",
        "model.num_attention_heads=2", "data.dir=%s" % data, "data.max_seq_length=32", "execution.micro_batch_size=4",
        "training.global_batch_sequences=16", "training.steps=2", "logging.progress_bar=false",
        "logging.tensorboard=false", "checkpoint.output_dir=%s" % run])
    execute(plan_run(config, open_dataset=open_dataset), log=lambda m: None)
    final = os.path.join(run, "final")
    with open(os.path.join(final, "tokenizer_config.json")) as f:
        written = json.load(f)
    assert written["do_lower_case"] is (case == "yes") and written["tokenizer_class"] == "BertTokenizer"
    assert [written[k] for k in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")] == [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert os.path.isfile(os.path.join(final, "special_tokens_map.json"))

    with open(os.path.join(packed, "vocab.txt"), encoding="utf-8") as f:
        ours = TokenizerSpec(f.read().splitlines(), manifest["do_lower_case"]).encoder()  # as prepare tokenized
    expected = ours(SENTENCES)
    for use_fast in (True, False):
        tokenizer = transformers.AutoTokenizer.from_pretrained(final, use_fast=use_fast)
        got = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in SENTENCES]
        assert got == expected, (use_fast, got, expected)
        with_specials = tokenizer("Fixed a Bug in Python")["input_ids"]
        assert with_specials == [manifest["special_token_ids"]["[CLS]"]] + expected[0] + [
            manifest["special_token_ids"]["[SEP]"]]
    vocab = ours.full.get_vocab()
    if case == "no":  # the case survives: "Python" is one token, not "python"'s pieces
        assert expected[0][-1] == vocab["Python"] and "python" not in vocab
        bare = tmp_path / "without_tokenizer_config"  # what the export held before: transformers lower-cases
        bare.mkdir()
        for name in ("config.json", "vocab.txt"):
            (bare / name).write_bytes(open(os.path.join(final, name), "rb").read())
        lowered = transformers.AutoTokenizer.from_pretrained(str(bare))("Fixed a Bug in Python",
                                                                        add_special_tokens=False)["input_ids"]
        assert lowered != expected[0]
    else:
        assert expected[0][-1] == vocab["python"]

    # and they are the ids in the packs: the corpus' closing sentence appears, whole, in some pack
    needle = "," + ",".join(map(str, expected[1])) + ","
    packs = open_dataset(packed, as_tensors=False)
    assert any(needle in "," + ",".join(map(str, _restored(packs[i]))) + "," for i in range(len(packs)))
