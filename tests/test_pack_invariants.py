"""The pack format's structural invariants (data/format.py) are checked wherever a dataset is opened, by one
function (data/shards.py `check_packs`), and by the writer before a shard is written.

Each row corrupts one real pack of the prepared default corpus (S=128, K=3) in one way, then rewrites the
shard's sha256 and recounts the manifest (sequences, tokens, masked tokens, both histograms) so that every
checksum and count agrees: only the invariant can catch it. `open_dataset` and `inspect` must both refuse it
in one line naming the pack and the field the invariant is about."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from ipu_packing.data import open_dataset
from ipu_packing.data.cli import main as data_main
from ipu_packing.errors import DataError
from ipu_packing.fsutil import sha256_file

PACKS = 400  # packs of the default dataset's first shard, spread over it: every kind of pack the rows need


def _read(directory):
    with open(os.path.join(directory, "manifest.json")) as f:
        return json.load(f)


def recount(directory, packs):
    """Save `packs` as the directory's one shard, and make the manifest's sha256, counts and histograms agree
    with it, counted as the range checks count them (sequence ids present, used NSP and MLM slots)."""
    manifest = _read(directory)
    path = os.path.join(directory, manifest["shards"][0]["file"])
    np.save(path, packs)
    s, k = manifest["max_seq_length"], manifest["max_sequences_per_pack"]
    sid = packs["sequence_ids"].astype(np.int64)
    per_sequence = np.stack([(sid == j).sum(axis=1) for j in range(1, k + 1)], axis=1)
    lengths = np.bincount(per_sequence[per_sequence > 0], minlength=s + 1)[1:s + 1]
    per_pack = np.bincount((packs["nsp_labels"] != -100).sum(axis=1), minlength=k + 1)[1:k + 1]
    n, p = int(lengths.sum()), len(packs)
    tokens = int(np.dot(lengths, np.arange(1, s + 1)))
    manifest.update(num_sequences=n, num_packs=p, num_tokens=tokens,
                    num_masked_tokens=int((packs["mlm_labels"] != -100).sum()),
                    sequence_length_histogram=lengths.tolist(), sequences_per_pack_histogram=per_pack.tolist(),
                    packing_factor=n / float(p), packing_efficiency=tokens / float(p * s),
                    shards=[{"file": manifest["shards"][0]["file"], "num_packs": p, "sha256": sha256_file(path)}])
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


@pytest.fixture(scope="module")
def clean(default_data_128, tmp_path_factory):
    """A dataset of PACKS packs of the default dataset (one shard), with a manifest that agrees."""
    directory = str(tmp_path_factory.mktemp("invariants") / "packed")
    os.makedirs(directory)
    manifest = _read(default_data_128)
    shutil.copyfile(os.path.join(default_data_128, manifest["vocab_file"]),
                    os.path.join(directory, manifest["vocab_file"]))
    packs = np.load(os.path.join(default_data_128, manifest["shards"][0]["file"]), mmap_mode="r")
    packs = packs[np.linspace(0, len(packs) - 1, PACKS).astype(np.int64)]  # spread: most packs are full
    manifest["shards"] = manifest["shards"][:1]
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    recount(directory, packs)
    open_dataset(directory)  # the clean slice holds every invariant
    return directory


# -- which pack a row corrupts ----------------------------------------------------------------------------

def sequences(packs, p):
    return int((packs["nsp_labels"][p] != -100).sum())


def starts(packs, p):
    return [int(c) for c in packs["cls_positions"][p][:sequences(packs, p)]]


def end(packs, p):
    return int((packs["sequence_ids"][p] != 0).sum())


def masked(packs, p):
    return int((packs["mlm_labels"][p] != -100).sum())


def first(packs, wanted):
    """The first pack for which wanted(p) holds."""
    return next(p for p in range(len(packs)) if wanted(p))


def with_sequences(packs, k, padding=False, masks=0, b_segment=False):
    def wanted(p):
        return (sequences(packs, p) >= k and (not padding or end(packs, p) < packs["sequence_ids"].shape[1] - 2)
                and masked(packs, p) >= masks and (not b_segment or packs["token_type_ids"][p].any()))
    return first(packs, wanted)


# -- the corruptions: each takes the packs, changes one pack in place and returns its index -----------------

def contaminate(packs, cls_id):
    """A token inside sequence 1 carries sequence 2's id."""
    p = with_sequences(packs, 2)
    packs["sequence_ids"][p, starts(packs, p)[0] + 3] = 2
    return p


