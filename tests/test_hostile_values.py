"""Every value read from a file is checked before it is used. The mechanisms:

- manifests: data/format.py `read_manifest` (`_check_manifest_values`): sizes within data/limits.py's, ids inside
  the vocabulary, counts that agree with each other, finite ratios;
- shards: data/shards.py `validate_shards` (`check_packs`, `compare_counts`), run when a dataset is opened: every
  field's values in range, vectorised, and the packs' counts against the manifest's;
- the dataset against the model: train/data.py `check_data_matches` (model.pad_token_id is the dataset's [PAD]);
- step checkpoints: train/state.py `TrainingState.load` (field types, generator states, finite tensors);
- Hugging Face directories: model/pretrained.py `check_config_values` (config.json).

Each hostile row keeps the checksums consistent (the shard's sha256 rewritten), so only the value check can
catch it; each must be refused in one line naming the file and the field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.errors import UserError
from ipu_packing.fsutil import sha256_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S, K, V = 32, 3, 64


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return fx.write_prepared(str(tmp_path_factory.mktemp("values")), S=S, K=K, V=V, num_sequences=96)


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
    """The issue's case: +4000 sequences (of length 1), the length histogram and num_tokens kept in step."""
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
    ("issue-plus-4000-sequences", edit_manifest(_more_sequences), "num_sequences"),
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
def test_a_hostile_dataset_is_refused_when_opened(name, make, words, clean, tmp_path):
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(clean, "packed"), directory)
    make(directory)
    with pytest.raises(UserError) as info:
        open_dataset(directory)
    message = str(info.value)
    assert words in message, message
    assert "\n" not in message and directory in message, message


def test_the_clean_dataset_opens_and_inspect_says_one_line_for_a_hostile_one(clean, tmp_path):
    assert len(open_dataset(os.path.join(clean, "packed"))) == _manifest(os.path.join(clean, "packed"))["num_packs"]
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(clean, "packed"), directory)
    edit_shard("position_ids", S + 2, pack=1, slot=4)(directory)
    done = subprocess.run([sys.executable, "-m", "ipu_packing.data", "inspect", directory], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'position_ids' pack 1 slot 4 is 34" in lines[0], done.stderr


# -- model.pad_token_id against the dataset's [PAD] ----------------------------------------------------

def _config(pad):
    model = {"vocab_size": V, "max_position_embeddings": 512, "type_vocab_size": 2, "pad_token_id": pad}
    return SimpleNamespace(data=SimpleNamespace(max_seq_length=S, expected_sequences_per_pack=K, layout="packed"),
                           model=model, model_value=model.__getitem__)


@pytest.mark.parametrize("pad", [4, 1, V - 1], ids=["mask-id", "unk-id", "last-id"])
def test_a_pad_token_id_that_is_not_the_datasets_is_refused(pad, clean):
    from ipu_packing.train.data import check_data_matches, read_training_data

    data = read_training_data(os.path.join(clean, "packed"))
    with pytest.raises(UserError, match=r"\[PAD\] id 0, but model.pad_token_id is %d" % pad):
        check_data_matches(_config(pad), data)
    check_data_matches(_config(0), data)  # the dataset's own: accepted


# -- step checkpoints --------------------------------------------------------------------------------

def _state(**changes):
    from ipu_packing.train.state import rng_state

    state = {"step": 3, "model": {"w": torch.zeros(2, 2)}, "optimizer": {"state": {}, "param_groups": []},
             "scheduler": {}, "data": {"epoch": 0, "step_in_epoch": 3}, "rng": rng_state()}
    for key, value in changes.items():
        if callable(value):
            value(state)
        else:
            state[key] = value
    return state


def _rng(part, value):
    def change(state):
        state["rng"][part] = value
    return change


CHECKPOINT_ROWS = [
    ("rng-empty", _state(rng={}), "field rng lacks python, numpy, torch"),
    ("rng-list", _state(rng=[1, 2]), "field 'rng' must be a mapping"),
    ("rng-python-short", _state(rng=_rng("python", [3, [0] * 10, None])), "field rng python"),
    ("rng-python-version", _state(rng=_rng("python", [2, [0] * 625, None])), "field rng python"),
    ("rng-numpy-name", _state(rng=_rng("numpy", ["PCG64", [0] * 624, 0, 0, 0.0])), "field rng numpy"),
    ("rng-numpy-position", _state(rng=_rng("numpy", ["MT19937", [0] * 624, 999, 0, 0.0])), "field rng numpy"),
    ("rng-numpy-word-negative", _state(rng=_rng("numpy", ["MT19937", [-1] * 624, 0, 0, 0.0])), "field rng numpy"),
    ("rng-torch-float", _state(rng=_rng("torch", torch.zeros(5056))), "field rng torch"),
    ("rng-torch-short", _state(rng=_rng("torch", torch.zeros(10, dtype=torch.uint8))), "field rng torch"),
    ("rng-per-rank-dict", _state(rng_per_rank={"0": 1}), "rng_per_rank"),
    ("rng-per-rank-empty-entry", _state(rng_per_rank=[{}]), "rng_per_rank[0]"),
    ("model-nan", _state(model={"w": torch.tensor([1.0, float("nan")])}), "inf or NaN"),
    ("optimizer-inf", _state(optimizer={"state": {0: {"exp_avg": torch.tensor([float("inf")])}}, "param_groups": []}),
     "inf or NaN"),
    ("model-complex", _state(model={"w": torch.zeros(2, dtype=torch.complex64)}), "dtype"),
    ("config-list", _state(config=[1]), "field 'config' must be a mapping"),
    ("dataset-string", _state(dataset="x"), "field 'dataset' must be a mapping"),
]


@pytest.mark.parametrize("name, state, words", CHECKPOINT_ROWS, ids=[r[0] for r in CHECKPOINT_ROWS])
def test_a_hostile_checkpoint_is_one_line(name, state, words, tmp_path):
    from ipu_packing.train.state import TrainingState

    path = str(tmp_path / "step_0000003.pt")
    torch.save(state, path)
    with pytest.raises(UserError) as info:
        TrainingState.load(path)
    message = str(info.value)
    assert words in message and path in message and "\n" not in message, message


def test_a_clean_checkpoint_loads_and_restores(tmp_path):
    from ipu_packing.train.state import TrainingState, set_rng_state

    path = str(tmp_path / "step_0000003.pt")
    torch.save(_state(), path)
    set_rng_state(TrainingState.load(path).rng)


# -- Hugging Face config.json --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf") / "clean"
    config = transformers.BertConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=64)
    transformers.BertForPreTraining(config).save_pretrained(str(root))
    return str(root)


