"""ipu_packing.compare on small made-up run directories, with exact expected values."""

import json
import os

import numpy as np
import pytest

from app_fixtures import write_run
from ipu_packing.compare import compare, main, read_run, smooth


@pytest.fixture
def runs(tmp_path):
    a = write_run(tmp_path, "packed", [10, 10, 10, 10], [2, 1, 1, 1], [8, 6, 4, 2])
    b = write_run(tmp_path, "padded", [10, 10, 10, 10], [4, 2, 2, 2], [8, 7, 6, 5])
    return a, b


def test_smoothing_is_a_trailing_mean():
    np.testing.assert_array_equal(smooth([1, 2, 3, 4], 2), [1.0, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(smooth([1, 2, 3, 4], 1), [1, 2, 3, 4])


def test_the_arithmetic(runs):
    c = compare(read_run(runs[0]), read_run(runs[1]), window=1, warmup=1)
    assert c.throughput_ratio == pytest.approx(2.0, abs=1e-12)  # 30 seq / 3 s against 30 seq / 6 s
    assert c.target_mlm_loss == 5.0
    assert c.time_to_target_ratio == pytest.approx(2.5, abs=1e-12)  # B reaches 5 at 10 s, A at 4 s
    assert c.loss_gap == pytest.approx(0.6, abs=1e-12)  # |2 - 5| / 5 at 40 sequences seen
    assert c.warnings == []
    assert c.a["sequences_per_step_mean"] == 10 and c.a["sequences_per_step_std"] == 0
    assert c.a["tokens_per_second"] == pytest.approx(100.0)
    assert c.b["final_mlm_loss"] == 5.0 and c.a["final_mlm_accuracy"] == pytest.approx(0.4)
    assert c.a["global_batch_sequences"] == 40


def test_never_reaching_the_target_and_unlike_batches_warn(tmp_path):
    a = write_run(tmp_path, "a", [10, 10, 10], [1, 1, 1], [9, 9, 9])
    b = write_run(tmp_path, "b", [12, 12, 12], [1, 1, 1], [9, 8, 7])
    c = compare(read_run(a), read_run(b), window=1, warmup=0)
    assert c.time_to_target_ratio is None
    assert c.throughput_ratio == pytest.approx(10 / 12)
    assert len(c.warnings) == 1 and "-16.7%" in c.warnings[0]


def test_command_json_plot_and_errors(runs, tmp_path, capsys):
    png = str(tmp_path / "plots" / "compare.png")
    assert main([runs[0], runs[1], "--json", "--window", "1", "--warmup", "1", "--plot", png]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["throughput_ratio"] == pytest.approx(2.0) and out["time_to_target_ratio"] == pytest.approx(2.5)
    assert os.path.getsize(png) > 1000
    assert main([runs[0], runs[1]]) == 0
    assert "throughput ratio" in capsys.readouterr().out
    assert main([runs[0], str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nowhere" in err and err.count("\n") == 1
