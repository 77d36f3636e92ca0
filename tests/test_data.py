"""Data pipeline: packs hold every instance exactly once, unpack to the padded rows, stay inside their
own sequences, NSP is balanced, and the same seed gives the same bytes."""

import collections
import itertools
import json
import os

import numpy as np
import pytest
import torch

from ipu_packing.data import FIELDS, DataError, open_dataset
from ipu_packing.data.text.corpus import read_documents, split_sentences
from ipu_packing.data.text.recipe import (RecipeConfig, Uniforms, Vocabulary, create_instances, tokenize_documents,
                                        truncation_counts)
from ipu_packing.data.format import mlm_slots
from ipu_packing.data.text.pipeline import PrepareConfig, prepare
from ipu_packing.data.write.datasets import PackingOptions
from ipu_packing.data.vocab import load_tokenizer, train_default_vocab

from synthetic_corpus import make_inputs

S, K = 64, 3


def _prepare(tmp, name, inputs=None, **overrides):
    corpus, vocab = make_inputs(inputs or str(tmp / "inputs"))
    options = dict(input=corpus, output=str(tmp / name), max_seq_length=S, max_sequences_per_pack=K, vocab=vocab,
                   dupe_factor=3, workers=1, shard_chars=4000, shard_bytes=64 * 1024, progress=False)
    options.update(overrides)
    names = set(PackingOptions.__dataclass_fields__)
    packing = PackingOptions(**{k: v for k, v in options.items() if k in names})
    prepare(PrepareConfig(packing=packing, **{k: v for k, v in options.items() if k not in names}))
    return str(tmp / name)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return _prepare(tmp_path_factory.mktemp("data"), "out")


def _rows(directory):
    ds = open_dataset(directory, as_tensors=False)
    return ds, [ds[i] for i in range(len(ds))]


def _sequences(pack, manifest):
    """Unpack one pack by sequence_ids -> list of (k, start, end)."""
    ids = pack["sequence_ids"]
    out = []
    for k in range(1, manifest["max_sequences_per_pack"] + 1):
        where = np.flatnonzero(ids == k)
        if len(where) == 0:
            assert not (ids > k).any(), "sequence ids must be 1..n without gaps"
            break
        assert where[-1] - where[0] + 1 == len(where), "a sequence is contiguous"
        out.append((k, int(where[0]), int(where[-1]) + 1))
    assert (ids[out[-1][2]:] == 0).all(), "only padding after the last sequence"
    return out


def _unpack(pack, manifest):
    """-> one key per sequence: the sequence exactly as a padded row (K=1) would hold it."""
    keys = []
    for k, start, end in _sequences(pack, manifest):
        in_seq = (pack["mlm_positions"] >= start) & (pack["mlm_positions"] < end) & (pack["mlm_labels"] != -100)
        keys.append((pack["input_ids"][start:end].tobytes(), pack["token_type_ids"][start:end].tobytes(),
                     pack["position_ids"][start:end].tobytes(), (pack["mlm_positions"][in_seq] - start).tobytes(),
                     pack["mlm_labels"][in_seq].tobytes(), int(pack["nsp_labels"][k - 1])))
    return keys


def test_every_instance_in_exactly_one_pack_and_unpacks_to_the_padded_rows(prepared):
    packed, packs = _rows(os.path.join(prepared, "packed"))
    padded, rows = _rows(os.path.join(prepared, "padded"))
    m = packed.manifest
    assert padded.manifest["max_sequences_per_pack"] == 1 and m["max_sequences_per_pack"] == K
    assert m["num_sequences"] == padded.manifest["num_sequences"] == len(rows) > 300
    assert len(packs) == m["num_packs"] < len(rows)
    from_packs = collections.Counter(key for pack in packs for key in _unpack(pack, m))
    from_rows = collections.Counter(key for row in rows for key in _unpack(row, padded.manifest))
    assert sum(from_rows.values()) == len(rows)
    assert from_packs == from_rows
    assert m["num_tokens"] == sum(int((p["sequence_ids"] > 0).sum()) for p in packs)
    assert m["num_masked_tokens"] == sum(int((p["mlm_labels"] != -100).sum()) for p in packs)
    assert abs(m["packing_factor"] - len(rows) / len(packs)) < 1e-12


