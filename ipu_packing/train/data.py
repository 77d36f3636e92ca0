"""The training side of the data: open a prepared dataset, check it against the config, order it.

Every check here runs before the run writes anything, and a failure is a one-line `UserError`
naming the dataset and the field.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from ..errors import DataError
from ..data.format import MANIFEST, read_manifest
from ..data.vocab import read_vocab, vocab_content_sha256
from ..errors import one_line
from ..errors import UserError

PREPARE_HINT = ("python -m ipu_packing.data prepare --input default --output DIR --max-seq-length S "
                "--max-sequences-per-pack K")


@dataclass
class TrainingData:
    dataset: Any
    """torch Dataset of packs (dicts of the 8 pack fields)."""
    path: str
    manifest: Dict[str, Any]
    """The dataset's manifest.json, read and checked once (format.read_manifest)."""
    max_seq_length: int
    max_sequences_per_pack: int
    num_packs: int
    num_sequences: int
    num_tokens: int
    vocab_size: int
    vocab_path: Optional[str]
    vocab_sha256: Optional[str]
    """The vocabulary's content digest (data/vocab.py vocab_content_sha256: its tokens, whatever line ends or BOM
    the file has; for a vocab.txt prepare wrote, its file's sha256)."""
    pad_token_id: Optional[int] = None
    """The dataset's [PAD] id (its manifest's special_token_ids): padding, which model.pad_token_id must name."""

    @property
    def packing_factor(self) -> float:
        """Measured sequences per pack over the whole dataset."""
        return self.num_sequences / float(self.num_packs)

    def describe(self) -> str:
        return "dataset %s: %d packs, %d sequences, %d real tokens, S=%d, K=%d, packing factor %.4f, padding %.2f%%" % (
            self.path,
            self.num_packs,
            self.num_sequences,
            self.num_tokens,
            self.max_seq_length,
            self.max_sequences_per_pack,
            self.packing_factor,
            100.0 * (1.0 - self.num_tokens / float(self.num_packs * self.max_seq_length)),
        )

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """The pack order of `epoch`: a permutation that depends only on (seed, epoch)."""
        rng = np.random.default_rng([int(seed), int(epoch)])
        return rng.permutation(len(self.dataset))

    @property
    def shard_paths(self) -> List[str]:
        """Every shard file the manifest names, in order."""
        return [os.path.join(self.path, str(s["file"])) for s in self.manifest["shards"]]

    def fingerprint(self) -> dict:
        return {
            "path": os.path.abspath(self.path),
            "max_seq_length": self.max_seq_length,
            "max_sequences_per_pack": self.max_sequences_per_pack,
            "num_packs": self.num_packs,
            "vocab_size": self.vocab_size,
            "vocab_sha256": self.vocab_sha256,
        }


def prepare_hint(config) -> str:
    """The `prepare` command that makes the data ``config`` trains on: pretraining's (PREPARE_HINT), or a fine-tuning
    task's (`prepare --task NAME` with the config's data directory, S and K, the tokenizer of checkpoint.init_from
    where it names one)."""
    from .. import tasks

    task = tasks.get(config.task.name)
    if not task.fine_tuning:
        return PREPARE_HINT
    tokenizer = config.checkpoint.init_from or "MODEL_DIR"
    return ("python -m ipu_packing.data prepare --task %s --train FILE --validation FILE --tokenizer %s --output %s "
            "--max-seq-length %d%s --max-sequences-per-pack %d"
            % (task.name, tokenizer, config.data.dir, config.data.max_seq_length,
               task.hook("hint_options")(config.data.max_seq_length) if task.has_hook("hint_options") else "",
               config.data.max_sequences_per_pack))


def read_training_data(path: str, config=None) -> TrainingData:
    """Read DIR/manifest.json through the data package's one reader (format.read_manifest: every key and
    type checked; cheap, no shard is touched). `open_shards` then opens the data. ``config``: the run's, whose
    `prepare` command (prepare_hint) a missing dataset's refusal names (None: pretraining's)."""
    if not os.path.isfile(os.path.join(path, MANIFEST)):
        hint = PREPARE_HINT if config is None else prepare_hint(config)
        raise UserError("dataset not found: %s has no manifest.json (prepare it with: %s)" % (path, hint))
    try:
        manifest = read_manifest(path)
    except DataError as error:
        raise UserError("dataset is corrupt: %s" % (error,))
    fields = {key: manifest[key] for key in ("max_seq_length", "max_sequences_per_pack", "num_packs", "num_sequences",
                                            "num_tokens", "vocab_size")}
    if fields["num_packs"] < 1 or fields["num_sequences"] < fields["num_packs"]:
        raise UserError("dataset is corrupt: %s says num_packs=%d, num_sequences=%d"
                        % (os.path.join(path, MANIFEST), fields["num_packs"], fields["num_sequences"]))
    vocab_path = os.path.join(path, manifest["vocab_file"])
    vocab_path = vocab_path if os.path.isfile(vocab_path) else None
    return TrainingData(
        dataset=None,
        path=path,
        manifest=manifest,
        vocab_path=vocab_path,
        vocab_sha256=vocab_content_sha256(read_vocab(vocab_path)) if vocab_path else None,
        pad_token_id=manifest["special_token_ids"]["[PAD]"],
        **fields
    )


def open_run_data(config, path: Optional[str] = None, open_dataset=None, opened: bool = True):
    """(TrainingData, Task): the one way a run, compile-only and the benches read a config's dataset (``path``:
    another split than data.split): DIR/manifest.json read and checked once (read_training_data, naming the
    `prepare` command a missing dataset is made with), matched against the config (S, K, vocabulary:
    check_data_matches), the config's task on it (train/task.py task_for: a dataset of another task refused),
    and with ``opened`` its shards opened and validated (open_shards; planning opens them last, after the
    cheaper checks)."""
    data = read_training_data(path or config.data.path, config)
    task = match_run_data(config, data)
    if opened:
        open_shards(data, open_dataset)
    return data, task


