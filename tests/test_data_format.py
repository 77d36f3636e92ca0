"""The pack format: the vectorised pack writer (data/write/packs.py) writes exactly what the reference builder
(data/format.py, pack_sequences) writes, for any sequences and any grouping that fits; a dataset is opened only when
every value its manifest and shards hold is in range and consistent (read_manifest, data/shards.py); the files a
manifest names stay inside its directory."""

import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ipu_packing.data import open_dataset
from ipu_packing.data.cli import main as data_main
from ipu_packing.errors import DataError, UserError
from ipu_packing.fsutil import sha256_file
from ipu_packing.data.format import IGNORE_INDEX, pack_dtype
from ipu_packing.data.reference import Instance, pack_sequences
from ipu_packing.data.instance_files import Instances, load_instances, save_instances
from ipu_packing.data.instance_files import gather_instances
from ipu_packing.data.write.packs import PackLayout, build_packs


@st.composite
def instance(draw):
    length = draw(st.integers(5, 24))
    a_length = draw(st.integers(2, length - 1))  # [CLS] A [SEP]
    ids = draw(st.lists(st.integers(0, 999), min_size=length, max_size=length))
    positions = sorted(draw(st.sets(st.integers(1, length - 1), max_size=4)))
    labels = draw(st.lists(st.integers(0, 999), min_size=len(positions), max_size=len(positions)))
    types = (np.arange(length) >= a_length).astype(np.int64)
    return Instance(np.array(ids), types, np.array(positions, dtype=np.int64), np.array(labels),
                    draw(st.integers(0, 1)))


def _store(path, sequences):
    """`sequences` as the pipeline's workers write and read them (through an instance file)."""
    lengths = np.array([len(s) for s in sequences], dtype=np.int32)
    save_instances(path, Instances(
        tokens=np.concatenate([s.input_ids for s in sequences]).astype(np.int32),
        lengths=lengths,
        a_lengths=np.array([int((s.token_type_ids == 0).sum()) for s in sequences], dtype=np.int32),
        nsp_labels=np.array([s.nsp_label for s in sequences], dtype=np.int32),
        mlm_counts=np.array([len(s.mlm_positions) for s in sequences], dtype=np.int32),
        mlm_positions=np.concatenate([s.mlm_positions for s in sequences]).astype(np.int32),
        mlm_labels=np.concatenate([s.mlm_labels for s in sequences]).astype(np.int32)), vocab_size=1000)
    return load_instances(path)


@settings(max_examples=60, deadline=None)
@given(st.lists(instance(), min_size=1, max_size=12), st.integers(1, 4), st.randoms(use_true_random=False))
def test_vectorised_builder_equals_the_reference(sequences, K, random):
    order = list(range(len(sequences)))
    random.shuffle(order)
    groups, i = [], 0
    while i < len(order):  # consecutive runs of 1..K members, in a shuffled order
        n = random.randint(1, K)
        groups.append(order[i:i + n])
        i += n
    S = max(sum(len(sequences[j]) for j in g) for g in groups) + random.randint(0, 3)
    M = max(1, max(sum(len(sequences[j].mlm_positions) for j in g) for g in groups))
    reference = pack_sequences([[sequences[j] for j in g] for g in groups], S, K, M, vocab_size=1000)
    with tempfile.TemporaryDirectory() as root:
        members = np.array([j for g in groups for j in g], dtype=np.int64)
        store = gather_instances(_store(root + "/instances.npz", sequences), members)
        offsets = np.concatenate([[0], np.cumsum([len(g) for g in groups])]).astype(np.int64)
        vectorised = build_packs(store, offsets, PackLayout(S, K, M, vocab_size=1000))
        assert vectorised.dtype == reference.dtype == pack_dtype(S, M, K, vocab_size=1000)
        assert vectorised.tobytes() == reference.tobytes()
        if M > 1:  # both refuse a pack that would overflow M, rather than truncating it
            fullest = max(range(len(groups)), key=lambda p: sum(len(sequences[j].mlm_positions) for j in groups[p]))
            if sum(len(sequences[j].mlm_positions) for j in groups[fullest]) == M:
                with pytest.raises(DataError, match="MLM predictions"):
                    build_packs(store, offsets, PackLayout(S, K, M - 1, vocab_size=1000))
                with pytest.raises(DataError, match="MLM predictions"):
                    pack_sequences([[sequences[j] for j in g] for g in groups], S, K, M - 1)


