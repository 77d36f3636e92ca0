"""The size limits of the data commands, in one place: every size a user or a file gives (S, K, the
vocabulary, workers, the recipe's repetitions) is checked here before any work, so an absurd one is refused
at once, naming the limit, instead of running for hours or asking for terabytes.

    MAX_SEQ_LENGTH          S <= 65,536: lengths and in-sequence positions travel in 16 bits (instance and
                            spill files, data/instance_files.py, data/write/packs.py)
    MAX_SEQUENCES_PER_PACK  K <= 255: sequence ids fit one byte, and a pack's K slots stay small beside S
    MAX_PLAN_WORK           K * S**2 <= 2**34: sizing M (format.max_pack_predictions) is a K * S**2
                            programme (about 20 s at the limit on one core; 0.3 s at S = 8192, K = 3)
    MAX_VOCAB_SIZE          V < 2**31: token ids are int32 in the model's batches
    MAX_WORKERS             --workers <= 1024 processes
    MAX_DUPE_FACTOR         --dupe-factor <= 1000 passes over the corpus
    MAX_NUM_LABELS          L <= 16,384 labels of a classification task: a multi-label or multi-target pack holds
                            K * L float32 labels

Only this module and numpy-free arithmetic: the format, the manifest reader and both commands import it.
"""

from __future__ import annotations

from ..errors import DataError

MAX_SEQ_LENGTH = 1 << 16
MAX_SEQUENCES_PER_PACK = 255
MAX_PLAN_WORK = 1 << 34
MAX_VOCAB_SIZE = (1 << 31) - 1
MAX_WORKERS = 1024
MAX_DUPE_FACTOR = 1000
MAX_NUM_LABELS = 1 << 14


def check_at_most(what: str, value: int, limit: int, why: str) -> None:
    """DataError "<what> is <value>, over the limit of <limit> (<why>)" when value > limit."""
    if value > limit:
        raise DataError("%s is %d, over the limit of %d (%s; data/limits.py)" % (what, value, limit, why))


def check_pack_sizes(max_seq_length: int, max_sequences_per_pack: int, where: str = "") -> None:
    """S and K of a dataset to be written (`prepare`'s options, `pack`'s input): each within its limit, and
    the sizing of M (K * S**2 steps) within MAX_PLAN_WORK. `where` prefixes the message (the file S came
    from)."""
    prefix = where + ": " if where else ""
    check_at_most(prefix + "the sequence length S", max_seq_length, MAX_SEQ_LENGTH,
                  "lengths and positions are stored in 16 bits")
    check_at_most(prefix + "--max-sequences-per-pack K", max_sequences_per_pack, MAX_SEQUENCES_PER_PACK,
                  "sequence ids are stored in one byte")
    work = max_sequences_per_pack * max_seq_length * max_seq_length
    if work > MAX_PLAN_WORK:
        raise DataError("%sK * S**2 = %d * %d**2 = %d, over the limit of 2**34 = %d (sizing the masked-token slots "
                        "is a K * S**2 programme; data/limits.py): lower K or S"
                        % (prefix, max_sequences_per_pack, max_seq_length, work, MAX_PLAN_WORK))
