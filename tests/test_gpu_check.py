"""make gpu-check (ipu_packing/bench/gpu_check.py): its CPU mode runs every step of the CUDA mode at tiny sizes
(three attentions trained, a run SIGKILLed after its first checkpoint and resumed, the peers bench), so the
script cannot rot before a GPU is lent; its bitwise comparison sees a one-ulp difference; bad input is one line."""

import contextlib
import io
import json
import math
import os

import pytest
import torch

from ipu_packing.bench import gpu_check, run_compare

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = gpu_check.main(args)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_cpu_mode_records_every_check(default_data_128, tmp_path):
    output = tmp_path / "gpu_check"
    threads = torch.get_num_threads()
    code, out, err = run_main(["--cpu", "--output", str(output), "--data", os.path.dirname(default_data_128)])
    assert code == 0, out + err
    report = json.loads((output / "gpu_check.json").read_text())
    assert report["mode"] == "cpu" and report["passed"] and report["failures"] == []
    assert report["data"]["max_seq_length"] == 128

    # every attention trained its 4 steps to finite losses, each in its own run directory
    assert [r["attention"] for r in report["training"]] == ["dense", "sdpa", "varlen"]
    for r in report["training"]:
        assert r["returncode"] == 0 and r["steps"] == 4
        assert [row[0] for row in r["losses"]] == [1, 2, 3, 4]
        assert all(math.isfinite(x) for row in r["losses"] for x in row[1:])
        assert "execution.precision=bf16" in r["command"]
        assert "model.packed_attention=%s" % r["attention"] in r["command"]
        assert r["run_dir"] == str(output / "runs" / r["attention"])
        assert r["checkpoints"] == ["step_0000002.pt", "step_0000004.pt"]

    # with deterministic kernels: an uninterrupted run, then one killed by SIGKILL with the step-2 checkpoint on
    # disk and step 3 logged, resumed, then bitwise the same
    resume = report["resume"]
    reference = resume["reference"]
    assert reference["run_dir"] == str(output / "runs" / "sdpa_deterministic") and reference["passed"]
    assert "execution.deterministic=true" in reference["command"] and "model.packed_attention=sdpa" in reference[
        "command"]
    assert "execution.deterministic=true" in resume["resumed"]["command"]
    assert resume["run_dir"] == str(output / "runs" / "sdpa_resumed")
    assert resume["killed"]["returncode"] == -9 and resume["killed_by_sigkill"]
    assert resume["killed"]["checkpoints"] == ["step_0000002.pt"] and resume["killed"]["metrics_steps"] == [1, 2, 3]
    assert not resume["killed"]["final_exported"]
    assert resume["resumed"]["returncode"] == 0
    # run_pretraining.py's command line, the killed one through run_compare.run_killed
    assert resume["resumed"]["command"][2:] == resume["killed"]["command"][4:]
    assert resume["resumed"]["command"][1].endswith("run_pretraining.py")
    comparison = resume["comparison"]
    assert comparison["losses_equal"] and comparison["steps"] == [4, 4] and comparison["bitwise"]
    assert comparison["checkpoint"]["equal"] and comparison["checkpoint"]["tensors_compared"] > 100
    assert comparison["checkpoints"] == ["step_0000004.pt", "step_0000004.pt"]
    assert "run_to_run" not in resume  # CPU mode: only after a CUDA mismatch

    # the peers bench: every contender on the same sequences
    (peers,) = report["peers"]
    rows = {row["name"]: row for row in peers["result"]["rows"]}
    assert sorted(rows) == sorted(["transformers padded", "transformers grouped"] + [
        "ours %s %s" % (layout, a) for layout in ("padded", "packed") for a in ("dense", "sdpa", "varlen")])
    assert len({row["sequences"] for row in rows.values()}) == 1
    assert all(row["sequences_per_second"] > 0 for row in rows.values())
    assert peers["result"]["precision"] == "bf16" and peers["command"].startswith("python -m ipu_packing.bench --peers")

    markdown = (output / "gpu_check.md").read_text()
    assert markdown in out and "every check passed" in markdown
    for line in ("| dense | 0 | 4 |", "\nours packed varlen ", "| True | step_0000002.pt | 0 | True | True of "):
        assert line in markdown, line
    assert torch.get_num_threads() == threads  # the CPU mode's one thread is put back as it was