def swap_runs(packs, cls_id):
    """Sequences 1 and 2 swap their ids (runs 2, 1: not in order)."""
    p = with_sequences(packs, 2)
    sid = packs["sequence_ids"][p]
    one, two = sid == 1, sid == 2
    sid[one], sid[two] = 2, 1
    return p


def sequence_after_padding(packs, cls_id):
    """The last real token moves to the last slot, after the padding."""
    p = with_sequences(packs, 1, padding=True)
    last, s = end(packs, p) - 1, packs["sequence_ids"].shape[1]
    packs["sequence_ids"][p, s - 1] = packs["sequence_ids"][p, last]
    packs["sequence_ids"][p, last] = 0
    return p


def id_gap(packs, cls_id):
    """Sequence 2 of a two-sequence pack is numbered 3."""
    p = first(packs, lambda q: sequences(packs, q) == 2)
    sid = packs["sequence_ids"][p]
    sid[sid == 2] = 3
    return p


def third_into_first(packs, cls_id):
    """A token of sequence 3 carries sequence 1's id."""
    p = with_sequences(packs, 3)
    packs["sequence_ids"][p, starts(packs, p)[2] + 2] = 1
    return p


def positions_do_not_restart(packs, cls_id):
    """Sequence 2's positions continue sequence 1's instead of restarting at 0."""
    p = with_sequences(packs, 2)
    n = end(packs, p)
    packs["position_ids"][p, :n] = np.arange(n)
    return p


def position_skips(packs, cls_id):
    """Inside sequence 1 the positions jump by two from its fifth token on."""
    p = with_sequences(packs, 2)
    a, b = starts(packs, p)[:2]
    packs["position_ids"][p, a + 4:b] += 1
    return p


def position_repeats(packs, cls_id):
    """A token repeats the position of the token before it."""
    p = with_sequences(packs, 1)
    packs["position_ids"][p, 6] = packs["position_ids"][p, 5]
    return p


def position_skip_at_a_type_drop(packs, cls_id):
    """Inside segment B, one token's position jumps by two while its type falls back to 0 (A), the rest of the
    sequence shifted along: each field alone still looks like a sequence's."""
    s = packs["sequence_ids"].shape[1]
    p = first(packs, lambda q: packs["token_type_ids"][q].any() and end(packs, q) < s)  # room for one position more
    types = packs["token_type_ids"][p]
    t = int(np.flatnonzero(types)[0]) + 1  # the second token of segment B
    sid = packs["sequence_ids"][p]
    last = int(np.flatnonzero(sid == sid[t])[-1])
    packs["position_ids"][p, t:last + 1] += 1
    types[t] = 0
    return p


def position_on_padding(packs, cls_id):
    """Padding carries its slot index as a position."""
    p = with_sequences(packs, 1, padding=True)
    s = packs["position_ids"].shape[1]
    packs["position_ids"][p, end(packs, p):] = np.arange(end(packs, p), s)
    return p


def restart_mid_sequence(packs, cls_id):
    """Positions restart at 0 in the middle of a sequence."""
    p = with_sequences(packs, 1)
    a = starts(packs, p)[0]
    length = int((packs["sequence_ids"][p] == 1).sum())
    packs["position_ids"][p, a + 5:a + length] = np.arange(length - 5)
    return p


def cls_into_other_sequence(packs, cls_id):
    """cls_positions[1] points at a token inside sequence 1."""
    p = with_sequences(packs, 2)
    packs["cls_positions"][p, 1] = starts(packs, p)[0] + 2
    return p


def cls_at_padding(packs, cls_id):
    """The last sequence's cls_positions points at padding."""
    p = with_sequences(packs, 1, padding=True)
    packs["cls_positions"][p, sequences(packs, p) - 1] = end(packs, p) + 1
    return p


def cls_at_a_word(packs, cls_id):
    """cls_positions[0] points at a word of sequence 1."""
    p = with_sequences(packs, 1)
    packs["cls_positions"][p, 0] = 3
    return p


