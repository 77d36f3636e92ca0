"""Benchmark of `pack` (a command, not a test): how fast are existing datasets packed, in how much memory?

    python -m ipu_packing.bench.pack_existing --instances 1000000 [--format hdf5|tfrecord] [--files 1]
        [--max-seq-length 128] [--max-sequences-per-pack 3] [--workers 0] [--no-padded]

Writes a synthetic dataset of N instances in the chosen format, laid out as its producer writes it
(HDF5: NVIDIA's keys, types and gzip compression; TFRecord: google-research/bert's tf.train.Example
records), with a 30,522-token vocabulary (bert-base-uncased's size), then runs
`python -m ipu_packing.data pack` on it in a child process and prints: wall seconds, instances/s,
the peak RSS of the largest process (getrusage of the waited-for descendants: the command and its
workers; also the peaks of the parent and of the largest worker apart, VmHWM sampled every 50 ms)
and the output's size. Writing the input is not timed.

Lengths: 40% of the sequences fill S, the rest are uniform in [8, S) (roughly the share of full
sequences that create_pretraining_data.py makes at S = 128). The instances are data/random_instances.py's
(a random A/B split, the recipe's count of predictions, round(15% of the length), capped at
P = round(0.15 S) + 1, NSP labels 0/1).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Dict, Iterator, List, Optional

import numpy as np

from ..data.format import SPECIAL_TOKENS
from ..data.random_instances import draw_instances
from .prepare_scale import data_bench_parser, du, run_measured, scratch
from .. import jsonin, jsonout
from ..data.write.datasets import PackingOptions
from ..errors import run_command

VOCAB_SIZE = 30522
CHUNK = 1 << 15


def write_vocab(path: str, size: int = VOCAB_SIZE) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(list(SPECIAL_TOKENS) + ["w%d" % i for i in range(size - len(SPECIAL_TOKENS))]) + "\n")
    return path


def synthetic_chunks(n: int, s: int, p: int, seed: int = 0) -> Iterator[Dict[str, np.ndarray]]:
    """Dense [rows, S] / [rows, P] arrays of n instances, CHUNK rows at a time (see the module notes), in the
    producers' field names; the instances are data/random_instances.py's, P its cap."""
    rng = np.random.default_rng(seed)
    for start in range(0, n, CHUNK):
        r = min(CHUNK, n - start)
        lengths = np.where(rng.random(r) < 0.4, s, rng.integers(8, s, r))
        drawn = draw_instances(rng, lengths, VOCAB_SIZE, max_predictions_per_seq=p, width=s)
        yield {"input_ids": drawn.input_ids.astype(np.int32),
               "input_mask": (np.arange(s)[None, :] < lengths[:, None]).astype(np.int8),
               "segment_ids": drawn.token_type_ids.astype(np.int8),
               "masked_lm_positions": drawn.mlm_positions.astype(np.int32),
               "masked_lm_ids": drawn.mlm_labels.astype(np.int32),
               "masked_lm_weights": (np.arange(p)[None, :] < drawn.mlm_counts[:, None]).astype(np.float32),
               "next_sentence_labels": drawn.nsp_labels.astype(np.int8)}


def write_hdf5(path: str, n: int, s: int, p: int, seed: int) -> None:
    """As NVIDIA's create_pretraining_data.py: int32 ids and positions, int8 masks, segments and NSP
    labels, gzip (level 4, its default)."""
    import h5py

    dtypes = {"input_ids": "i4", "input_mask": "i1", "segment_ids": "i1", "masked_lm_positions": "i4",
              "masked_lm_ids": "i4", "next_sentence_labels": "i1"}
    with h5py.File(path, "w") as f:
        data = {name: f.create_dataset(name, shape=(n, s) if name in ("input_ids", "input_mask", "segment_ids")
                                       else (n,) if name == "next_sentence_labels" else (n, p),
                                       dtype=dtype, compression="gzip", chunks=True)
                for name, dtype in dtypes.items()}
        at = 0
        for chunk in synthetic_chunks(n, s, p, seed):
            r = len(chunk["next_sentence_labels"])
            for name in dtypes:
                data[name][at:at + r] = chunk[name]
            at += r


def _varints(values: np.ndarray) -> List[bytes]:
    """Each row of non-negative values < 2**21 as its packed varints (vectorised)."""
    v = values.astype(np.int64)
    b0 = (v & 0x7F) | np.where(v >= 1 << 7, 0x80, 0)
    b1 = ((v >> 7) & 0x7F) | np.where(v >= 1 << 14, 0x80, 0)
    b2 = (v >> 14) & 0x7F
    size = 1 + (v >= 1 << 7) + (v >= 1 << 14)
    stacked = np.stack([b0, b1, b2], axis=-1).astype(np.uint8)  # (rows, width, 3)
    keep = np.arange(3)[None, None, :] < size[..., None]
    lengths = keep.reshape(len(v), -1).sum(axis=1)
    flat = stacked[keep]
    ends = np.cumsum(lengths)
    data = flat.tobytes()
    return [data[e - n:e] for e, n in zip(ends.tolist(), lengths.tolist())]


def write_tfrecord(path: str, n: int, s: int, p: int, seed: int) -> None:
    """As google-research/bert's create_pretraining_data.py: one tf.train.Example per instance."""
    from ..data.existing.tfexample import length_delimited
    from ..data.existing.tfrecord import write_records

    names = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
             "masked_lm_weights", "next_sentence_labels")

    def records():
        for chunk in synthetic_chunks(n, s, p, seed):
            packed = {name: _varints(chunk[name].reshape(len(chunk[name]), -1)) for name in names
                      if name != "masked_lm_weights"}
            weights = chunk["masked_lm_weights"]
            for i in range(len(weights)):
                entries = []
                for name in names:
                    if name == "masked_lm_weights":
                        feature = length_delimited(2, length_delimited(1, weights[i].astype("<f4").tobytes()))
                    else:
                        feature = length_delimited(3, length_delimited(1, packed[name][i]))
                    entries.append(length_delimited(1, length_delimited(1, name.encode())
                                                     + length_delimited(2, feature)))
                yield length_delimited(1, b"".join(entries))

    write_records(path, records())