def test_positions_stay_inside_their_own_sequence(prepared):
    ds, packs = _rows(os.path.join(prepared, "packed"))
    special = ds.manifest["special_token_ids"]
    for pack in packs:
        sequences = _sequences(pack, ds.manifest)
        used = pack["nsp_labels"] != -100
        assert used.sum() == len(sequences) and used[:len(sequences)].all()
        assert (pack["cls_positions"][~used] == 0).all()
        for k, start, end in sequences:
            cls = pack["cls_positions"][k - 1]
            assert cls == start and pack["input_ids"][cls] == special["[CLS]"]
            assert (pack["position_ids"][start:end] == np.arange(end - start)).all()
            assert pack["input_ids"][end - 1] == special["[SEP]"]
        slots = pack["mlm_labels"] != -100
        n = int(slots.sum())
        assert slots[:n].all() and (pack["mlm_positions"][n:] == 0).all()
        positions = pack["mlm_positions"][:n]
        owner = pack["sequence_ids"][positions]
        assert (owner > 0).all(), "an MLM position points at padding"
        assert (np.diff(owner) >= 0).all(), "MLM slots are grouped by sequence"
        for k, start, _ in sequences:
            assert not (positions == start).any(), "[CLS] is never a prediction"
        assert not np.isin(pack["mlm_labels"][:n], [special["[CLS]"], special["[SEP]"], special["[PAD]"]]).any()
        assert (pack["input_ids"][pack["sequence_ids"] == 0] == 0).all()


def test_nsp_is_balanced_and_masking_follows_the_recipe(prepared):
    ds, packs = _rows(os.path.join(prepared, "padded"))
    labels = np.array([p["nsp_labels"][0] for p in packs])
    assert set(labels.tolist()) == {0, 1}
    share = labels.mean()
    assert abs(share - 0.5) < 0.05, share  # ~1000 instances: 3 sigma is about 0.05
    masked = sum(int((p["mlm_labels"] != -100).sum()) for p in packs)
    tokens = ds.manifest["num_tokens"]
    assert 0.12 < masked / tokens < 0.16
    mask_id = ds.manifest["special_token_ids"]["[MASK]"]
    replaced = np.concatenate([p["input_ids"][p["mlm_positions"][p["mlm_labels"] != -100]] for p in packs])
    original = np.concatenate([p["mlm_labels"][p["mlm_labels"] != -100] for p in packs])
    assert abs((replaced == mask_id).mean() - 0.8) < 0.04
    assert abs((replaced == original).mean() - 0.1) < 0.03


def test_same_seed_same_bytes_any_workers_and_other_seed_differs(tmp_path, prepared):
    inputs = os.path.join(os.path.dirname(prepared), "inputs")  # same paths: the manifest names the input
    again = _prepare(tmp_path, "again", inputs=inputs, workers=2)
    other = _prepare(tmp_path, "other", inputs=inputs, seed=7)
    for kind in ("packed", "padded"):
        names = sorted(os.listdir(os.path.join(prepared, kind)))
        assert names == sorted(os.listdir(os.path.join(again, kind)))
        assert len([n for n in names if n.startswith("shard-")]) >= 2
        for name in names:
            with open(os.path.join(prepared, kind, name), "rb") as a, open(os.path.join(again, kind, name), "rb") as b:
                assert a.read() == b.read(), (kind, name)
        with open(os.path.join(prepared, kind, "shard-00000.npy"), "rb") as a, \
                open(os.path.join(other, kind, "shard-00000.npy"), "rb") as b:
            assert a.read() != b.read()


