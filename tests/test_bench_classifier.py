"""bench --classifier: ours (the predictor's packs, padded and packed) against transformers'
BertForSequenceClassification (padded, grouped, its pipeline) on the same texts, inference or fine-tuning steps.
Speed is reported, never asserted: the tests assert what holds whatever the speed (counts, the same logits)."""

from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest
import torch

from ipu_packing.bench import cli as bench_cli

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ("the packed model reads several short sentences in one row while the padded one wastes most of its "
         "positions on padding tokens").split()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """(model directory, input file): a random tiny BertForSequenceClassification with its tokenizer, and 40
    texts of 2 to 24 words."""
    import transformers

    directory = str(tmp_path_factory.mktemp("classifier") / "model")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS))
    os.makedirs(directory)
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    transformers.BertTokenizerFast(os.path.join(directory, "vocab.txt"), do_lower_case=True).save_pretrained(directory)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128, num_labels=3)
    transformers.BertForSequenceClassification(config).save_pretrained(directory)
    rng = np.random.default_rng(0)
    path = os.path.join(os.path.dirname(directory), "texts.tsv")
    with open(path, "w") as f:
        f.write("sentence1\n" + "".join(" ".join(rng.choice(WORDS, size=int(rng.integers(2, 25)))) + "\n"
                                        for _ in range(40)))
    return directory, path


def run_main(args):
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = bench_cli.main(args)
    finally:
        torch.set_num_threads(threads)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("train", [False, True], ids=["inference", "fine-tuning steps"])
def test_every_contender_scores_the_same_texts(classifier, train):
    directory, texts = classifier
    code, out, err = run_main(["--classifier", directory, "--input", texts, "--max-seq-length", "64",
                               "--max-sequences-per-pack", "8", "--micro-batch-size", "8", "--repeats", "1", "--json"]
                              + (["--train"] if train else []))
    assert code == 0, err
    r = json.loads(out)
    names = ["transformers padded", "transformers dynamic", "transformers grouped", "ours padded", "ours packed"]
    if not train:
        names += ["transformers pipeline", "ours predict"]
    assert [row["name"] for row in r["rows"]] == names
    assert r["inputs"] == 40 and all(row["sequences"] == 40 for row in r["rows"])
    rows = {row["name"]: row for row in r["rows"]}
    assert rows["transformers padded"]["ratio"] == 1.0
    assert rows["transformers padded"]["calls"] == 5  # 40 rows, 8 a call
    if train:
        assert rows["ours padded"]["calls"] == 5
    else:  # serving: the predictor's own packs a call (predict.packs_per_call of the model at S=64)
        import transformers

        from ipu_packing.predict import packs_per_call

        per_call = packs_per_call(transformers.BertConfig.from_pretrained(directory), 64, "cpu")
        assert r["packs_per_call"] == {"ours padded": per_call, "ours packed": per_call}
        assert rows["ours padded"]["calls"] == -(-40 // per_call)
        assert rows["ours packed"]["calls"] == -(-r["packs"] // per_call)
    assert rows["transformers padded"]["computed_tokens"] == rows["ours padded"]["computed_tokens"] == 40 * 64
    assert r["packs"] == rows["ours packed"]["computed_tokens"] // 64 < 40
    grouped, dynamic = rows["transformers grouped"]["computed_tokens"], rows["transformers dynamic"]["computed_tokens"]
    assert max(grouped, dynamic) < 40 * 64
    if not train:  # sorted by length: no more padding than in input order
        assert grouped <= dynamic
    assert rows["transformers dynamic"]["ratio_dynamic"] == rows["transformers grouped"]["ratio_grouped"] == 1.0
    assert rows["ours packed"]["sequences_per_row"] == pytest.approx(r["packing_factor"]) and r["packing_factor"] > 1
    if train:  # a step of 8 sequences: 8 rows padded, round(8 / packing factor) packs, each step one micro batch
        steps = r["packs_per_step"]
        assert steps["ours padded"] == 8 and steps["ours packed"] == max(1, int(8 / r["packing_factor"] + 0.5))
        assert r["passes"] == {name: [1] for name in steps}
        assert rows["ours packed"]["calls"] == -(-r["packs"] // steps["ours packed"])
    assert r["mode"] == ("classifier-train" if train else "classifier-inference")
    assert r["torch_threads"] == 1 and len(r["load_before"]) == 3
    if train:
        assert r["max_logit_difference"] is None and r["optimizer"]["name"] == "AdamW"
    else:
        assert r["max_logit_difference"] < 1e-5


def test_the_table_times_pairs_serving_then_fine_tuning(classifier, tmp_path):
    directory, texts = classifier
    with open(texts) as f:
        lines = f.read().splitlines()[1:]
    pairs = str(tmp_path / "pairs.tsv")
    with open(pairs, "w") as f:
        f.write("sentence1\tsentence2\n" + "".join("%s\t%s\n" % (a, b) for a, b in zip(lines, lines[1:] + lines[:1])))
    code, out, err = run_main(["--classifier", directory, "--input", pairs, "--max-seq-length", "64",
                               "--max-sequences-per-pack", "8", "--micro-batch-size", "8", "--repeats", "1", "--table",
                               "--json"])
    assert code == 0, err
    serving, training = json.loads(out)
    assert (serving["mode"], training["mode"]) == ("classifier-inference", "classifier-train")
    assert serving["pairs"] and training["pairs"] and serving["max_logit_difference"] < 1e-5  # token types too
    single = json.loads(run_main(["--classifier", directory, "--input", texts, "--max-seq-length", "64",
                                  "--max-sequences-per-pack", "8", "--repeats", "1", "--json"])[1])
    assert serving["real_tokens"] > single["real_tokens"] and serving["packs"] > single["packs"]


@pytest.mark.parametrize("args, words", [
    (["--classifier", "{dir}", "--config", "demo"], "two modes of the bench"),
    (["--classifier", "{dir}", "--histogram", "h.json"],
     "--histogram is an option of the synthetic mode, --peers and --config, not of --classifier"),
    (["--classifier", "{dir}", "--inputs", "0"], "--inputs must be >= 1"),
    (["--classifier", "{dir}", "--table", "--train"], "--table times serving and fine-tuning steps: leave out --train"),
    (["--classifier", "{dir}", "--plot", "x.png"],
     "--plot is an option of the synthetic mode and --config, not of --classifier"),
    (["--classifier", "{missing}"], "is not a directory"),
    (["--classifier", "{dir}", "--input", "{missing}"], "is not a file"),
    (["--inputs", "5"], "--inputs is an option of --classifier, not of the synthetic mode"),
    (["--train"], "--train is an option of --classifier, not of the synthetic mode"),
    (["--table"], "--table is an option of --classifier, not of the synthetic mode"),
], ids=["with --config", "with --histogram", "no inputs", "--table with --train", "a plot", "no directory",
        "no input file", "--inputs alone", "--train alone", "--table alone"])
def test_a_bad_option_is_one_line(classifier, tmp_path, args, words):
    directory, _ = classifier
    argv = [a.format(dir=directory, missing=str(tmp_path / "absent")) for a in args]
    code, out, err = run_main(argv)
    assert code == 2 and out == "", err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1, err
