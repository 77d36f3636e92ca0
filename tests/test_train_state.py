"""The checkpoint schema (train/state.py:TrainingState) and the loop's parts that are plain functions: the
checkpoint cadence and the step record. A step checkpoint is read by TrainingState.load, which checks every field
(types, generator states, dtypes, finite tensors) before anything uses it, and reads no pickle that runs code."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest

import app_fixtures as fx
from ipu_packing.train.state import rng_state
import torch

from ipu_packing.train import UserError
from ipu_packing.train.loop import checkpoint_due
from ipu_packing.train.metrics import StepRecord
from ipu_packing.train.cli import main
from ipu_packing.train.state import TrainingState

# The keys the loop has written into every step checkpoint, in this order, since rng_per_rank was added.
WRITTEN = ["step", "model", "optimizer", "scheduler", "data", "rng", "rng_per_rank", "config", "dataset", "metrics"]


def _written(step=3):
    rng = rng_state()
    return {"step": step, "model": {"w": torch.arange(4.0)}, "optimizer": {"state": {}, "param_groups": []},
            "scheduler": {"last_epoch": step}, "data": {"epoch": 1, "step_in_epoch": 2}, "rng": rng,
            "rng_per_rank": [rng, rng_state()], "config": {"name": "demo"},
            "dataset": {"max_seq_length": 32}, "metrics": {"loss": 1.5}}


def test_the_fields_are_the_keys_the_loop_writes_in_their_order():
    assert list(TrainingState(**_written()).to_dict()) == WRITTEN


def test_a_checkpoint_as_written_loads_and_is_written_back_the_same(tmp_path):
    path = str(tmp_path / "step_0000003.pt")
    torch.save(_written(), path)  # a plain dict, as every checkpoint on disk is
    state = fx.load(path)
    assert isinstance(state, TrainingState) and state.step == 3 and state.position == (1, 2)
    assert torch.equal(state.model["w"], torch.arange(4.0)) and state.rng_for(1) is state.rng_per_rank[1]
    assert state.rng_for(5) is state.rng  # more processes than were saved: the first one's
    again = fx.save(str(tmp_path / "run"), state, keep=2)
    reread = torch.load(again, weights_only=True)
    assert list(reread) == WRITTEN and reread["data"] == {"epoch": 1, "step_in_epoch": 2}


def test_a_checkpoint_without_rng_per_rank_resumes_with_its_rng():
    written = _written()
    del written["rng_per_rank"]
    state = TrainingState(**written)
    assert state.rng_for(0) is state.rng and "rng_per_rank" not in state.to_dict()


@pytest.mark.parametrize("field, value, what", [("rng_per_rank", {"a": 1}, "a list"), ("config", [1], "a mapping"),
                                                ("scheduler", 3, "a state dict"), ("step", True, "an integer")])
def test_every_field_is_checked_for_type(tmp_path, field, value, what):
    path = str(tmp_path / "step_0000003.pt")
    torch.save(dict(_written(), **{field: value}), path)
    with pytest.raises(UserError) as info:
        fx.load(path)
    assert str(info.value) == "checkpoint %s: field %r must be %s, got %s" % (path, field, what,
                                                                               type(value).__name__)


def test_a_weights_only_checkpoint_is_refused_for_resuming_in_one_line():
    state = TrainingState(step=2, model={"w": torch.ones(2)}, optimizer={"state": {}})
    with pytest.raises(UserError) as info:
        state.check_resumable("c.pt")
    assert str(info.value) == ("checkpoint c.pt has no scheduler, data, rng: a run cannot resume from it "
                               "(checkpoint.init_from takes its weights)")


def test_checkpoint_cadence():
    due = [s for s in range(1, 9) if checkpoint_due(s, 1, 3, 8)]
    assert due == [3, 6, 8]  # every 3 steps, and the last
    # host calls of 4 optimizer steps (device iterations): a checkpoint when a call crosses a multiple of 6
    assert [s for s in (4, 8, 12, 16) if checkpoint_due(s, 4, 6, 20)] == [8, 12]
    assert [s for s in range(1, 5) if checkpoint_due(s, 1, 0, 4)] == [4]  # every_steps 0: at the end only


def test_the_step_record_is_built_from_the_reduced_metrics():
    whole = {"loss": 2.0, "mlm_loss": 1.5, "nsp_loss": 0.5, "mlm_accuracy": 0.25, "nsp_accuracy": 0.75,
             "sequences": 30.0, "tokens": 900.0, "packs": 16.0, "seconds": 0.5, "compile_seconds": 3.0,
             "instances": 2}
    names = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")
    record = StepRecord.from_metrics(step=7, epoch=1, lr=1e-3, whole=whole, names=names)
    assert record == StepRecord(step=7, metrics={"loss": 2.0, "mlm_loss": 1.5, "nsp_loss": 0.5, "mlm_accuracy": 0.25,
                                                 "nsp_accuracy": 0.75},
                                lr=1e-3, sequences=30, tokens=900, packs=16, packing_factor=30 / 16.0, seconds=0.5,
                                sequences_per_second=60.0, tokens_per_second=1800.0, epoch=1, compile_seconds=3.0,
                                instances=2)
    assert record.loss == 2.0 and record.to_dict()["nsp_accuracy"] == 0.75 and "metrics" not in record.to_dict()



def test_a_non_finite_step_metric_is_null_in_metrics_jsonl(tmp_path):
    """metrics.jsonl is machine-readable output too: a step whose loss is NaN (the step a divergence stops
    at) or whose throughput is inf (a zero-second step) is written as null with a warning, never NaN."""
    from ipu_packing.train.metrics import MetricsLogger
    from ipu_packing.train.sections import LoggingConfig

    logger = MetricsLogger(str(tmp_path / "metrics.jsonl"), str(tmp_path / "tensorboard"), 1, 0,
                           LoggingConfig(progress_bar=False, tensorboard=False, jsonl=True), log=lambda line: None)
    logger.log(StepRecord(step=1, metrics={"loss": float("nan"), "mlm_loss": 1.0, "nsp_loss": 0.5, "mlm_accuracy": 0.1,
                                           "nsp_accuracy": 0.5},
                          lr=1e-3, sequences=3, tokens=30, packs=2, packing_factor=1.5, seconds=0.0,
                          sequences_per_second=float("inf"), tokens_per_second=float("inf"), epoch=0))
    logger.close()
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()

    def refuse(constant):
        raise AssertionError("not JSON: %s" % constant)

    record = json.loads(line, parse_constant=refuse)
    assert record["loss"] is None and record["sequences_per_second"] is None and record["mlm_loss"] == 1.0
    assert record["warnings"] == ["loss is NaN, not a finite number: written as null",
                                  "sequences_per_second is Infinity, not a finite number: written as null",
                                  "tokens_per_second is Infinity, not a finite number: written as null"]


# -- step checkpoints read from disk: every field checked (TrainingState.load) -------------------------------------
# field types, generator states, finite tensors; a hostile file is refused in one line naming the file and field.

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


# -- a checkpoint is read without running code: a crafted pickle is refused wherever it is named ---------------------

class _Payload:
    """Unpickling this runs code: it creates a marker file (what an attacker's checkpoint would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _crafted(path, marker):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump({"step": 1, "model": {}, "payload": _Payload(marker)}, f)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("where", ["init_from", "run_checkpoints", "resume_path"])
def test_a_crafted_pickle_runs_no_code(where, data_dir, tmp_path, capsys):
    run = str(tmp_path / "run")
    marker = str(tmp_path / "pwned")
    evil = (os.path.join(run, "checkpoints", "step_0000001.pt") if where == "run_checkpoints"
            else str(tmp_path / "evil.pt"))
    _crafted(evil, marker)
    extra = {"init_from": ["checkpoint.init_from=%s" % evil], "run_checkpoints": [],
             "resume_path": ["checkpoint.resume=%s" % evil]}[where]
    code = main(["--config", "demo"] + fx.TINY + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run,
                                                  "training.steps=2"] + extra)
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert evil in err
    assert not os.path.exists(marker)


