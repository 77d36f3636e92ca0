"""The checkpoint schema (train/state.py:TrainingState) and the loop's parts that are plain functions: the
checkpoint cadence and the step record."""

from __future__ import annotations

import pytest

import app_fixtures as fx
from ipu_packing.train.state import rng_state
import torch

from ipu_packing.train import UserError
from ipu_packing.train.loop import checkpoint_due
from ipu_packing.train.metrics import StepRecord
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
