"""Input files of `python -m ipu_packing.data pack` built here: NVIDIA BERT HDF5 written with h5py as NVIDIA's
writer lays it out (int32 ids and positions, int8 masks, segments and labels, gzip), and google-research/bert
TFRecords with this module's own writer (its own CRC-32C and protobuf encoding, no TensorFlow and nothing from the
package under test). Used by tests/test_data_existing.py and the `pack` tests of other modules."""

import struct

import numpy as np

from ipu_packing.data.format import CLS_ID, FIRST_WORD_ID, MASK_ID, SEP_ID, SPECIAL_TOKENS

V = 64
S = 32
P = 6


def write_vocab(path, size=V):
    tokens = list(SPECIAL_TOKENS) + ["w%d" % i for i in range(size - len(SPECIAL_TOKENS))]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return path


def make_instances(n, seed, S=S, P=P, single_segment_share=0.1):
    """n random instances as (ids, segments, positions, labels, nsp): [CLS] A [SEP] B [SEP] (or, for a
    share of them, one segment), lengths 3..S, up to P masked positions in ascending order. Not
    data/random_instances.py's rule, on purpose: `pack` must keep whatever a producer wrote (any count of
    predictions from 0, predicted tokens left as they were, one-segment instances) bit for bit."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(3, S + 1)) if rng.random() < 0.8 else S
        ids = rng.integers(FIRST_WORD_ID, V, size=length)
        ids[0], ids[-1] = CLS_ID, SEP_ID
        if rng.random() < single_segment_share or length < 5:
            segments = np.zeros(length, dtype=np.int64)
        else:
            a = int(rng.integers(3, length - 1))  # [CLS] A [SEP] is a tokens
            ids[a - 1] = SEP_ID
            segments = (np.arange(length) >= a).astype(np.int64)
        candidates = np.arange(1, length - 1)
        q = int(rng.integers(0, min(P, len(candidates)) + 1))
        positions = np.sort(rng.choice(candidates, size=q, replace=False)) if q else np.zeros(0, dtype=np.int64)
        labels = ids[positions].copy()
        ids[positions] = np.where(rng.random(q) < 0.8, MASK_ID, ids[positions])
        out.append((ids.astype(np.int64), segments, positions.astype(np.int64), labels.astype(np.int64),
                    int(rng.integers(0, 2))))
    return out


def key(instance):
    ids, segments, positions, labels, nsp = instance
    return (tuple(int(x) for x in ids), tuple(int(x) for x in segments), tuple(int(x) for x in positions),
            tuple(int(x) for x in labels), int(nsp))


def dense(instances, S=S, P=P):
    n = len(instances)
    arrays = {"input_ids": np.zeros((n, S), np.int32), "input_mask": np.zeros((n, S), np.int8),
              "segment_ids": np.zeros((n, S), np.int8), "masked_lm_positions": np.zeros((n, P), np.int32),
              "masked_lm_ids": np.zeros((n, P), np.int32), "masked_lm_weights": np.zeros((n, P), np.float32),
              "next_sentence_labels": np.zeros(n, np.int8)}
    for i, (ids, segments, positions, labels, nsp) in enumerate(instances):
        arrays["input_ids"][i, :len(ids)] = ids
        arrays["input_mask"][i, :len(ids)] = 1
        arrays["segment_ids"][i, :len(ids)] = segments
        arrays["masked_lm_positions"][i, :len(positions)] = positions
        arrays["masked_lm_ids"][i, :len(positions)] = labels
        arrays["masked_lm_weights"][i, :len(positions)] = 1.0
        arrays["next_sentence_labels"][i] = nsp
    return arrays


def write_hdf5(path, instances, drop=(), shapes=None, S=S, P=P):
    """As NVIDIA DeepLearningExamples' create_pretraining_data.py writes it."""
    arrays = dense(instances, S, P)
    dtypes = {"input_ids": "i4", "input_mask": "i1", "segment_ids": "i1", "masked_lm_positions": "i4",
              "masked_lm_ids": "i4", "next_sentence_labels": "i1"}
    import h5py

    with h5py.File(path, "w") as f:
        for name, dtype in dtypes.items():
            if name in drop:
                continue
            data = arrays[name] if not shapes or name not in shapes else shapes[name](arrays[name])
            f.create_dataset(name, data=data, dtype=dtype, compression="gzip")
    return path


# -- a TFRecord writer of this test's own: CRC-32C, masking, protobuf wire format -------------------

def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def field(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def int64_feature(values, packed=True):
    if packed:
        return field(3, field(1, b"".join(varint(int(v)) for v in values)))
    return field(3, b"".join(varint(1 << 3 | 0) + varint(int(v)) for v in values))


def float_feature(values):
    return field(2, field(1, struct.pack("<%df" % len(values), *values)))


def example(features, order=None):
    names = order or list(features)
    return field(1, b"".join(field(1, field(1, name.encode()) + field(2, features[name])) for name in names))


def bert_example(ids, mask, segments, positions, labels, weights, nsp, packed=True, order=None):
    """A record as google-research/bert create_pretraining_data.py writes it (write_instance_to_example_files)."""
    features = {"input_ids": int64_feature(ids, packed), "input_mask": int64_feature(mask, packed),
                "segment_ids": int64_feature(segments, packed),
                "masked_lm_positions": int64_feature(positions, packed),
                "masked_lm_ids": int64_feature(labels, packed), "masked_lm_weights": float_feature(weights),
                "next_sentence_labels": int64_feature([nsp], packed)}
    return example(features, order)


def tf_records(instances, S=S, P=P, packed=True, shuffle_keys=False):
    arrays = dense(instances, S, P)
    rng = np.random.default_rng(0)
    names = ["input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights",
             "next_sentence_labels"]
    for i in range(len(instances)):
        order = list(rng.permutation(names)) if shuffle_keys else None
        yield bert_example(arrays["input_ids"][i], arrays["input_mask"][i], arrays["segment_ids"][i],
                           arrays["masked_lm_positions"][i], arrays["masked_lm_ids"][i],
                           arrays["masked_lm_weights"][i], int(arrays["next_sentence_labels"][i]), packed, order)


def write_tfrecord(path, records):
    with open(path, "wb") as f:
        for data in records:
            length = struct.pack("<Q", len(data))
            f.write(length + struct.pack("<I", masked(length)) + data + struct.pack("<I", masked(data)))
    return path


def pack_args(inputs, output, *extra):
    """`python -m ipu_packing.data pack`'s arguments for conftest.py's pack_inputs, into ``output``."""
    return ["pack", "--input", inputs["hdf5"], "--vocab", inputs["vocab"], "--output", str(output),
            "--max-sequences-per-pack", "3", "--workers", "1", "--quiet"] + list(extra)


def run_pack(tmp_path, inputs, *extra, output="out", vocab=None):
    vocab = vocab or write_vocab(str(tmp_path / "vocab.txt"))
    out = str(tmp_path / output)
    from ipu_packing.data.cli import main

    code = main(["pack", "--input", inputs, "--vocab", vocab, "--output", out, "--max-sequences-per-pack", "3",
                 "--workers", "1", "--quiet"] + list(extra))
    return code, out
