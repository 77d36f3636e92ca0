"""The pack format's plain reference builder: `pack_sequences` lays instances out as packs, field by field, as
format.py defines them, and `unpack` gives a pack's instances back. The vectorised writer of the data
pipeline (data/write/packs.py, `build_packs`) writes the same bytes, and a test holds the two equal; the
benches, the synthetic packs and the test fixtures lay their packs out with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import numpy as np

from ..errors import DataError
from .format import IGNORE_INDEX, pack_dtype


@dataclass
class Instance:
    """One NSP/MLM training instance, [CLS] A [SEP] B [SEP] after masking (bert's TrainingInstance)."""

    input_ids: np.ndarray  # (L,) token ids after masking
    token_type_ids: np.ndarray  # (L,) 0 for [CLS] A [SEP], 1 for B [SEP]
    mlm_positions: np.ndarray  # (Q,) masked positions within the instance, ascending
    mlm_labels: np.ndarray  # (Q,) the original token id at each
    nsp_label: int  # 0: B follows A; 1: B is random

    def __len__(self) -> int:
        return len(self.input_ids)


def pack_sequences(sequences: Sequence[Sequence[Instance]], S: int, K: int, M: int,
                   vocab_size: Optional[int] = None) -> np.ndarray:
    """Lay out instances as packs: (P,) records of pack_dtype(S, M, K, vocab_size); pack p holds sequences[p].

    This is the plain statement of the format; data/write/packs.py's build_packs writes the same bytes
    with vectorised scatters, and a test holds the two equal. Which sequences share a pack is the
    packing engine's decision (ipu_packing.packing), not this function's.
    """
    packs = np.zeros(len(sequences), dtype=pack_dtype(S, M, K, vocab_size))
    packs["mlm_labels"] = IGNORE_INDEX
    packs["nsp_labels"] = IGNORE_INDEX
    for p, group in enumerate(sequences):
        # We DON'T concatenate the sequences into one long text: each keeps its own world inside the
        # pack. They are laid back to back from position 0, in the order given, and the rest of the
        # row stays padding (zeros). sequence_ids tells each token which sequence it belongs to, so
        # attention never crosses from one sequence to another; position ids restart at 0 at every
        # [CLS], so a sequence sees exactly the positions it would see alone.
        #
        # The heads work per sequence too. Sequence k's masked tokens take the next free MLM slots
        # (their positions shifted by where the sequence starts), and its NSP label takes slot k and
        # is read at its own [CLS], never at the pack's first one.
        #
        # A pack that would hold more than K sequences, S tokens or M predictions is an error, not
        # a truncation: the plan and M are sized so that it never happens.
        start, slot = 0, 0
        if len(group) > K:
            raise DataError("pack %d would hold %d sequences, more than the %d it has room for (refusing to truncate)"
                            % (p, len(group), K))
        for k, sequence in enumerate(group):
            end = start + len(sequence)
            q = len(sequence.mlm_positions)
            if end > S:
                raise DataError("pack %d would hold %d tokens, more than the %d it has room for (refusing to truncate)"
                                % (p, sum(len(s) for s in group), S))
            if slot + q > M:
                raise DataError("pack %d would hold %d MLM predictions, more than the %d it has room for (refusing "
                                "to truncate)" % (p, sum(len(s.mlm_positions) for s in group), M))
            packs["input_ids"][p, start:end] = sequence.input_ids
            packs["token_type_ids"][p, start:end] = sequence.token_type_ids
            packs["position_ids"][p, start:end] = np.arange(len(sequence))
            packs["sequence_ids"][p, start:end] = k + 1
            packs["mlm_positions"][p, slot:slot + q] = np.asarray(sequence.mlm_positions) + start
            packs["mlm_labels"][p, slot:slot + q] = sequence.mlm_labels
            packs["cls_positions"][p, k] = start
            packs["nsp_labels"][p, k] = sequence.nsp_label
            start, slot = end, slot + q
    return packs


def unpack(pack: Any) -> List[Instance]:
    """The sequences of one pack (a record, or a mapping of its fields), in slot order: the inverse of
    pack_sequences, so pack_sequences([unpack(p)], S, K, M) gives p back. A bench lays the same
    sequences out again (padded, K = 1) from a prepared dataset this way."""
    sequence_ids = np.asarray(pack["sequence_ids"], dtype=np.int64)
    positions = np.asarray(pack["mlm_positions"], dtype=np.int64)
    labels = np.asarray(pack["mlm_labels"], dtype=np.int64)
    nsp = np.asarray(pack["nsp_labels"], dtype=np.int64)
    cls = np.asarray(pack["cls_positions"], dtype=np.int64)
    out = []
    for k in range(len(nsp)):
        if nsp[k] == IGNORE_INDEX:
            break
        start = int(cls[k])
        end = start + int((sequence_ids == k + 1).sum())  # a sequence's tokens are contiguous from its [CLS]
        own = (labels != IGNORE_INDEX) & (positions >= start) & (positions < end)
        out.append(Instance(np.asarray(pack["input_ids"][start:end], dtype=np.int64),
                            np.asarray(pack["token_type_ids"][start:end], dtype=np.int64),
                            positions[own] - start, labels[own], int(nsp[k])))
    return out
