"""`python -m ipu_packing.data pack`: NVIDIA BERT HDF5 and google-research/bert TFRecords -> packed/ and padded/.

The input files are built by tests/existing_datasets.py: HDF5 with h5py as NVIDIA's writer lays it out (int32 ids
and positions, int8 masks, segments and labels, gzip), TFRecords with its own writer (its own CRC-32C and
protobuf encoding, no TensorFlow and nothing from the package under test). Every input instance must
come back out of the packs exactly once and bit for bit: ids, segments, masked positions and labels,
NSP label."""

import collections
import gzip
import json
import os
import struct
import time

import numpy as np
import pytest

from ipu_packing.data import open_dataset
from ipu_packing.data.cli import main
from ipu_packing.data.format import SPECIAL_TOKENS
from existing_datasets import (P, S, V, bert_example, dense, example, float_feature, int64_feature, key, make_instances,
                               masked, run_pack, tf_records, write_hdf5, write_tfrecord)

h5py = pytest.importorskip("h5py")  # a pinned requirement; skipped only where it is not installed


# -- unpacking the output ------------------------------------------------------------------------

def unpack(directory):
    """Every sequence of every pack of a dataset directory, as make_instances' tuples."""
    manifest = json.load(open(os.path.join(directory, "manifest.json")))
    out = []
    for shard in manifest["shards"]:
        packs = np.load(os.path.join(directory, shard["file"]))
        for p in packs:
            slot = 0
            for k in range(manifest["max_sequences_per_pack"]):
                where = np.flatnonzero(p["sequence_ids"] == k + 1)
                if not len(where):
                    assert (p["nsp_labels"][k:] == -100).all()
                    break
                start, length = int(where[0]), len(where)
                assert (where == np.arange(start, start + length)).all()
                assert p["cls_positions"][k] == start
                assert (p["position_ids"][where] == np.arange(length)).all()
                in_sequence = (p["mlm_positions"] >= start) & (p["mlm_positions"] < start + length) & \
                              (p["mlm_labels"] != -100)
                q = int(in_sequence.sum())
                assert in_sequence[slot:slot + q].all()  # this sequence's predictions take the next slots
                positions = p["mlm_positions"][slot:slot + q].astype(np.int64) - start
                labels = p["mlm_labels"][slot:slot + q].astype(np.int64)
                slot += q
                out.append((p["input_ids"][where].astype(np.int64), p["token_type_ids"][where].astype(np.int64),
                            positions, labels, int(p["nsp_labels"][k])))
            assert (p["mlm_labels"][slot:] == -100).all()
    return manifest, out


def check_round_trip(out, instances, padded=True):
    expected = collections.Counter(key(i) for i in instances)
    for kind in ("packed", "padded") if padded else ("packed",):
        manifest, sequences = unpack(os.path.join(out, kind))
        assert collections.Counter(key(s) for s in sequences) == expected, kind
        assert manifest["num_sequences"] == len(instances)
        assert manifest["num_masked_tokens"] == sum(len(i[2]) for i in instances)
        assert manifest["max_sequences_per_pack"] == (3 if kind == "packed" else 1)
        dataset = open_dataset(os.path.join(out, kind))  # checksums, dtypes, manifest keys
        assert len(dataset) == manifest["num_packs"]
    if not padded:
        assert sorted(os.listdir(out)) == ["packed"]


# -- round trips ---------------------------------------------------------------------------------

def test_hdf5_every_instance_lands_once_bit_for_bit(tmp_path, capsys):
    a, b = make_instances(150, seed=1), make_instances(90, seed=2)
    os.makedirs(str(tmp_path / "in"))
    write_hdf5(str(tmp_path / "in" / "part_0.hdf5"), a)
    write_hdf5(str(tmp_path / "in" / "part_1.hdf5"), b)
    code, out = run_pack(tmp_path, str(tmp_path / "in"))
    assert code == 0, capsys.readouterr().err
    check_round_trip(out, a + b)
    manifest = json.load(open(os.path.join(out, "packed", "manifest.json")))
    assert manifest["corpus"]["format"] == "hdf5" and manifest["corpus"]["files"] == 2
    assert manifest["packing_factor"] > 1.3  # K = 3 really packs
    assert "packed" in capsys.readouterr().out
    assert main(["inspect", os.path.join(out, "packed")]) == 0
    assert "packing factor" in capsys.readouterr().out