def test_reference_builder_lays_out_the_documented_fields():
    a = Instance(np.array([2, 7, 3, 8, 3]), np.array([0, 0, 0, 1, 1]), np.array([1]), np.array([9]), 1)
    b = Instance(np.array([2, 6, 3, 5, 5, 3]), np.array([0, 0, 0, 1, 1, 1]), np.array([3, 4]), np.array([10, 11]), 0)
    (pack,) = pack_sequences([[a, b]], S=12, K=3, M=4)
    assert pack["input_ids"].tolist() == [2, 7, 3, 8, 3, 2, 6, 3, 5, 5, 3, 0]
    assert pack["token_type_ids"].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0]
    assert pack["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0]
    assert pack["sequence_ids"].tolist() == [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 0]
    assert pack["mlm_positions"].tolist() == [1, 8, 9, 0]
    assert pack["mlm_labels"].tolist() == [9, 10, 11, IGNORE_INDEX]
    assert pack["cls_positions"].tolist() == [0, 5, 0]
    assert pack["nsp_labels"].tolist() == [1, 0, IGNORE_INDEX]
    for K, S, M in ((1, 12, 4), (3, 10, 4), (3, 12, 2)):
        with pytest.raises(DataError, match="refusing to truncate"):
            pack_sequences([[a, b]], S=S, K=K, M=M)

# ---- every value a dataset's files hold is checked when it is opened ---------------------------------------------
# data/format.py `read_manifest` (`_check_manifest_values`): sizes within data/limits.py's, ids inside the
# vocabulary, counts that agree with each other, finite ratios; data/shards.py `validate_shards` (`check_packs`,
# `compare_counts`), run when a dataset is opened: every field's values in range, vectorised, and the packs' counts
# against the manifest's. Each hostile row keeps the checksums consistent (the shard's sha256 rewritten), so only the
# value check can catch it; each is refused in one line naming the file and the field.

S, K, V = 32, 3, 64


def _manifest(directory):
    with open(os.path.join(directory, "manifest.json")) as f:
        return json.load(f)


def _save_manifest(directory, manifest):
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        f.write(json.dumps(manifest))  # Python's json writes NaN and Infinity: what a hostile file may hold


def edit_shard(field, value, pack=0, slot=0):
    """A row: set `field`[pack, slot] of shard 0 to `value` and rewrite its sha256 in the manifest."""
    def apply(directory):
        manifest = _manifest(directory)
        path = os.path.join(directory, manifest["shards"][0]["file"])
        packs = np.load(path)
        column = packs[field]
        info = np.iinfo(column.dtype)
        assert info.min <= value <= info.max, (field, value, column.dtype)
        column[pack, slot] = value
        packs[field] = column
        np.save(path, packs)
        manifest["shards"][0]["sha256"] = sha256_file(path)
        _save_manifest(directory, manifest)
    return apply


def edit_manifest(change):
    def apply(directory):
        manifest = _manifest(directory)
        change(manifest)
        _save_manifest(directory, manifest)
    return apply


def _mlm_on_padding(directory):
    manifest = _manifest(directory)
    path = os.path.join(directory, manifest["shards"][0]["file"])
    packs = np.load(path)
    pack = int(np.flatnonzero((packs["sequence_ids"] == 0).any(axis=1))[0])  # a pack with padding
    pad = int(np.flatnonzero(packs["sequence_ids"][pack] == 0)[0])
    packs["mlm_positions"][pack, 0] = pad
    np.save(path, packs)
    manifest["shards"][0]["sha256"] = sha256_file(path)
    _save_manifest(directory, manifest)


def _drop_a_sequence_label(directory):
    manifest = _manifest(directory)
    path = os.path.join(directory, manifest["shards"][0]["file"])
    packs = np.load(path)
    packs["nsp_labels"][0, 0] = -100
    np.save(path, packs)
    manifest["shards"][0]["sha256"] = sha256_file(path)
    _save_manifest(directory, manifest)


def _more_sequences(m):
    """4000 more sequences (of length 1) than the shards hold, the length histogram and num_tokens kept in step."""
    m["num_sequences"] += 4000
    m["sequence_length_histogram"][0] += 4000
    m["num_tokens"] += 4000
    m["packing_factor"] = m["num_sequences"] / float(m["num_packs"])
    m["packing_efficiency"] = m["num_tokens"] / float(m["num_packs"] * m["max_seq_length"])


def _consistent_recount(m):
    """num_sequences +1 with its histogram and num_tokens kept in step (the shards hold one fewer)."""
    m["num_sequences"] += 1
    m["sequence_length_histogram"][S - 1] += 1
    m["num_tokens"] += S
    m["sequences_per_pack_histogram"][0] -= 1
    m["sequences_per_pack_histogram"][1] += 1
    m["packing_factor"] = m["num_sequences"] / float(m["num_packs"])
    m["packing_efficiency"] = m["num_tokens"] / float(m["num_packs"] * m["max_seq_length"])


def _moved_length(m):
    """One sequence moved from one length bin to another, num_tokens kept in step: only the shards disagree."""
    hist = m["sequence_length_histogram"]
    i = next(j for j, c in enumerate(hist) if c > 0 and j + 1 < len(hist))
    hist[i] -= 1
    hist[i + 1] += 1
    m["num_tokens"] += 1
    m["packing_efficiency"] = m["num_tokens"] / float(m["num_packs"] * m["max_seq_length"])


def _set(key, value):
    def change(m):
        if isinstance(key, tuple):
            m[key[0]][key[1]] = value
        else:
            m[key] = value
    return change


SHARD_ROWS = [
    ("input-id-over-vocab", edit_shard("input_ids", V + 3), "'input_ids' pack 0 slot 0 is 67"),
    ("input-id-255", edit_shard("input_ids", 255, slot=5), "'input_ids' pack 0 slot 5"),
    ("token-type-2", edit_shard("token_type_ids", 2, slot=1), "'token_type_ids'"),
    ("position-at-S", edit_shard("position_ids", S, slot=3), "'position_ids' pack 0 slot 3 is 32"),
    ("sequence-id-over-K", edit_shard("sequence_ids", K + 1, slot=2), "'sequence_ids'"),
    ("mlm-position-at-S", edit_shard("mlm_positions", S + 7), "'mlm_positions'"),
    ("mlm-label-over-vocab", edit_shard("mlm_labels", V), "'mlm_labels'"),
    ("mlm-label-negative", edit_shard("mlm_labels", -5), "'mlm_labels'"),
    ("cls-position-over-S", edit_shard("cls_positions", S + 1), "'cls_positions'"),
    ("nsp-label-2", edit_shard("nsp_labels", 2), "'nsp_labels'"),
    ("nsp-label-negative", edit_shard("nsp_labels", -7), "'nsp_labels'"),
    ("mlm-on-padding", _mlm_on_padding, "padding position"),
    ("nsp-label-dropped", _drop_a_sequence_label, "sequences"),
]

MANIFEST_ROWS = [
    ("plus-4000-sequences", edit_manifest(_more_sequences), "num_sequences"),
    ("recount-plus-one", edit_manifest(_consistent_recount), "shards hold"),
    ("length-moved", edit_manifest(_moved_length), "shards hold"),
    ("masked-plus-one", edit_manifest(lambda m: m.update(num_masked_tokens=m["num_masked_tokens"] + 1)),
     "num_masked_tokens"),
    ("packing-factor-nan", edit_manifest(_set("packing_factor", float("nan"))), "packing_factor"),
    ("efficiency-infinite", edit_manifest(_set("packing_efficiency", float("inf"))), "packing_efficiency"),
    ("packing-factor-wrong", edit_manifest(lambda m: m.update(packing_factor=m["packing_factor"] * 2)),
     "packing_factor"),
    ("pad-id-outside-vocab", edit_manifest(_set(("special_token_ids", "[PAD]"), V)), "special_token_ids"),
    ("pad-id-negative", edit_manifest(_set(("special_token_ids", "[PAD]"), -1)), "special_token_ids"),
    ("mask-id-is-pad-id", edit_manifest(_set(("special_token_ids", "[MASK]"), 0)), "special_token_ids"),
    ("special-id-string", edit_manifest(_set(("special_token_ids", "[CLS]"), "2")), "special_token_ids"),
    ("special-key-missing", edit_manifest(lambda m: m["special_token_ids"].pop("[SEP]")), "special_token_ids"),
    ("seq-length-huge", edit_manifest(_set("max_seq_length", 10 ** 9)), "max_seq_length"),
    ("k-huge", edit_manifest(_set("max_sequences_per_pack", 10 ** 6)), "max_sequences_per_pack"),
    ("vocab-size-2", edit_manifest(_set("vocab_size", 2)), "vocab_size"),
    ("mlm-slots-over-S", edit_manifest(_set("mlm_slots", S + 1)), "mlm_slots"),
    ("per-pack-histogram-long", edit_manifest(lambda m: m["sequences_per_pack_histogram"].append(0)),
     "sequences_per_pack_histogram"),
    ("length-histogram-negative", edit_manifest(_set(("sequence_length_histogram", 0), -1)),
     "sequence_length_histogram"),
    ("length-histogram-bool", edit_manifest(_set(("sequence_length_histogram", 0), True)),
     "sequence_length_histogram"),
    ("length-histogram-float", edit_manifest(_set(("sequence_length_histogram", 0), 0.5)),
     "sequence_length_histogram"),
    ("padded-with-K-3", edit_manifest(_set("kind", "padded")), "kind"),
    ("shard-count-negative", edit_manifest(lambda m: m["shards"][0].update(num_packs=-1)), "shards"),
    ("seed-negative", edit_manifest(_set("seed", -3)), "seed"),
    ("shard-extra-key", edit_manifest(lambda m: m["shards"][0].update(extra=1)), "shards"),
]



@pytest.mark.parametrize("name, make, words", SHARD_ROWS + MANIFEST_ROWS,
                         ids=[r[0] for r in SHARD_ROWS + MANIFEST_ROWS])
def test_a_hostile_dataset_is_refused_when_opened(name, make, words, tiny_data, tmp_path):
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(tiny_data, "packed"), directory)
    make(directory)
    with pytest.raises(UserError) as info:
        open_dataset(directory)
    message = str(info.value)
    assert words in message, message
    assert "\n" not in message and directory in message, message