def test_shards_open_with_numpy_alone(prepared):
    ds = open_dataset(os.path.join(prepared, "packed"))
    first = np.load(os.path.join(prepared, "packed", "shard-00000.npy"), mmap_mode="r")
    assert first["input_ids"].shape == (first.shape[0], S)
    assert first["mlm_positions"].shape[1] == ds.manifest["mlm_slots"] == ds.mlm_slots
    assert first["cls_positions"].shape[1] == K
    # compact on disk (the synthetic vocabulary has under 256 tokens), int32 out of the Dataset
    stored = {name: first.dtype[name].base.str for name in FIELDS}
    assert stored == ds.manifest["field_dtypes"]
    assert stored == {"input_ids": "|u1", "token_type_ids": "|u1", "position_ids": "|u1", "sequence_ids": "|u1",
                      "mlm_positions": "|u1", "mlm_labels": "<i2", "cls_positions": "|u1", "nsp_labels": "|i1"}
    assert first.dtype.itemsize == 4 * S + 3 * ds.mlm_slots + 2 * K
    for name in FIELDS:
        assert ds[0][name].dtype == torch.int32
        assert (ds[0][name].numpy() == first[name][0]).all()


def test_dataset_serves_stored_packs_through_a_dataloader(prepared):
    directory = os.path.join(prepared, "packed")
    ds = open_dataset(directory)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert sorted(batch) == sorted(FIELDS)
    assert all(v.dtype == torch.int32 for v in batch.values())
    assert batch["input_ids"].shape == (4, S) and batch["nsp_labels"].shape == (4, K)
    assert len(ds) == ds.num_packs
    stored = np.concatenate([np.load(os.path.join(directory, shard["file"])) for shard in ds.manifest["shards"]])
    loaded = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2)
    ids = torch.cat([b["input_ids"] for b in loaded])
    assert np.array_equal(ids.numpy(), stored["input_ids"])  # item i is stored pack i, in every worker


def test_corrupt_shard_or_manifest_is_refused_naming_it(tmp_path, prepared):
    import json
    import shutil

    source = os.path.join(prepared, "packed")

    def copy(name):
        target = str(tmp_path / name)
        shutil.copytree(source, target)
        return target

    flipped = copy("flipped")
    path = os.path.join(flipped, "shard-00001.npy")
    data = bytearray(open(path, "rb").read())
    data[-7] ^= 0x10
    open(path, "wb").write(bytes(data))
    with pytest.raises(DataError, match=r"shard .*shard-00001\.npy.*sha256"):
        open_dataset(flipped)
    truncated = copy("truncated")
    path = os.path.join(truncated, "shard-00000.npy")
    open(path, "r+b").truncate(100)
    with pytest.raises(DataError, match=r"shard .*shard-00000\.npy"):
        open_dataset(truncated)
    for name, edit, field in (("type", lambda m: m.update(mlm_slots="21"), "mlm_slots"),
                              ("missing", lambda m: m.pop("num_packs"), "num_packs"),
                              ("count", lambda m: m.update(num_packs=m["num_packs"] + 1), "num_packs"),
                              ("shape", lambda m: m.update(mlm_slots=m["mlm_slots"] + 1), "mlm_positions"),
                              ("vocab", lambda m: m.update(vocab_checksum="0" * 64), "vocab_checksum"),
                              ("dtypes", lambda m: m["field_dtypes"].update(input_ids="<i4"), "field_dtypes"),
                              # a dataset of format 1 (every field int32) is refused, saying what to do
                              ("version", lambda m: (m.update(format_version=1), m.pop("field_dtypes")),
                               "format_version 1, this code reads 2: prepare the dataset again")):
        directory = copy(name)
        manifest_path = os.path.join(directory, "manifest.json")
        manifest = json.load(open(manifest_path))
        edit(manifest)
        json.dump(manifest, open(manifest_path, "w"))
        with pytest.raises(DataError, match=field):
            open_dataset(directory)
    broken = copy("broken")
    with open(os.path.join(broken, "manifest.json"), "a") as f:
        f.write("}")
    with pytest.raises(DataError, match=r"manifest\.json.*JSON"):
        open_dataset(broken)