def test_tfrecord_every_instance_lands_once_bit_for_bit(tmp_path, capsys):
    a, b = make_instances(120, seed=3), make_instances(70, seed=4)
    os.makedirs(str(tmp_path / "in"))
    write_tfrecord(str(tmp_path / "in" / "tf_examples.tfrecord-00000-of-00002"), tf_records(a))
    # the second file: keys in another order per record, lists unpacked (both valid protobuf)
    write_tfrecord(str(tmp_path / "in" / "tf_examples.tfrecord-00001-of-00002"),
                   tf_records(b, packed=False, shuffle_keys=True))
    code, out = run_pack(tmp_path, str(tmp_path / "in" / "tf_examples.tfrecord-*"), "--format", "tfrecord")
    assert code == 0, capsys.readouterr().err
    check_round_trip(out, a + b)
    manifest = json.load(open(os.path.join(out, "padded", "manifest.json")))
    assert manifest["corpus"]["format"] == "tfrecord" and manifest["corpus"]["records"] == 190


def test_gzip_tfrecord(tmp_path, capsys):
    """TFRecordOptions("GZIP") files: the same records, compressed."""
    import gzip

    instances = make_instances(50, seed=9)
    plain = write_tfrecord(str(tmp_path / "plain"), tf_records(instances))
    with open(plain, "rb") as src, gzip.open(str(tmp_path / "data.tfrecord.gz"), "wb") as dst:
        dst.write(src.read())
    os.remove(plain)
    code, out = run_pack(tmp_path, str(tmp_path / "data.tfrecord.gz"))
    assert code == 0, capsys.readouterr().err
    check_round_trip(out, instances)


def test_unused_slots_by_weight_are_dropped_and_no_padded(tmp_path, capsys):
    """A TFRecord slot whose weight is 0 is dropped even if its position and id are not 0."""
    instances = make_instances(40, seed=5)
    arrays = dense(instances)
    records = []
    for i, (ids, segments, positions, labels, nsp) in enumerate(instances):
        q = len(positions)
        pos, lab = arrays["masked_lm_positions"][i].copy(), arrays["masked_lm_ids"][i].copy()
        pos[q:], lab[q:] = 1, 7  # junk in the unused slots: only the weights say they are unused
        records.append(bert_example(arrays["input_ids"][i], arrays["input_mask"][i], arrays["segment_ids"][i], pos,
                                    lab, arrays["masked_lm_weights"][i], nsp))
    path = write_tfrecord(str(tmp_path / "data.tfrecord"), records)
    code, out = run_pack(tmp_path, path, "--no-padded")
    assert code == 0, capsys.readouterr().err
    check_round_trip(out, instances, padded=False)


def test_workers_do_not_change_the_bytes(tmp_path, capsys):
    instances = make_instances(300, seed=6)
    path = write_hdf5(str(tmp_path / "data.hdf5"), instances)
    one = run_pack(tmp_path, path, output="one")
    two = run_pack(tmp_path, path, "--workers", "2", output="two", vocab=str(tmp_path / "vocab.txt"))
    assert one[0] == two[0] == 0, capsys.readouterr().err
    for kind in ("packed", "padded"):
        names = sorted(os.listdir(os.path.join(one[1], kind)))
        assert names == sorted(os.listdir(os.path.join(two[1], kind)))
        for name in names:
            assert (open(os.path.join(one[1], kind, name), "rb").read()
                    == open(os.path.join(two[1], kind, name), "rb").read())


def test_mlm_slots_come_from_the_data(tmp_path, capsys):
    """M is the most predictions a pack can hold given the data's predictions per length, not P * K."""
    instances = make_instances(200, seed=7)
    code, out = run_pack(tmp_path, write_hdf5(str(tmp_path / "data.hdf5"), instances))
    assert code == 0, capsys.readouterr().err
    most = collections.defaultdict(int)
    for ids, _, positions, _, _ in instances:
        most[len(ids)] = max(most[len(ids)], len(positions))
    for kind, k in (("packed", 3), ("padded", 1)):
        manifest = json.load(open(os.path.join(out, kind, "manifest.json")))
        # brute force over every multiset of up to k lengths that fit in S
        best = 0
        lengths = sorted(most)
        for a in lengths:
            best = max(best, most[a])
            for b in lengths:
                if k >= 2 and a + b <= S:
                    best = max(best, most[a] + most[b])
                for c in lengths:
                    if k >= 3 and a + b + c <= S:
                        best = max(best, most[a] + most[b] + most[c])
        assert manifest["mlm_slots"] == best, kind