def test_the_clean_dataset_opens_and_inspect_says_one_line_for_a_hostile_one(tiny_data, tmp_path, capsys):
    packed = os.path.join(tiny_data, "packed")
    assert len(open_dataset(packed)) == _manifest(packed)["num_packs"]
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(tiny_data, "packed"), directory)
    edit_shard("position_ids", S + 2, pack=1, slot=4)(directory)
    code = data_main(["inspect", directory])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "'position_ids' pack 1 slot 4 is 34" in lines[0], err

# ---- the files a manifest names stay inside its directory ----------------------------------------------------
# data/format.py `read_manifest` joins each name (vocab_file, each shard's file) only through
# fsutil.contained_path: no absolute path, no `..` out, no symlink whose real path leaves the directory, no name
# twice; data/shards.py opens the shards through the same helper. Each hostile row points at a real, valid copy of
# the data outside the directory (its checksum rewritten), so only the containment check can refuse it.

def _edit(directory, change):
    path = os.path.join(directory, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    change(manifest, directory)
    with open(path, "w") as f:
        json.dump(manifest, f)


def _outside(directory, name):
    """A copy of the dataset's file `name` beside (outside) the directory; returns its path."""
    target = os.path.join(os.path.dirname(directory), "outside-" + name)
    shutil.copyfile(os.path.join(directory, name), target)
    return target


def shard_named(how):
    def change(manifest, directory):
        name = manifest["shards"][0]["file"]
        target = _outside(directory, name)
        manifest["shards"][0]["file"] = how(directory, name, target)
    return change


def vocab_named(how):
    def change(manifest, directory):
        target = _outside(directory, "vocab.txt")
        manifest["vocab_file"] = how(directory, "vocab.txt", target)
    return change


def _symlink(directory, name, target):
    os.remove(os.path.join(directory, name))
    os.symlink(target, os.path.join(directory, name))
    return name


def _symlinked_dir(directory, name, target):
    os.symlink(os.path.dirname(target), os.path.join(directory, "up"))
    return os.path.join("up", os.path.basename(target))


def _twice(manifest, directory):
    first = manifest["shards"][0]
    manifest["shards"][1] = dict(first)
    manifest["num_packs"] = 2 * first["num_packs"]


PATH_ROWS = [
    ("shard-absolute", shard_named(lambda d, n, t: t), "absolute"),
    ("shard-dotdot", shard_named(lambda d, n, t: "../" + os.path.basename(t)), "leaves"),
    ("shard-dotdot-deep", shard_named(lambda d, n, t: "x/../../" + os.path.basename(t)), "leaves"),
    ("shard-symlink-out", shard_named(_symlink), "symlink"),
    ("shard-through-symlinked-dir", shard_named(_symlinked_dir), "symlink"),
    ("shard-empty-name", shard_named(lambda d, n, t: ""), "not a file name"),
    ("shard-nul", shard_named(lambda d, n, t: n + "\0x"), "not a file name"),
    ("shard-named-twice", _twice, "named before"),
    ("vocab-absolute", vocab_named(lambda d, n, t: t), "absolute"),
    ("vocab-dotdot", vocab_named(lambda d, n, t: "../" + os.path.basename(t)), "leaves"),
    ("vocab-symlink-out", vocab_named(_symlink), "symlink"),
    ("vocab-through-symlinked-dir", vocab_named(_symlinked_dir), "symlink"),
    ("vocab-etc", vocab_named(lambda d, n, t: "../../../../../../../../etc/hostname"), "leaves"),
]


@pytest.mark.parametrize("name, change, words", PATH_ROWS, ids=[r[0] for r in PATH_ROWS])
def test_a_manifest_names_only_files_inside_its_directory(name, change, words, tiny_data, tmp_path):
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(tiny_data, "packed"), directory)
    _edit(directory, change)
    with pytest.raises(UserError) as info:
        open_dataset(directory)
    message = str(info.value)
    assert words in message and "manifest.json" in message and "\n" not in message, message


def test_a_symlink_inside_the_directory_is_kept(tiny_data, tmp_path):
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(tiny_data, "packed"), directory)
    os.rename(os.path.join(directory, "vocab.txt"), os.path.join(directory, "vocab-real.txt"))
    os.symlink("vocab-real.txt", os.path.join(directory, "vocab.txt"))
    assert len(open_dataset(directory)) > 0