def cls_token_replaced(packs, cls_id):
    """Sequence 2's first token is a word, not [CLS]."""
    p = with_sequences(packs, 2)
    packs["input_ids"][p, starts(packs, p)[1]] = packs["input_ids"][p, starts(packs, p)[1] + 1]
    return p


def cls_slot_shared(packs, cls_id):
    """Sequences 1 and 2 both read their NSP label at sequence 1's [CLS]."""
    p = with_sequences(packs, 2)
    packs["cls_positions"][p, 1] = packs["cls_positions"][p, 0]
    return p


def unused_cls_slot(packs, cls_id):
    """An unused cls_positions slot points at a token."""
    p = first(packs, lambda q: sequences(packs, q) < packs["cls_positions"].shape[1])
    packs["cls_positions"][p, -1] = 4
    return p


def nsp_label_on_wrong_slot(packs, cls_id):
    """Sequence 2's NSP label moves to slot 2 (no sequence 3); slot 1 is left unused."""
    p = first(packs, lambda q: sequences(packs, q) == 2)
    packs["nsp_labels"][p, 2], packs["nsp_labels"][p, 1] = packs["nsp_labels"][p, 1], -100
    return p


def nsp_label_shifted(packs, cls_id):
    """A one-sequence pack's label sits on slot 1; slot 0 is unused."""
    p = first(packs, lambda q: sequences(packs, q) == 1)
    packs["nsp_labels"][p, 1], packs["nsp_labels"][p, 0] = packs["nsp_labels"][p, 0], -100
    return p


def masked_twice(packs, cls_id):
    """Two MLM slots hold the same position."""
    p = with_sequences(packs, 1, masks=2)
    packs["mlm_positions"][p, 1] = packs["mlm_positions"][p, 0]
    return p


def masked_out_of_order(packs, cls_id):
    """The first two MLM slots swap (positions and labels)."""
    p = with_sequences(packs, 1, masks=2)
    for name in ("mlm_positions", "mlm_labels"):
        packs[name][p, :2] = packs[name][p, :2][::-1].copy()
    return p


def masked_cls(packs, cls_id):
    """The first MLM slot points at the pack's [CLS]."""
    p = with_sequences(packs, 1, masks=1)
    packs["mlm_positions"][p, 0] = 0
    return p


def masked_in_next_sequence(packs, cls_id):
    """Sequence 1's last prediction moves past sequence 2's first one, into sequence 2."""
    def wanted(q):
        if sequences(packs, q) < 2:
            return False
        b = starts(packs, q)[1]
        used = packs["mlm_positions"][q][packs["mlm_labels"][q] != -100]
        return (used < b).any() and (used >= b).sum() >= 1 and used[used >= b][0] + 1 < b + 30
    p = first(packs, wanted)
    used = packs["mlm_positions"][p][packs["mlm_labels"][p] != -100]
    b = starts(packs, p)[1]
    last_of_first = int(np.flatnonzero(used < b)[-1])
    packs["mlm_positions"][p, last_of_first] = int(used[used >= b][0]) + 1
    return p


def unused_slot_position(packs, cls_id):
    """An unused MLM slot has position 7."""
    p = first(packs, lambda q: packs["mlm_labels"][q][-1] == -100)
    packs["mlm_positions"][p, -1] = 7
    return p


def used_slot_after_gap(packs, cls_id):
    """The last prediction moves to the last MLM slot, leaving unused slots before it."""
    p = first(packs, lambda q: 0 < masked(packs, q) < packs["mlm_labels"].shape[1] - 1)
    j = masked(packs, p) - 1
    for name, empty in (("mlm_positions", 0), ("mlm_labels", -100)):
        packs[name][p, -1], packs[name][p, j] = packs[name][p, j], empty
    return p


def masked_on_padding(packs, cls_id):
    """The first MLM slot points at padding."""
    p = with_sequences(packs, 1, padding=True, masks=1)
    packs["mlm_positions"][p, 0] = end(packs, p) + 1
    return p


def token_type_on_padding(packs, cls_id):
    """Padding has token type 1."""
    p = with_sequences(packs, 1, padding=True)
    packs["token_type_ids"][p, end(packs, p):] = 1
    return p