def run_pack(inputs: str, vocab: str, output: str, extra: List[str]) -> Dict[str, object]:
    return run_measured([sys.executable, "-m", "ipu_packing.data", "pack", "--input", inputs, "--vocab", vocab,
                         "--output", output, "--quiet"] + extra, what="pack")


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(_main, argv)


def _main(argv: Optional[List[str]] = None) -> int:
    parser = data_bench_parser("python -m ipu_packing.bench.pack_existing", __doc__)
    parser.add_argument("--instances", type=int, required=True)
    parser.add_argument("--format", choices=("hdf5", "tfrecord"), default="hdf5")
    parser.add_argument("--files", type=int, default=1, help="input files (the instances split evenly)")
    parser.add_argument("--max-sequences-per-pack", type=int, default=3)
    args = parser.parse_args(argv)
    if args.instances < args.files or args.files < 1:
        parser.error("--instances must be >= --files >= 1")
    s = args.max_seq_length
    p = int(round(0.15 * s)) + 1
    with scratch(args.workdir, "pack-bench-", args.keep) as work:
        vocab = write_vocab(os.path.join(work, "vocab.txt"))
        inputs = os.path.join(work, "input")
        os.makedirs(inputs)
        started = time.perf_counter()
        bounds = np.linspace(0, args.instances, args.files + 1).astype(int)
        for i in range(args.files):
            name = "part_%05d.%s" % (i, "hdf5" if args.format == "hdf5" else "tfrecord")
            writer = write_hdf5 if args.format == "hdf5" else write_tfrecord
            writer(os.path.join(inputs, name), int(bounds[i + 1] - bounds[i]), s, p, seed=i)
        written = time.perf_counter() - started
        output = os.path.join(work, "out")
        extra = ["--max-sequences-per-pack", str(args.max_sequences_per_pack), "--workers", str(args.workers),
                 "--format", args.format] + (["--no-padded"] if args.no_padded else [])
        result = run_pack(inputs, vocab, output, extra)
        manifest = jsonin.load_path(os.path.join(output, "packed", "manifest.json"))
        result.update(instances=manifest["num_sequences"], packs=manifest["num_packs"],
                      packing_factor=manifest["packing_factor"], mlm_slots=manifest["mlm_slots"],
                      input_mib=du(inputs) / 2.0 ** 20, output_mib=du(output) / 2.0 ** 20,
                      write_input_s=written, format=args.format, files=args.files, max_seq_length=s,
                      workers=PackingOptions(workers=args.workers).num_workers)
        result["instances_per_s"] = result["instances"] / result["wall_s"]
        if args.json:
            print(jsonout.dumps(result, sort_keys=True))
        else:
            print("%s, %d files, %.0f MiB: %d instances at S=%d -> %d packs (factor %.3f, M=%d), output %.0f MiB"
                  % (args.format, args.files, result["input_mib"], result["instances"], s, result["packs"],
                     result["packing_factor"], result["mlm_slots"], result["output_mib"]))
            print("pack with %d workers: wall %.1f s, CPU %.1f s, %.0f instances/s, peak RSS of the largest "
                  "process %.0f MiB (sampled: parent %.0f MiB, largest worker %.0f MiB)"
                  % (result["workers"], result["wall_s"], result["cpu_s"], result["instances_per_s"],
                     result["peak_rss_mib"], result["parent_peak_rss_mib"], result["worker_peak_rss_mib"]))
            print(result["stdout"].splitlines()[-1] if result["stdout"] else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