def match_run_data(config, data: TrainingData):
    """The config's task on a dataset read (read_training_data), the dataset matched against the config first
    (S, K, vocabulary): open_run_data's checks, for a caller that checks something between reading and matching
    (planning: that checkpoint.init_from exists, before a vocabulary it would give is compared)."""
    from .task import task_for

    check_data_matches(config, data)
    return task_for(config, data.manifest)


def open_shards(data: TrainingData, open_dataset=None) -> TrainingData:
    """Open the dataset through ipu_packing.data.open_dataset (or ``open_dataset``, called as it is: the path, and
    the manifest already read), which validates shards and checksums."""
    if open_dataset is None:
        from ..data import open_dataset
    try:
        dataset = open_dataset(data.path, manifest=data.manifest)  # stored order; the loop orders packs itself
    except UserError:
        raise
    except Exception as exc:  # DataError, and anything a corrupt file raises while loading
        from ..errors import describe_dependency_fault

        if (describe_dependency_fault(exc) or "").startswith("out of memory"):
            raise  # the machine, not the data: the command wrapper says so in one line
        message = one_line(exc) or type(exc).__name__
        if data.path not in message:
            message = "%s: %s" % (data.path, message)
        raise UserError("dataset is corrupt: %s" % (message,))
    if len(dataset) != data.num_packs:
        raise UserError(
            "dataset is corrupt: %s has %d packs, its manifest says num_packs=%d"
            % (data.path, len(dataset), data.num_packs)
        )
    data.dataset = dataset
    return data


def embeddings_from_model(config) -> bool:
    """Whether the model's vocab_size is a model directory's (checkpoint.init_from's config.json, taken as it is):
    its embeddings may hold more rows than its tokenizer, and so the dataset, has tokens (a model whose embeddings
    were padded); the rows past the vocabulary are never used."""
    from ..model.pretrained import is_hf_dir

    source = config.checkpoint.init_from
    return bool(source) and config.architecture_taken and "model.vocab_size" not in config.checkpoint.init_override \
        and is_hf_dir(source)


def check_data_matches(config, data: TrainingData) -> None:
    """The dataset must have been built for this model: same S, K, vocabulary size."""
    if data.max_seq_length != config.data.max_seq_length:
        raise UserError(
            "dataset %s was built with max_seq_length %d, but the config's data.max_seq_length is %d"
            % (data.path, data.max_seq_length, config.data.max_seq_length)
        )
    if data.max_seq_length > config.model_value("max_position_embeddings"):
        raise UserError(
            "dataset %s has max_seq_length %d, more than model.max_position_embeddings %d"
            % (data.path, data.max_seq_length, config.model_value("max_position_embeddings"))
        )
    if data.max_sequences_per_pack != config.data.expected_sequences_per_pack:
        raise UserError(
            "dataset %s has max_sequences_per_pack %d, but data.layout=%s expects %d"
            % (data.path, data.max_sequences_per_pack, config.data.layout, config.data.expected_sequences_per_pack)
        )
    model_vocab = config.model_value("vocab_size")
    if data.vocab_size != model_vocab and not (data.vocab_size < model_vocab and embeddings_from_model(config)):
        raise UserError(
            "dataset %s was built with a vocabulary of %d tokens, but model.vocab_size is %d (another vocabulary)"
            % (data.path, data.vocab_size, model_vocab)
        )
    # The embedding of model.pad_token_id gets no gradient (padding_idx): it must be the id the packs pad with,
    # or a real token (set to [MASK]'s id: every masked position) would never learn.
    model_pad = config.model_value("pad_token_id")
    if data.pad_token_id is not None and model_pad != data.pad_token_id:
        raise UserError(
            "dataset %s pads with [PAD] id %d, but model.pad_token_id is %d (that token's embedding would get no "
            "gradient): set model.pad_token_id: %d" % (data.path, data.pad_token_id, model_pad, data.pad_token_id)
        )
    # Every pack holds segment A (token type 0) and segment B (token type 1): the format's recipe
    # (data/format.py), so a model needs two token-type embeddings or its first step indexes out of range.
    token_types = config.model_value("type_vocab_size")
    if token_types < DATA_TOKEN_TYPES:
        raise UserError(
            "dataset %s uses token types 0 and 1 (segments A and B), but model.type_vocab_size is %d"
            % (data.path, token_types)
        )


DATA_TOKEN_TYPES = 2


def write_tokenizer_files(directory: str, data: TrainingData, positions: int, vocab_size: int,
                          fewer_allowed: bool = False) -> None:
    """Beside an export's config.json: the dataset's vocab.txt, tokenizer_config.json and special_tokens_map.json
    (data/vocab.py write_export_tokenizer: the casing and accents the dataset was made with, model_max_length =
    ``positions``), so that transformers' AutoTokenizer gives the ids `prepare` gave. The copied vocab.txt must
    still be the dataset's by content (a vocabulary changed while the run trained would map the ids to other
    words) and hold the model's ``vocab_size`` tokens (``fewer_allowed``: at most that many, embeddings_from_model):
    refused in one line otherwise."""
    from ipu_packing.data.vocab import check_vocab_size, write_export_tokenizer

    if data.vocab_path is None:
        return
    target = os.path.join(directory, "vocab.txt")
    shutil.copyfile(data.vocab_path, target)
    check_vocab_size(target, vocab_size, "the exported model", fewer_allowed)
    write_export_tokenizer(directory, data.manifest, positions)