def token_type_at_cls(packs, cls_id):
    """Sequence 2's [CLS] has token type 1."""
    p = with_sequences(packs, 2)
    packs["token_type_ids"][p, starts(packs, p)[1]] = 1
    return p


def segment_b_then_a(packs, cls_id):
    """A sequence's last token ([SEP] of B) has token type 0: segment B, then A again."""
    p = with_sequences(packs, 1, b_segment=True)
    sid = packs["sequence_ids"][p]
    j = int(sid[np.flatnonzero(packs["token_type_ids"][p])[0]])
    packs["token_type_ids"][p, int(np.flatnonzero(sid == j)[-1])] = 0
    return p


ROWS = [
    ("cross-contamination", contaminate, "'sequence_ids'"),
    ("runs-out-of-order", swap_runs, "'sequence_ids'"),
    ("sequence-after-padding", sequence_after_padding, "'sequence_ids'"),
    ("sequence-id-gap", id_gap, "'sequence_ids'"),
    ("third-into-first", third_into_first, "'sequence_ids'"),
    ("positions-do-not-restart", positions_do_not_restart, "'position_ids'"),
    ("position-skips", position_skips, "'position_ids'"),
    ("position-repeats", position_repeats, "'position_ids'"),
    ("position-skip-at-a-type-drop", position_skip_at_a_type_drop, "'position_ids'"),
    ("position-on-padding", position_on_padding, "'position_ids'"),
    ("position-restarts-mid-sequence", restart_mid_sequence, "'position_ids'"),
    ("cls-into-another-sequence", cls_into_other_sequence, "'cls_positions'"),
    ("cls-at-padding", cls_at_padding, "'cls_positions'"),
    ("cls-at-a-word", cls_at_a_word, "'cls_positions'"),
    ("cls-token-not-cls", cls_token_replaced, "not [CLS]"),
    ("nsp-slot-read-by-two", cls_slot_shared, "'cls_positions'"),
    ("unused-cls-slot-set", unused_cls_slot, "'cls_positions'"),
    ("nsp-label-on-wrong-slot", nsp_label_on_wrong_slot, "'nsp_labels'"),
    ("nsp-label-shifted", nsp_label_shifted, "'nsp_labels'"),
    ("masked-twice", masked_twice, "appear twice"),
    ("masked-out-of-order", masked_out_of_order, "out of order"),
    ("masked-cls", masked_cls, "[CLS]"),
    ("masked-in-next-sequence", masked_in_next_sequence, "'mlm_positions'"),
    ("unused-mlm-slot-position", unused_slot_position, "unused"),
    ("used-mlm-slot-after-gap", used_slot_after_gap, "'mlm_labels'"),
    ("masked-on-padding", masked_on_padding, "padding position"),
    ("token-type-on-padding", token_type_on_padding, "'token_type_ids'"),
    ("token-type-at-cls", token_type_at_cls, "'token_type_ids'"),
    ("segment-b-then-a", segment_b_then_a, "'token_type_ids'"),
]


@pytest.mark.parametrize("name, corrupt, words", ROWS, ids=[r[0] for r in ROWS])
def test_a_pack_that_breaks_an_invariant_is_refused_when_opened(name, corrupt, words, clean, tmp_path, capsys):
    directory = str(tmp_path / "packed")
    shutil.copytree(clean, directory)
    manifest = _read(directory)
    packs = np.load(os.path.join(directory, manifest["shards"][0]["file"]))
    p = corrupt(packs, manifest["special_token_ids"]["[CLS]"])
    recount(directory, packs)  # checksums and counts agree: only the invariant can refuse it
    with pytest.raises(DataError) as info:
        open_dataset(directory)
    message = str(info.value)
    assert "\n" not in message and directory in message, message
    assert "pack %d:" % p in message and words in message, message
    assert data_main(["inspect", directory]) == 2  # the same check, the same line
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "error: %s\n" % message


# -- the writer runs the same check on every shard before writing it -------------------------------------

