"""What the benches read and write before anything is timed: model sizes, length histograms (a file, or a
prepared dataset's manifest), a prepared split's first-epoch packs, the shared data directory, the options each
mode takes, the attentions to time, and the check that an output path can take a file. It imports no torch, so
that every bench command starts without it."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..errors import UserError


class BenchError(UserError):
    """Bad input: printed as one line, exit status 2."""


MODEL_PRESETS: Dict[str, Dict[str, int]] = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, vocab_size=8192),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                  vocab_size=30522),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 vocab_size=30522),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                  vocab_size=30522),
}
"""The model sizes ``--model`` takes in every mode that builds its own model (training configs give their own):
transformers.BertConfig overrides, ``BertConfig(**MODEL_PRESETS["small"], max_position_embeddings=512)``."""


SOURCE = ("histogram", "data", "max_seq_length", "max_sequences_per_pack", "timed_packs", "micro_batch_size",
          "repeats", "order", "model", "algorithm", "threads", "seed", "json", "device", "precision")
MODES = {
    "the synthetic mode": SOURCE + ("attention", "task", "plot"),
    "--peers": SOURCE + ("peers",),
    "--config": ("config", "histogram", "plot", "json", "steps", "overrides", "attention", "order"),
    "--classifier": ("classifier", "input", "inputs", "train", "table", "max_seq_length", "max_sequences_per_pack",
                     "micro_batch_size", "repeats", "order", "model", "threads", "seed", "json"),
}
"""The options (argparse dests) each mode of the bench takes; any other option given is refused, naming the modes
that take it. --config takes the rest from the config (section.key=value)."""


def refuse_other_modes_options(parser, args, mode: str) -> None:
    """One line for the first option given (not at its default) that ``mode`` does not take."""
    for action in parser._actions:
        if action.dest in MODES[mode] or action.dest == "help" or getattr(args, action.dest) in (action.default, []):
            continue
        owners = [name for name, options in MODES.items() if action.dest in options]
        raise BenchError("%s is an option of %s, not of %s%s" % (
            "/".join(action.option_strings) or "section.key=value (%s)" % args.overrides[0],
            ", ".join(owners[:-1]) + " and " + owners[-1] if len(owners) > 1 else owners[0], mode,
            ": set the value in the config (section.key=value)" if mode == "--config" else ""))


def attention_list(args) -> List[Optional[str]]:
    """``--attention A,B,...`` as a list of distinct implementations ([None]: not given, the default)."""
    if args.attention is None:
        return [None]
    attentions = [a.strip() for a in args.attention.split(",")]
    if any(not a for a in attentions) or len(set(attentions)) != len(attentions):
        raise BenchError("--attention takes distinct implementations separated by commas, got %r" % (args.attention,))
    return attentions


def first_epoch_packs(config, data, packed_rows: int, padded_rows: int, count, what: str) -> List[Any]:
    """The records of ``data`` (TrainingData) in the order of the run's first epoch (epoch_order, as the training
    loop orders them), until there are ``packed_rows`` packs and ``padded_rows`` of ``what`` (``count`` of each
    record's, summed)."""
    records, counted = [], 0
    for index in data.epoch_order(config.training.seed, 0):
        if len(records) >= packed_rows and counted >= padded_rows:
            break
        records.append(data.dataset[int(index)])
        counted += count(records[-1])
    if len(records) < packed_rows or counted < padded_rows:
        raise BenchError(
            "dataset %s has %d packs (%d %s): fewer than the %d packs and %d %s of a warm-up call and --steps of "
            "both layouts; lower --steps" % (data.path, data.num_packs, data.num_sequences, what, packed_rows,
                                             padded_rows, what))
    return records


def shared_dir() -> str:
    """IPU_PACKING_SHARED, else <repo>/../shared (where the checkout's CI and developers have it)."""
    env = os.environ.get("IPU_PACKING_SHARED")
    if env:
        return env
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidate = os.path.join(os.path.dirname(repo), "shared")
    return candidate


def read_histogram_file(path: str, max_seq_length: Optional[int]) -> np.ndarray:
    """(S,) counts from a histogram file (packing.io.load_histogram's formats), S = --max-seq-length,
    else the file's max_sequence_length, else its number of bins."""
    from ..packing.io import load_histogram

    try:
        counts, declared = load_histogram(path)
    except ValueError as exc:
        raise BenchError(str(exc).splitlines()[0])
    hist = np.asarray(counts, dtype=np.float64).ravel()
    if not len(hist) or (hist < 0).any():
        raise BenchError("histogram file %s: must be a list of counts (bin i = length i+1)" % (path,))
    S = max_seq_length or declared or len(hist)
    if hist[S:].sum() > 0:
        raise BenchError("histogram file %s has sequences longer than --max-seq-length %d" % (path, S))
    out = np.zeros(S, dtype=np.float64)
    out[: min(S, len(hist))] = hist[:S]
    return out


def read_dataset_histogram(directory: str) -> np.ndarray:
    """The sequence_length_histogram of prepared data (prepare's --output DIR, or one dataset directory)."""
    from ..errors import DataError
    from ..data.format import MANIFEST, read_manifest

    for candidate in (os.path.join(directory, "padded"), os.path.join(directory, "packed"), directory):
        if os.path.isfile(os.path.join(candidate, MANIFEST)):
            try:
                return np.asarray(read_manifest(candidate)["sequence_length_histogram"], dtype=np.float64)
            except DataError as exc:
                raise BenchError(str(exc))
    raise BenchError("no prepared dataset at %s (no manifest.json in it, or in its packed/ or padded/)" % (directory,))



def check_writable(path: str, option: str = "--plot", reading: Sequence[str] = ()) -> None:
    """Refuse, before a long run, an output file the program must not replace (fsutil.check_output, the rule of every
    output: a symlink, a FIFO, a device, a directory, a file the command reads in ``reading``), and one whose
    directory cannot take a file (missing parent that cannot be made, a file in the way, a read-only file system):
    by trying, since root passes os.access."""
    import tempfile

    from ..fsutil import check_output

    check_output(path, option, reading=reading, error=BenchError)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise BenchError("cannot write %s: %s" % (path, exc.strerror or exc))