CONFIG_ROWS = [
    ("vocab-zero", {"vocab_size": 0}, "vocab_size"),
    ("vocab-string", {"vocab_size": "64"}, "vocab_size"),
    ("vocab-absurd", {"vocab_size": 10 ** 12}, "vocab_size"),
    ("heads-not-dividing", {"num_attention_heads": 3}, "multiple"),
    ("layers-negative", {"num_hidden_layers": -1}, "num_hidden_layers"),
    ("eps-nan", {"layer_norm_eps": float("nan")}, "layer_norm_eps"),
    ("eps-negative", {"layer_norm_eps": -1e-12}, "layer_norm_eps"),
    ("dropout-over-one", {"hidden_dropout_prob": 1.5}, "hidden_dropout_prob"),
    ("attention-dropout-inf", {"attention_probs_dropout_prob": float("inf")}, "attention_probs_dropout_prob"),
    ("pad-outside-vocab", {"pad_token_id": V}, "pad_token_id"),
    ("type-vocab-bool", {"type_vocab_size": True}, "type_vocab_size"),
    ("hidden-act-number", {"hidden_act": 3}, "hidden_act"),
    ("weights-absurd", {"hidden_size": 1 << 18, "num_attention_heads": 2, "intermediate_size": 1 << 18,
                        "num_hidden_layers": 64}, "weights"),
]


@pytest.mark.parametrize("name, change, words", CONFIG_ROWS, ids=[r[0] for r in CONFIG_ROWS])
def test_a_hostile_config_json_is_refused_before_the_model_is_built(name, change, words, hf_dir, tmp_path):
    from ipu_packing.errors import InputError
    from ipu_packing.model import PackedBertForPreTraining

    directory = str(tmp_path / "hf")
    shutil.copytree(hf_dir, directory)
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(change)
    with open(path, "w") as f:
        f.write(json.dumps(config))
    with pytest.raises(InputError) as info:
        PackedBertForPreTraining.from_pretrained(directory)
    message = str(info.value)
    assert words in message and path in message and "\n" not in message, message


def test_the_clean_config_json_loads(hf_dir):
    from ipu_packing.model import PackedBertForPreTraining

    assert PackedBertForPreTraining.from_pretrained(hf_dir).config.vocab_size == V