# --- units ------------------------------------------------------------------------------------------


def test_truncation_counts_match_the_reference_loop():
    for la, lb, limit in itertools.product(range(1, 30), range(1, 30), (2, 7, 20, 40)):
        a, b = la, lb
        while a + b > limit:
            if a > b:
                a -= 1
            else:
                b -= 1
        ra, rb = truncation_counts(np.array([la]), np.array([lb]), limit)
        assert (la - int(ra[0]), lb - int(rb[0])) == (a, b)


def test_mlm_slots_is_the_exact_bound():
    recipe = RecipeConfig(max_seq_length=24, max_predictions_per_seq=3)
    lengths = np.arange(5, 25)
    gain = dict(zip(lengths.tolist(), recipe.num_to_predict(lengths).tolist()))
    for k in (1, 2, 3, 4):
        best = 0
        for n in range(1, k + 1):
            for combo in itertools.combinations_with_replacement(lengths.tolist(), n):
                if sum(combo) <= 24:
                    best = max(best, sum(gain[length] for length in combo))
        assert mlm_slots(24, k, max_predictions_per_seq=3) == best
    assert mlm_slots(128, 1, max_predictions_per_seq=20) == 19 and mlm_slots(128, 3, max_predictions_per_seq=20) == 20
    assert (mlm_slots(128, 3), mlm_slots(512, 3), mlm_slots(128, 1), mlm_slots(512, 1)) == (20, 78, 19, 77)


def test_uniforms_randint_covers_both_ends():
    draws = Uniforms(np.random.default_rng(0), block=64)
    values = collections.Counter(draws.randint(3, 6) for _ in range(4000))
    assert sorted(values) == [3, 4, 5, 6] and min(values.values()) > 850


def test_smallest_keys_chooses_what_a_stable_argsort_chooses():
    from ipu_packing.data.text.recipe import _smallest_keys

    rng = np.random.default_rng(1)
    for trial in range(100):
        n, w = int(rng.integers(1, 30)), int(rng.integers(1, 40))
        keys = rng.integers(0, 4, (n, w)).astype(float) if trial % 2 else rng.random((n, w))  # with and without ties
        budget = rng.integers(0, w + 1, n)
        expected = np.zeros((n, w), dtype=bool)
        np.put_along_axis(expected, np.argsort(keys, axis=1, kind="stable"), np.arange(w)[None, :] < budget[:, None],
                          axis=1)
        assert (_smallest_keys(keys, budget) == expected).all()


def test_whole_word_masking_masks_every_piece_of_a_word(tmp_path):
    _, vocab_path = make_inputs(str(tmp_path))
    spec = load_tokenizer(vocab_path)
    tokenizer = spec.encoder()
    documents = [["Packing sequences without contamination is masking attention %d." % i,
                  "The tokenizer splits wordpiece words into pieces."] for i in range(40)]
    shard = tokenize_documents(documents, tokenizer)
    ids = spec.special_token_ids
    vocab = Vocabulary(ids["[CLS]"], ids["[SEP]"], ids["[MASK]"], spec.continuation_mask(), spec.replacement_ids())
    recipe = RecipeConfig(max_seq_length=48, whole_word_masking=True, dupe_factor=5, masked_lm_prob=0.3)
    inst = create_instances(shard, recipe, vocab, np.random.default_rng(1))
    cont = spec.continuation_mask()
    offsets = np.concatenate([[0], np.cumsum(inst.lengths)])
    mlm_offsets = np.concatenate([[0], np.cumsum(inst.mlm_counts)])
    checked = 0
    for i in range(len(inst)):
        tokens = inst.tokens[offsets[i]:offsets[i + 1]].copy()
        positions = inst.mlm_positions[mlm_offsets[i]:mlm_offsets[i + 1]]
        tokens[positions] = inst.mlm_labels[mlm_offsets[i]:mlm_offsets[i + 1]]  # the original text
        chosen = np.zeros(len(tokens), dtype=bool)
        chosen[positions] = True
        for p in range(1, len(tokens)):
            if cont[tokens[p]] and tokens[p - 1] not in (ids["[SEP]"], ids["[CLS]"]):
                assert chosen[p] == chosen[p - 1], "a word is masked whole or not at all"
                checked += chosen[p]
        assert len(positions) <= recipe.num_to_predict(np.array([len(tokens)]))[0]
    assert checked > 20