def test_the_packed_output_trains(tmp_path, capsys):
    """run_pretraining.py reads the result: two steps of the tiny demo model on it."""
    from ipu_packing.train.cli import main as train_main

    from app_fixtures import TINY

    path = write_hdf5(str(tmp_path / "data.hdf5"), make_instances(160, seed=8))
    code, out = run_pack(tmp_path, path)
    assert code == 0, capsys.readouterr().err
    run = str(tmp_path / "run")
    code = train_main(["--config", "demo"] + TINY + ["data.dir=%s" % out,
                                                      "checkpoint.output_dir=%s" % run, "training.steps=2"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["loss"]) for r in rows)


# -- errors: one line naming the file (and record or key), exit 2, nothing written ------------------

def _error(capsys, *words):
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and captured.out == ""
    for word in words:
        assert word in err, (word, err)
    return err


def _nothing_written(tmp_path, out):
    assert not os.path.exists(out)
    assert not [n for n in os.listdir(str(tmp_path)) if ".tmp-" in n]


def _corrupt(data, at):
    data = bytearray(data)
    data[at] ^= 0x40
    return bytes(data)


def _record(instance, **change):
    arrays = dense([instance])
    values = {name: arrays[name][0] for name in arrays}
    values.update(change)
    return bert_example(values["input_ids"], values["input_mask"], values["segment_ids"],
                        values["masked_lm_positions"], values["masked_lm_ids"], values["masked_lm_weights"],
                        int(values.get("nsp", arrays["next_sentence_labels"][0])))


def _two_segments(seed=0):
    return [i for i in make_instances(40, seed=seed, single_segment_share=0) if len(i[0]) >= 8][:10]


HDF5_ERRORS = [
    ("missing key", lambda p, good: write_hdf5(p, good, drop=("masked_lm_ids",)), ["masked_lm_ids", "missing"]),
    ("rows disagree", lambda p, good: write_hdf5(p, good, shapes={"input_mask": lambda a: a[:-1]}),
     ["input_mask", "shape"]),
    ("S within file", lambda p, good: write_hdf5(p, good, shapes={"segment_ids": lambda a: a[:, :-1]}),
     ["segment_ids", "shape"]),
    ("P within file", lambda p, good: write_hdf5(p, good, shapes={"masked_lm_ids": lambda a: a[:, :-1]}),
     ["masked_lm_ids", "shape"]),
    ("mask holes", lambda p, good: write_hdf5(p, good, shapes={"input_mask": lambda a: _set(a, (3, 1), 0)}),
     ["record 3", "input_mask"]),
    ("segments 0 1 0", lambda p, good: write_hdf5(p, good, shapes={"segment_ids": lambda a: _set(a, (4, 1), 1)}),
     ["record 4", "segment_ids", "0s then 1s"]),
    ("nsp 2", lambda p, good: write_hdf5(p, good, shapes={"next_sentence_labels": lambda a: _set(a, 5, 2)}),
     ["record 5", "next_sentence_labels"]),
    ("id outside vocab", lambda p, good: write_hdf5(p, good, shapes={"input_ids": lambda a: _set(a, (6, 2), V)}),
     ["record 6", "input_ids", "vocabulary"]),
    ("position past the sequence", lambda p, good: write_hdf5(p, good, shapes={
        "masked_lm_positions": lambda a: _set(a, (7, 0), S + 3)}), ["record 7", "masked_lm_positions", "outside"]),
]


def _set(array, index, value):
    array = array.copy()
    array[index] = value
    return array


@pytest.mark.parametrize("name, build, words", HDF5_ERRORS, ids=[c[0] for c in HDF5_ERRORS])
def test_hdf5_errors(tmp_path, capsys, name, build, words):
    good = _two_segments(seed=10)
    path = str(tmp_path / "bad.hdf5")
    build(path, good)
    code, out = run_pack(tmp_path, path)
    assert code == 2
    _error(capsys, "bad.hdf5", *words)
    _nothing_written(tmp_path, out)


@pytest.mark.parametrize("where, words", [(0.3, ["key 'input_ids'", "records 0-399", "damaged"]),
                                          (0.8, ["key 'masked_lm_ids'", "damaged"])])