def _instances(first_token=2, positions=(3, 5)):
    """Two sequences of 8 tokens as instance arrays ([CLS] A [SEP] B [SEP]), the masked `positions` each."""
    from ipu_packing.data.instance_files import Instances

    ids = np.array([first_token, 7, 8, 3, 9, 10, 11, 3] * 2, dtype=np.int32)
    q = len(positions)
    return Instances(ids, np.array([8, 8], np.int32), np.array([4, 4], np.int32), np.array([0, 1], np.int32),
                     np.array([q, q], np.int32), np.array(list(positions) * 2, np.int32),
                     np.array([20] * 2 * q, np.int32))


WRITER_ROWS = [
    ("first-token-not-cls", dict(first_token=9), "not [CLS]"),
    ("masked-positions-descending", dict(positions=(5, 3)), "out of order"),
    ("masked-cls", dict(positions=(0, 4)), "[CLS]"),
]


@pytest.mark.parametrize("name, change, words", WRITER_ROWS, ids=[r[0] for r in WRITER_ROWS])
def test_the_writer_refuses_a_shard_that_breaks_an_invariant(name, change, words, tmp_path):
    from ipu_packing.data.write.packs import PackLayout, ShardTask, write_shard

    path = str(tmp_path / "shard-00000.npy")
    task = ShardTask(path, np.array([0, 2], dtype=np.int64), 0)
    layout = PackLayout(32, 3, 6, 64, cls_id=2)
    write_shard(_instances(), task, layout)  # the clean pair is written
    os.remove(path)
    with pytest.raises(DataError) as info:
        write_shard(_instances(**change), task, layout)
    assert "pack 0:" in str(info.value) and words in str(info.value), str(info.value)
    assert not os.path.exists(path)


def test_every_dataset_the_package_writes_holds_the_invariants(tmp_path):
    """The fixture datasets of the application's tests (both layouts), written by the data package's writer."""
    import app_fixtures as fx

    root = fx.write_prepared(str(tmp_path / "data"), S=48, K=3, V=64, num_sequences=120)
    for kind in ("packed", "padded"):
        assert len(open_dataset(os.path.join(root, kind))) > 0


def test_the_vectorised_pass_finds_the_first_pack_the_plain_statement_refuses():
    """data/shards.py checks a block of packs with whole-block numpy passes (`_broken_packs`) and names what
    the first flagged pack breaks with a plain loop over its slots (`_first_broken_invariant`). On blocks of
    random packs with one to three values changed (each kept inside its field's range, so only an invariant
    can catch it) both must find the same first broken pack, or none."""
    from ipu_packing.data.format import CLS_ID, FIELDS
    from ipu_packing.data.random_instances import random_packs
    from ipu_packing.data.shards import _broken_packs, _first_broken_invariant

    rng = np.random.default_rng(0)
    s, k, v = 24, 3, 40
    ranges = {"input_ids": (0, v), "token_type_ids": (0, 2), "position_ids": (0, s), "sequence_ids": (0, k + 1),
              "mlm_positions": (0, s), "mlm_labels": (-1, v), "cls_positions": (0, s), "nsp_labels": (-1, 2)}
    found = 0
    for trial in range(400):
        groups = [list(rng.integers(5, 13, size=rng.integers(1, k + 1))) for _ in range(6)]
        groups = [g if sum(g) <= s else g[:1] for g in groups]
        packs = random_packs(rng, groups, S=s, K=k, vocab_size=v)
        arrays = {name: np.ascontiguousarray(packs[name]) for name in FIELDS}
        for _ in range(int(rng.integers(0 if trial < 20 else 1, 4))):
            name = FIELDS[int(rng.integers(len(FIELDS)))]
            low, high = ranges[name]
            value = int(rng.integers(low, high))
            arrays[name][int(rng.integers(len(packs))), int(rng.integers(arrays[name].shape[1]))] = \
                -100 if value == -1 else value
        plain = [p for p in range(len(packs))
                 if _first_broken_invariant({n: a[p] for n, a in arrays.items()}, CLS_ID) is not None]
        flagged = np.flatnonzero(_broken_packs(arrays, CLS_ID))
        assert (plain[:1] == flagged[:1].tolist()), (trial, plain, flagged.tolist())
        found += bool(plain)
    assert found > 200  # most changes break something: the two passes were compared on broken packs