def test_a_checkpoint_with_wrong_field_types_is_refused_naming_the_field(tmp_path):
    path = str(tmp_path / "step_0000002.pt")
    torch.save({"step": "2", "model": {}}, path)
    with pytest.raises(UserError, match="'step' must be an integer"):
        fx.load(path)
    torch.save({"step": 2, "model": {"w": [1.0]}}, path)
    with pytest.raises(UserError, match="model entry 'w' is not a tensor"):
        fx.load(path)
    torch.save({"step": 2, "model": {}, "data": {"epoch": -1, "step_in_epoch": 0}}, path)
    with pytest.raises(UserError, match="data.epoch"):
        fx.load(path)


def _flip_a_bit_of_tensor_data(path):
    """One bit flipped in the middle of the largest tensor's bytes of a torch checkpoint; returns that record."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name, extra = struct.unpack("<HH", f.read(4))
        at = info.header_offset + 30 + name + extra + info.file_size // 2
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))
    return info.filename


@pytest.mark.parametrize("use", ["resume", "init_from"])
def test_one_flipped_bit_in_a_checkpoints_tensor_data_is_refused_naming_the_file(use, tiny_run, data_dir, tmp_path,
                                                                                  capsys):
    run = str(tmp_path / "run")
    shutil.copytree(tiny_run, run)
    for name in ("summary.json", os.path.join("checkpoints", "step_0000004.pt")):  # as a kill after step 3 leaves it
        os.unlink(os.path.join(run, name))
    shutil.rmtree(os.path.join(run, "final"))
    damaged = os.path.join(run, "checkpoints", "step_0000002.pt")
    record = _flip_a_bit_of_tensor_data(damaged)
    TrainingState.from_dict(torch.load(damaged, weights_only=True), damaged)  # torch alone reads it without a word
    target = run if use == "resume" else str(tmp_path / "phase2")
    extra = [] if use == "resume" else ["checkpoint.init_from=%s" % damaged]
    before = fx.snapshot(str(tmp_path))
    code = main(fx.tiny_run_args(data_dir, target, *extra))
    err = capsys.readouterr()[1]
    assert code == 2 and err == ("error: checkpoint %s fails its checksum at record %s (Bad CRC-32 for file %r): the "
                                 "file is damaged; resume from another checkpoint or restore it\n"
                                 % (damaged, record, record)), err
    assert fx.snapshot(str(tmp_path)) == before