def test_corrupt_hdf5_is_one_line(tmp_path, capsys, where, words):
    """64 bytes flipped inside a gzip-compressed chunk (0.3: read by a worker) or an object header (0.8:
    found while checking the inputs): h5py's error becomes one line naming the file and the key."""
    path = write_hdf5(str(tmp_path / "bad.hdf5"), make_instances(400, seed=15))
    data = bytearray(open(path, "rb").read())
    at = int(len(data) * where)
    data[at:at + 64] = bytes(b ^ 0xFF for b in data[at:at + 64])
    with open(path, "wb") as f:
        f.write(bytes(data))
    code, out = run_pack(tmp_path, path)
    assert code == 2
    _error(capsys, "bad.hdf5", *words)
    _nothing_written(tmp_path, out)


def test_mixed_inputs_are_refused(tmp_path, capsys):
    good = _two_segments(seed=11)
    os.makedirs(str(tmp_path / "in"))
    write_hdf5(str(tmp_path / "in" / "a.hdf5"), good)
    write_hdf5(str(tmp_path / "in" / "b.hdf5"), [(i[0][:16], i[1][:16], i[2][i[2] < 15], i[3][i[2] < 15], i[4])
                                                for i in good], S=16)
    code, out = run_pack(tmp_path, str(tmp_path / "in"))
    assert code == 2
    _error(capsys, "b.hdf5", "S = 16", "a.hdf5", "S = 32", "mixed")
    _nothing_written(tmp_path, out)
    os.remove(str(tmp_path / "in" / "b.hdf5"))
    write_hdf5(str(tmp_path / "in" / "b.hdf5"), good, P=P + 2)
    assert run_pack(tmp_path, str(tmp_path / "in"))[0] == 2
    _error(capsys, "b.hdf5", "masked_lm_positions", "disagree")
    os.remove(str(tmp_path / "in" / "b.hdf5"))
    write_tfrecord(str(tmp_path / "in" / "b.tfrecord"), tf_records(good))
    assert run_pack(tmp_path, str(tmp_path / "in"))[0] == 2
    _error(capsys, "b.tfrecord", "tfrecord", "a.hdf5", "hdf5")
    with open(str(tmp_path / "in" / "README"), "w") as f:
        f.write("not data\n")
    os.remove(str(tmp_path / "in" / "b.tfrecord"))
    assert run_pack(tmp_path, str(tmp_path / "in"))[0] == 2
    _error(capsys, "README", "neither")
    _nothing_written(tmp_path, str(tmp_path / "out"))


def test_wrong_format_for_the_flag(tmp_path, capsys):
    good = _two_segments(seed=12)
    h5 = write_hdf5(str(tmp_path / "a.hdf5"), good)
    tf = write_tfrecord(str(tmp_path / "a.tfrecord"), tf_records(good))
    assert run_pack(tmp_path, h5, "--format", "tfrecord")[0] == 2
    _error(capsys, "a.hdf5", "not a TFRecord")
    assert run_pack(tmp_path, tf, "--format", "hdf5")[0] == 2
    _error(capsys, "a.tfrecord", "not an HDF5")
    _nothing_written(tmp_path, str(tmp_path / "out"))


def _tf_error_cases():
    good = _two_segments(seed=13)
    records = list(tf_records(good))
    def framed(recs):
        return b"".join(struct.pack("<Q", len(d)) + struct.pack("<I", masked(struct.pack("<Q", len(d)))) + d
                        + struct.pack("<I", masked(d)) for d in recs)

    whole = framed(records)
    second = len(framed(records[:1]))  # record 1 starts here
    cases = {
        "data CRC": (_corrupt(whole, second + 12 + 5), ["record 1", "data CRC"]),
        "length CRC": (_corrupt(whole, second + 2), ["record 1", "length CRC"]),
        "truncated": (whole[:-7], ["record %d" % (len(records) - 1), "truncated"]),
        "not an Example": (framed(records[:2] + [b"\x0a\x05\x0a\x03abc"]), ["record 2", "Example"]),
        "missing feature": (framed(records[:3] + [example({"input_ids": int64_feature(range(S))})]),
                            ["record 3", "'input_mask' is missing"]),
        "S within file": (framed(records[:4] + [_record(good[4])[:0] + example({
            name: (int64_feature(range(S - 1)) if name in ("input_ids", "input_mask", "segment_ids") else
                   float_feature([0.0] * P) if name == "masked_lm_weights" else
                   int64_feature([0] * (1 if name == "next_sentence_labels" else P)))
            for name in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                         "masked_lm_weights", "next_sentence_labels")})]), ["record 4", "input_ids", "31"]),
        "weight one half": (framed(records[:5] + [_record(good[5], masked_lm_weights=np.full(P, 0.5, np.float32))]),
                            ["record 5", "masked_lm_weights"]),
        "float ids": (framed(records[:6] + [example({
            "input_ids": float_feature([1.0] * S), "input_mask": int64_feature([1] * S),
            "segment_ids": int64_feature([0] * S), "masked_lm_positions": int64_feature([0] * P),
            "masked_lm_ids": int64_feature([0] * P), "masked_lm_weights": float_feature([0.0] * P),
            "next_sentence_labels": int64_feature([0])})]), ["record 6", "input_ids", "float_list"]),
        "descending positions": (framed(records[:7] + [_record(good[7], masked_lm_positions=np.array(
            [5, 3] + [0] * (P - 2)), masked_lm_weights=np.array([1, 1] + [0] * (P - 2), np.float32))]),
            ["record 7", "ascending"]),
    }
    return cases