def test_reading_bert_and_plain_text_formats(tmp_path):
    bert = tmp_path / "bert.txt"
    bert.write_text("First sentence here.\nSecond one.\n\nOther document.\nAgain.\n", encoding="utf-8")
    assert list(read_documents(str(bert), "auto")) == [["First sentence here.", "Second one."],
                                                       ["Other document.", "Again."]]
    text = tmp_path / "plain.txt"
    text.write_text("A wrapped paragraph that goes\non. It has two sentences!\n\nNext paragraph\nhere.\n\n\n"
                    "New document starts. Here.\n", encoding="utf-8")
    assert list(read_documents(str(text), "auto")) == [
        ["A wrapped paragraph that goes on.", "It has two sentences!", "Next paragraph here."],
        ["New document starts.", "Here."]]
    assert split_sentences('He said "Stop." Then (Again) it was 3 p.m. today. 4 more.') == [
        'He said "Stop."', "Then (Again) it was 3 p.m. today.", "4 more."]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line.\nsecond line.\nbroken \xff byte.\n")
    with pytest.raises(DataError, match=r"bad\.txt:3: not UTF-8"):
        list(read_documents(str(bad), "bert"))


def test_default_vocabulary_training_is_deterministic():
    from ipu_packing.data.text.corpus import default_documents

    sentences = [s for d in itertools.islice(default_documents(), 120) for s in d]
    first = train_default_vocab(sentences, vocab_size=2000)
    second = train_default_vocab(sentences, vocab_size=2000)
    assert len(first.vocab) == 2000 and first.vocab == second.vocab
    assert first.vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_tokenizer_sources_and_lower_casing(tmp_path):
    from tokenizers.implementations import BertWordPieceTokenizer

    from ipu_packing.data.text.corpus import resolve_inputs

    _, vocab_path = make_inputs(str(tmp_path / "in"))
    uncased = load_tokenizer(vocab_path)
    assert uncased.do_lower_case and uncased.vocab[2] == "[CLS]"
    cased_vocab = tmp_path / "cased.txt"
    cased_vocab.write_text(open(vocab_path).read() + "Paris\n", encoding="utf-8")
    assert not load_tokenizer(str(cased_vocab)).do_lower_case
    assert load_tokenizer(str(cased_vocab), "yes").do_lower_case
    for lower in (True, False):
        directory = tmp_path / ("hf-%s" % lower)
        directory.mkdir()
        tokenizer = BertWordPieceTokenizer(str(cased_vocab), lowercase=lower)
        tokenizer.save(str(directory / "tokenizer.json"))
        (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))  # as saved by HF
        spec = load_tokenizer(str(directory))
        assert spec.do_lower_case is lower
        ids = spec.build().encode("Paris", add_special_tokens=False).ids
        assert [spec.vocab[i] for i in ids] == (["p", "##a", "##r", "##i", "##s"] if lower else ["Paris"])
    # a cased tokenizer.json alone: lower-cased, as transformers' BertTokenizerFast rebuilds it at its defaults
    (tmp_path / "hf-False" / "tokenizer_config.json").unlink()
    assert load_tokenizer(str(tmp_path / "hf-False")).do_lower_case is True
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="neither tokenizer.json nor vocab.txt"):
        load_tokenizer(str(empty))
    (tmp_path / "in" / "more.txt").write_text("x\n", encoding="utf-8")
    assert [os.path.basename(p) for p in resolve_inputs(str(tmp_path / "in"))] == [
        "corpus.txt", "more.txt", "vocab.txt"]
    assert [os.path.basename(p) for p in resolve_inputs(str(tmp_path / "in" / "*r*.txt"))] == ["corpus.txt", "more.txt"]
    with pytest.raises(DataError, match="matches no files"):
        resolve_inputs(str(tmp_path / "*.nothing"))


