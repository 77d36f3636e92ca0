"""The one generator of random NSP/MLM instances (data/random_instances.py) keeps its documented rule for every
length, vocabulary, probability and cap, and its packs fit the M the data pipeline sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipu_packing.data.format import (CLS_ID, FIRST_WORD_ID, IGNORE_INDEX, MASK_ID, MIN_SEQ_LENGTH, SEP_ID,
                                     mlm_slots, num_to_predict)
from ipu_packing.data.random_instances import (draw_instances, keep_first_predictions, random_instance,
                                               random_instances, random_packs)
from ipu_packing.data.reference import unpack

CAPS = st.one_of(st.none(), st.integers(0, 12))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 80), min_size=1, max_size=12), st.integers(FIRST_WORD_ID + 1, 300),
       st.sampled_from([0.15, 0.3, 0.5]), CAPS, st.integers(0, 2 ** 32 - 1))
def test_every_instance_keeps_the_rule(lengths, vocab_size, prob, cap, seed):
    drawn = random_instances(np.random.default_rng(seed), lengths, vocab_size, prob, cap)
    # a cap of 0 draws the same tokens and masks none: the originals
    plain = random_instances(np.random.default_rng(seed), lengths, vocab_size, prob, 0)
    for length, instance, original in zip(lengths, drawn, plain):
        ids, types, positions = instance.input_ids, instance.token_type_ids, instance.mlm_positions
        assert len(instance) == len(types) == length
        assert len(original.mlm_positions) == 0
        assert ids[0] == CLS_ID
        separators = np.flatnonzero(original.input_ids == SEP_ID).tolist()
        if length >= MIN_SEQ_LENGTH:
            middle = separators[0]
            assert separators == [middle, length - 1] and 2 <= middle <= length - 3
            assert types.tolist() == [0] * (middle + 1) + [1] * (length - middle - 1)
        else:
            assert separators == ([length - 1] if length >= 2 else [])
            assert types.tolist() == [0] * length
        specials = {0} | set(separators)
        words = [i for i in range(length) if i not in specials]
        assert all(FIRST_WORD_ID <= original.input_ids[i] < vocab_size for i in words)
        # predictions: the recipe's count (none below MIN_SEQ_LENGTH), within the cap, on word tokens only
        expected = int(num_to_predict([length], prob, length if cap is None else cap)[0])
        assert len(positions) == (expected if length >= MIN_SEQ_LENGTH else 0)
        assert cap is None or len(positions) <= cap
        assert positions.tolist() == sorted(set(positions.tolist()))
        assert not set(positions.tolist()) & specials
        assert instance.mlm_labels.tolist() == original.input_ids[positions].tolist()  # labels: the originals
        assert (ids[positions] == MASK_ID).all()
        rest = np.setdiff1d(np.arange(length), positions)
        assert ids[rest].tolist() == original.input_ids[rest].tolist()
        assert instance.nsp_label in (0, 1) and instance.nsp_label == original.nsp_label


@st.composite
def pack_groups(draw):
    S = draw(st.integers(8, 96))
    K = draw(st.integers(1, 4))
    groups = []
    for _ in range(draw(st.integers(1, 6))):
        k = draw(st.integers(1, K))
        lengths = [draw(st.integers(1, S)) for _ in range(k)]
        while sum(lengths) > S:
            lengths[lengths.index(max(lengths))] //= 2
        groups.append([max(1, n) for n in lengths])
    return S, K, groups


@settings(max_examples=150, deadline=None)
@given(pack_groups(), CAPS, st.integers(0, 2 ** 32 - 1))
def test_packs_fit_the_pipelines_M_and_a_smaller_M_keeps_the_first_predictions(shape, cap, seed):
    S, K, groups = shape
    packs = random_packs(np.random.default_rng(seed), groups, S, K, 50, max_predictions_per_seq=cap)
    M = mlm_slots(S, K, max_predictions_per_seq=cap)
    assert packs["mlm_labels"].shape == (len(groups), M)
    for record, group in zip(packs, groups):
        assert [len(s) for s in unpack(record)] == group
    totals = (packs["mlm_labels"] != IGNORE_INDEX).sum(1)
    small = max(0, int(totals.max()) - 1)
    trimmed = random_packs(np.random.default_rng(seed), groups, S, K, 50, M=small, max_predictions_per_seq=cap)
    assert (trimmed["mlm_labels"] != IGNORE_INDEX).sum(1).tolist() == np.minimum(totals, small).tolist()
    for full, cut in zip(packs, trimmed):  # the kept ones are the first in pack order; the rest unmasked
        kept = int((cut["mlm_labels"] != IGNORE_INDEX).sum())
        assert cut["mlm_positions"][:kept].tolist() == full["mlm_positions"][:kept].tolist()
        restored = full["input_ids"].copy()
        restored[full["mlm_positions"][kept:][full["mlm_labels"][kept:] != IGNORE_INDEX]] = \
            full["mlm_labels"][kept:][full["mlm_labels"][kept:] != IGNORE_INDEX]
        assert cut["input_ids"].tolist() == restored.tolist()


def test_one_instance_and_the_dense_arrays_agree_and_repeat():
    one = random_instance(np.random.default_rng(7), 40, 1000)
    again = draw_instances(np.random.default_rng(7), [40], 1000).instance(0)
    for field in ("input_ids", "token_type_ids", "mlm_positions", "mlm_labels"):
        assert getattr(one, field).tolist() == getattr(again, field).tolist()
    assert len(one.mlm_positions) == 6  # round(0.15 * 40)
    arrays = draw_instances(np.random.default_rng(3), [5, 128, 60], 30522, max_predictions_per_seq=20, width=128)
    assert arrays.input_ids.shape == (3, 128) and arrays.mlm_positions.shape == (3, 20)
    assert arrays.mlm_counts.tolist() == [1, 19, 9] and arrays.input_ids[0, 5:].tolist() == [0] * 123
    assert arrays.a_lengths.tolist() == [int(np.flatnonzero(arrays.token_type_ids[i])[0]) for i in range(3)]


def test_keep_first_predictions_unmasks_the_rest():
    group = random_instances(np.random.default_rng(1), [20, 20], 100)
    assert [len(s.mlm_positions) for s in group] == [3, 3]
    kept = keep_first_predictions(group, 4)
    assert [len(s.mlm_positions) for s in kept] == [3, 1]
    assert kept[1].input_ids[group[1].mlm_positions[1:]].tolist() == group[1].mlm_labels[1:].tolist()
    assert kept[0] is group[0]


def test_refuses_what_has_no_instance():
    with pytest.raises(ValueError, match="vocab_size"):
        random_instance(np.random.default_rng(0), 8, FIRST_WORD_ID)
    with pytest.raises(ValueError, match="lengths must be >= 1"):
        random_instances(np.random.default_rng(0), [4, 0], 100)
    with pytest.raises(ValueError, match="does not fit width"):
        draw_instances(np.random.default_rng(0), [9], 100, width=8)