TF_ERRORS = sorted(_tf_error_cases())


@pytest.mark.parametrize("name", TF_ERRORS)
def test_tfrecord_errors(tmp_path, capsys, name):
    data, words = _tf_error_cases()[name]
    path = str(tmp_path / "bad.tfrecord")
    with open(path, "wb") as f:
        f.write(data)
    code, out = run_pack(tmp_path, path, "--format", "tfrecord")
    assert code == 2
    _error(capsys, "bad.tfrecord", *words)
    _nothing_written(tmp_path, out)


def test_wrong_vocab_is_caught(tmp_path, capsys):
    """Data made with another vocabulary: its sequences do not start with this one's [CLS]."""
    path = write_hdf5(str(tmp_path / "a.hdf5"), _two_segments(seed=14))
    vocab = str(tmp_path / "other_vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["w0", "w1"] + list(SPECIAL_TOKENS) + ["w%d" % i for i in range(2, V - 5)]) + "\n")
    code, out = run_pack(tmp_path, path, vocab=vocab)
    assert code == 2
    _error(capsys, "a.hdf5", "record 0", "[CLS]", "--vocab")
    _nothing_written(tmp_path, out)


# -- a TFRecord record length larger than the file is one line, at once ----------------------------------------
# data/existing/tfrecord.py `read_batches` checks each record length against the bytes the file has left.

FAST_SECONDS = 20  # a refusal comes before any work


def _framed(length_field, body):
    """A TFRecord frame whose length field says ``length_field`` (CRCs right), holding ``body``."""
    length = struct.pack("<Q", length_field)
    return length + struct.pack("<I", masked(length)) + body + struct.pack("<I", masked(body))


def _good_records():
    return list(tf_records(make_instances(3, seed=5)))


def _huge_first(size):
    def make(path):
        with open(path, "wb") as f:
            f.write(_framed(size, b"x" * 40))
    return make


def _huge_after_good(path):
    write_tfrecord(path, _good_records())
    with open(path, "ab") as f:
        f.write(_framed(1 << 40, b"x" * 40))


def _gzip_huge(path):
    with gzip.open(path, "wb") as f:
        f.write(_framed(1 << 40, b"x" * 40))


def _one_past_the_end(path):
    records = _good_records()
    with open(path, "wb") as f:
        f.write(_framed(len(records[0]) + 5, records[0]))  # says 5 bytes more than the file has


TFRECORD_ROWS = [
    ("length-2**40", _huge_first(1 << 40), "bytes left in the file"),
    ("length-2**63", _huge_first(1 << 63), "bytes left in the file"),
    ("length-2**64-1", _huge_first((1 << 64) - 1), "bytes left in the file"),
    ("huge-after-good-records", _huge_after_good, "record 3"),
    ("gzip-length-2**40", _gzip_huge, "truncated"),
    ("five-bytes-past-the-end", _one_past_the_end, "bytes left in the file"),
]


@pytest.mark.parametrize("name, make, words", TFRECORD_ROWS, ids=[r[0] for r in TFRECORD_ROWS])
def test_a_tfrecord_length_larger_than_the_file_is_one_line(name, make, words, pack_inputs, tmp_path, capsys):
    path = str(tmp_path / "data.tfrecord")
    make(path)
    start = time.time()
    code = main(["pack", "--input", path, "--vocab", pack_inputs["vocab"], "--output", str(tmp_path / "out"),
                      "--workers", "1", "--quiet", "--format", "tfrecord"])
    assert code == 2
    _error(capsys, "data.tfrecord", words)
    assert time.time() - start < FAST_SECONDS and not (tmp_path / "out").exists()