def test_batch_encoder_matches_the_full_tokenizer(tmp_path):
    _, vocab_path = make_inputs(str(tmp_path))
    sentences = ["The Packing of sequences.", "Café naïve RÉSUMÉ.", "tab\tseparated\twords", "中文 text here",
                 "ALL CAPS, with punctuation!", "", "   spaced   out   ", "control\x07char and \u00a0nbsp",
                 "every ASCII sign: " + "".join(chr(c) for c in range(33, 127)) + " a+b=c, x<y>z; a|b~c ^`$",
                 "a word longer than the WordPiece limit: " + "packing" * 20 + " ends here",
                 "the packing of sequences.", "The packing of sequences.", " ", "x"]
    for lower in ("yes", "no"):
        spec = load_tokenizer(vocab_path, lower)
        full = spec.build()
        expected = [e.ids for e in full.encode_batch(sentences, add_special_tokens=False)]
        assert spec.encoder()(sentences) == expected
        ascii_only = [t for t in sentences if t.isascii() and t.isprintable()]
        assert spec.encoder()(ascii_only) == [e.ids for e in full.encode_batch(ascii_only, add_special_tokens=False)]


def test_a_pack_that_would_overflow_is_an_error_not_a_truncation(tmp_path):
    from ipu_packing.data.instance_files import gather_instances
    from ipu_packing.data.write.packs import PackLayout, build_packs

    _, vocab_path = make_inputs(str(tmp_path))
    spec = load_tokenizer(vocab_path)
    ids = spec.special_token_ids
    vocab = Vocabulary(ids["[CLS]"], ids["[SEP]"], ids["[MASK]"], spec.continuation_mask(), spec.replacement_ids())
    documents = [["The first sentence of document %d." % i, "And the second one, with more words in it."]
                 for i in range(10)]
    recipe = RecipeConfig(max_seq_length=32, dupe_factor=1)
    inst = create_instances(tokenize_documents(documents, spec.encoder()), recipe, vocab, np.random.default_rng(0))
    members = np.array([0, 1], dtype=np.int64)
    store = gather_instances(inst, members)
    fits = int(inst.lengths[0] + inst.lengths[1])
    needed = int(inst.mlm_counts[0] + inst.mlm_counts[1])
    packs = build_packs(store, np.array([0, 2]), PackLayout(fits, 2, needed))
    assert (packs["mlm_labels"] != -100).sum() == needed
    with pytest.raises(DataError, match="pack 0 would hold %d MLM predictions" % needed):
        build_packs(store, np.array([0, 2]), PackLayout(fits, 2, needed - 1))
    with pytest.raises(DataError, match="pack 0 would hold %d tokens" % fits):
        build_packs(store, np.array([0, 2]), PackLayout(fits - 1, 2, needed))
    with pytest.raises(DataError, match="pack 0 would hold 2 sequences"):
        build_packs(store, np.array([0, 2]), PackLayout(fits, 1, needed))


def test_module_docstrings_keeps_bare_string_statements_only(tmp_path):
    from ipu_packing.data.text.corpus import _module_docstrings

    source = ('"""Module doc."""\n'
              'x = """assigned, not prose"""\n'
              'def f():\n'
              '    r"""Raw doc\n    on two lines."""\n'
              '    b"""bytes"""\n'
              "    Rb'''raw bytes'''\n"
              "    u'''unicode''' + '''same line, after another literal'''\n"
              '    call("""argument""")\n'
              '    rbu"""three prefix letters: not a string statement"""\n'
              '    """"""\n'
              '    """last"""\n')
    path = tmp_path / "m.py"
    path.write_text(source, encoding="utf-8")
    assert _module_docstrings(str(path)) == ["Module doc.", "Raw doc\non two lines.", "unicode", "last"]