def checkpoint(path, **values):
    torch.save(dict({"step": 4, "model": {"w": torch.tensor([1.0, 2.0])}, "rng": {"torch": torch.arange(4)},
                     "metrics": {"seconds": 1.0}}, **values), str(path))
    return str(path)


def test_checkpoint_comparison_sees_one_ulp(tmp_path):
    a = checkpoint(tmp_path / "a.pt")
    same = run_compare.compare_checkpoints(a, checkpoint(tmp_path / "b.pt", metrics={"seconds": 9.0}))
    assert same["equal"] and same["tensors_compared"] == 2 and same["differing"] == []  # wall times not compared
    nudged = torch.tensor([1.0, 2.0])
    nudged[1] = torch.nextafter(nudged[1], torch.tensor(3.0))
    other = run_compare.compare_checkpoints(a, checkpoint(tmp_path / "c.pt", model={"w": nudged}))
    assert not other["equal"] and other["differing"] == ["model.w"]
    assert other["max_abs_difference"] == pytest.approx(2.0 ** -22)
    assert run_compare.compare_checkpoints(a, checkpoint(tmp_path / "d.pt", step=5))["differing"] == ["step"]


def test_run_comparison_sees_a_different_loss(tmp_path):
    for name, loss in (("a", 1.5), ("b", 1.5), ("c", 1.5000000000000002)):
        (tmp_path / name).mkdir()
        with open(str(tmp_path / name / "metrics.jsonl"), "w") as f:
            for step in (1, 2):
                f.write(json.dumps(dict(step=step, loss=loss * step, mlm_loss=1.0, nsp_loss=0.5,
                                        sequences_per_second=10.0 + step)) + "\n")
    assert run_compare.compare_runs(str(tmp_path / "a"), str(tmp_path / "b"))["losses_equal"]
    other = run_compare.compare_runs(str(tmp_path / "a"), str(tmp_path / "c"))
    assert not other["losses_equal"] and other["first_differing_step"] == 1 and not other["bitwise"]


def test_existing_output_is_refused_and_left_alone(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    code, out, err = run_main(["--cpu", "--output", str(tmp_path)])
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "directory exists and is not empty" in err
    assert os.listdir(str(tmp_path)) == ["keep.txt"] and (tmp_path / "keep.txt").read_text() == "mine"
    code, out, err = run_main(["--cpu", "--output", str(tmp_path / "new"), "--data", str(tmp_path / "keep.txt")])
    assert code == 2 and "has no prepared packed dataset" in err and not (tmp_path / "new").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a torch without CUDA")
def test_cuda_mode_without_cuda_is_one_line_exit_2(tmp_path):
    output = tmp_path / "out"
    code, out, err = run_main(["--output", str(output)])
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("error: torch ")
    assert "sees no CUDA device" in err and "--cpu" in err
    assert not output.exists()


def minimal_report(peers):
    machine = dict(device_name="CPU (x86_64)", torch="2", transformers="4", python="3", load_before=[0.0, 0.0, 0.0],
                   load_after=[0.0, 0.0, 0.0])
    return dict(mode="cpu", started="now", steps=4, seconds=1.0, machine=machine, training=[],
                data=dict(dir="d", max_seq_length=128), peers=peers, failures=[])


def test_a_skipped_peers_run_is_reported_with_its_command():
    spec = gpu_check.PeersSpec("large", 256, 16, 3, "bf16", 200.0)
    mode = gpu_check.MODES["cuda"]
    reason = gpu_check.skip_reason(spec, mode, left=150.0)
    assert reason == "150 s of the 480 s budget left, 200 s wanted"
    entry = gpu_check.skipped_peers(spec, mode, 512, "hist.json", reason)
    assert entry["command"].startswith("python -m ipu_packing.bench --peers --histogram hist.json --max-seq-length 512")
    markdown = gpu_check.format_markdown(minimal_report([entry]))
    assert "## Peers, large: `%s`" % entry["command"] in markdown
    assert "skipped: 150 s of the 480 s budget left, 200 s wanted" in markdown


def test_the_cpu_modes_peers_run_whatever_the_load():
    # a busy machine spends the CPU mode's budget on training; its one peers run is part of the check all the same
    (spec,) = gpu_check.MODES["cpu"].peers
    assert gpu_check.skip_reason(spec, gpu_check.MODES["cpu"], left=-600.0) is None
    assert gpu_check.skip_reason(gpu_check.MODES["cuda"].peers[1], gpu_check.MODES["cuda"], left=199.0) is not None
