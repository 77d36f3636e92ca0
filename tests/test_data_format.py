"""The vectorised pack writer (data/write/packs.py) writes exactly what the reference builder
(data/format.py, pack_sequences) writes, for any sequences and any grouping that fits."""

import tempfile

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ipu_packing.errors import DataError
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
