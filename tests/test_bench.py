"""The packed-vs-padded bench: same sequences in both layouts, the plan's mix in the timed sample,
the JSON keys and the plot. Speed itself is reported by the command, never asserted."""

import importlib.util
import json

import numpy as np
import pytest

import app_fixtures as fx
from ipu_packing.bench import cli as bench_cli
from ipu_packing.bench import throughput as bench
from packing_fixtures import synthetic_histogram

FLOP_COUNTER = importlib.util.find_spec("torch.utils.flop_counter") is not None
"""torch >= 2.1 counts FLOPs (FlopCounterMode); the SDK's torch 2.0.1 does not."""


def test_select_packs_keeps_the_plan_mix():
    plan = bench.plan_histogram(synthetic_histogram(), 64, 3, "lpfhp")
    chosen = bench.select_packs(plan, 50, seed=3)
    assert len(chosen) == 50
    sample_ratio = sum(len(p) for p in chosen) / 50.0
    assert abs(sample_ratio - plan.num_sequences / float(plan.num_packs)) < 0.05
    assert all(sum(p) <= 64 and len(p) <= 3 for p in chosen)
    everything = bench.select_packs(plan, 0, seed=3)
    assert len(everything) == plan.num_packs
    assert sorted(n for p in everything for n in p) == sorted(
        np.repeat(np.arange(1, 65), synthetic_histogram().astype(int)))


def test_padded_and_packed_layouts_hold_the_same_sequences():
    lengths = np.array([64, 30, 20, 10, 5, 3, 1, 40, 24])
    groups = [[0], [1, 2, 3], [4, 5, 6], [7, 8]]
    sequences = bench.make_sequences(lengths, 100, seed=0)
    padded = bench.build_layout("padded", sequences, [[i] for i in range(len(lengths))], 64, 1, 10)
    packed = bench.build_layout("packed", sequences, groups, 64, 3, 12)
    assert padded.sequences == packed.sequences == len(lengths)
    assert padded.tokens == packed.tokens == lengths.sum()
    a, b = packed.arrays, padded.arrays
    for p, group in enumerate(groups):
        for k, i in enumerate(group):
            where = np.flatnonzero(a["sequence_ids"][p] == k + 1)
            n = lengths[i]
            assert len(where) == n and (b["sequence_ids"][i] != 0).sum() == n
            for field in ("input_ids", "token_type_ids", "position_ids"):
                assert np.array_equal(a[field][p, where], b[field][i, :n]), field
            assert a["cls_positions"][p, k] == where[0]
            assert a["nsp_labels"][p, k] == b["nsp_labels"][i, 0]
            # masked slots of this sequence, shifted by its offset
            own = np.isin(a["mlm_positions"][p], where) & (a["mlm_labels"][p] != -100)
            theirs = b["mlm_labels"][i] != -100
            assert np.array_equal(a["mlm_positions"][p][own] - where[0], b["mlm_positions"][i][theirs])
            assert np.array_equal(a["mlm_labels"][p][own], b["mlm_labels"][i][theirs])


def test_timed_layouts_size_M_as_the_data_pipeline():
    from ipu_packing.data.format import mlm_slots

    for S, expected in ((128, 20), (512, 78)):
        hist = np.zeros(S)
        hist[[S // 8, S // 2, S - 1]] = [40, 20, 10]
        padded, packed = bench.timed_layouts(bench.plan_histogram(hist, S, 3, "lpfhp"), S, 3, 16, 1000, seed=0)
        assert packed.arrays["mlm_labels"].shape[1] == mlm_slots(S, 3) == expected  # the prepared data's M
        assert padded.arrays["mlm_labels"].shape[1] == mlm_slots(S, 1)
        assert padded.sequences == packed.sequences and padded.tokens == packed.tokens


def run_main(args):
    return fx.captured(bench_cli.main, args)


def test_json_output_and_plot(tmp_path):
    import torch

    hist_file = tmp_path / "hist.json"
    hist_file.write_text(json.dumps({"name": "synthetic", "histogram": synthetic_histogram().tolist()}))
    plot = tmp_path / "bench.png"
    threads = torch.get_num_threads()
    try:
        code, out, err = run_main(["--histogram", str(hist_file), "--max-seq-length", "64", "--timed-packs", "8",
                                   "--micro-batch-size", "4", "--repeats", "1", "--threads", "1", "--json",
                                   "--plot", str(plot)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0, err
    result = json.loads(out)
    for key in ("padded_sequences_per_second", "packed_sequences_per_second", "speedup", "theoretical_speedup",
                "overhead"):
        assert isinstance(result[key], float), key
    assert result["num_packs"] == 8
    assert result["theoretical_speedup"] == result["padded_rows"] / 8.0
    assert result["speedup"] == pytest.approx(
        result["packed_sequences_per_second"] / result["padded_sequences_per_second"])
    assert result["overhead"] == pytest.approx(result["theoretical_speedup"] / result["speedup"] - 1.0)
    assert open(str(plot), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # the same-shape overhead of a packed row in CPU time and matmul FLOPs, beside the wall time's
    padded, packed = result["attentions"]
    assert [(a["layout"], a["attention"]) for a in (padded, packed)] == [("padded", result["attention"]),
                                                                        ("packed", result["attention"])]
    assert result["cpu_overhead"] == pytest.approx(packed["cpu_seconds_per_row"] / padded["cpu_seconds_per_row"] - 1)
    if not FLOP_COUNTER:  # torch < 2.1 (the SDK's 2.0.1) has no FlopCounterMode: no count, and none made up
        assert result["flops_overhead"] is None and packed["matmul_flops_per_row"] is None
        return
    assert result["flops_overhead"] == pytest.approx(
        packed["matmul_flops_per_row"] / padded["matmul_flops_per_row"] - 1)
    assert 0 < result["flops_overhead"] < 0.5  # the heads' extra slots, in rows of the same shape


@pytest.mark.skipif(not FLOP_COUNTER, reason="torch < 2.1 has no FlopCounterMode")
def test_the_matmul_flops_of_a_step_are_torch_s_count():
    """The bench's FLOP count is torch's FlopCounterMode over one step: a (B, S, H) x (H, F) linear's forward and
    backward (the gradients of its input and its weight) are 3 * 2 * B * S * H * F."""
    import torch

    layer = torch.nn.Linear(8, 5, bias=False)
    step = lambda x: layer(x).sum().backward()  # noqa: E731
    assert bench.matmul_flops(step, torch.ones(2, 3, 8, requires_grad=True)) == 3 * 2 * 2 * 3 * 8 * 5


def test_bad_input_is_one_line_exit_2(tmp_path):
    code, out, err = run_main(["--histogram", str(tmp_path / "missing.json"), "--plot", ""])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "missing.json" in err
    code, out, err = run_main(["--data", str(tmp_path), "--plot", ""])
    assert code == 2 and "no prepared dataset" in err


def test_the_timed_steps_are_the_training_runner_s(monkeypatch):
    from ipu_packing.execution.runner_ddp import TorchRunner

    rows = []
    original = TorchRunner.train_step

    def counting(self, batch):
        rows.append(int(batch["input_ids"].shape[0]))
        return original(self, batch)

    monkeypatch.setattr(TorchRunner, "train_step", counting)
    result = bench.run_bench(synthetic_histogram(), 64, 3, micro_batch_size=4, repeats=1, timed_packs=8)
    # a FLOP-counted step (torch >= 2.1) and a warm-up step of each layout, then every full micro batch of both
    # layouts once
    assert rows == [4] * (2 * (1 + FLOP_COUNTER) + result["padded_rows"] // 4 + result["num_packs"] // 4)


def test_question_answering_rows_keep_the_tokens_and_answer_inside_each_sequence():
    padded, packed = bench.timed_layouts(bench.plan_histogram(synthetic_histogram(), 64, 3, "lpfhp"), 64, 3, 16, 100,
                                         seed=0)
    for layout in (padded, packed):
        qa = bench.question_answering_layout(layout, seed=0)
        a = qa.arrays
        assert sorted(a) == ["cls_positions", "end_positions", "input_ids", "position_ids", "sequence_ids",
                             "start_positions", "token_type_ids"]
        assert (qa.sequences, qa.tokens) == (layout.sequences, layout.tokens)
        for name in ("input_ids", "token_type_ids", "position_ids", "sequence_ids", "cls_positions"):
            assert a[name] is layout.arrays[name]
        spans = 0
        for p in range(qa.rows):
            for k in range(a["cls_positions"].shape[1]):
                own = np.flatnonzero(a["sequence_ids"][p] == k + 1)
                start, end = a["start_positions"][p, k], a["end_positions"][p, k]
                if len(own) == 0:
                    assert start == end == -100
                    continue
                spans += 1
                # after the sequence's [CLS], before its last [SEP] (a sequence of 2 tokens answers at its 2nd)
                assert own[0] < start <= end <= max(own[-1] - 1, own[0] + 1) and end - start < 30
        assert spans == layout.sequences


def test_question_answering_steps_are_the_qa_model_s(monkeypatch):
    from ipu_packing.execution.runner_ddp import TorchRunner
    from ipu_packing.model import PackedBertForQuestionAnswering

    seen = []
    original = TorchRunner.train_step

    def recording(self, batch):
        seen.append((type(self.model), sorted(batch)))
        return original(self, batch)

    monkeypatch.setattr(TorchRunner, "train_step", recording)
    result = bench.run_bench(synthetic_histogram(), 64, 3, micro_batch_size=4, repeats=1, timed_packs=8,
                             task="question_answering")
    assert result["task"] == "question_answering"
    assert {model for model, _ in seen} == {PackedBertForQuestionAnswering}
    assert all("start_positions" in names and "mlm_labels" not in names for _, names in seen)
    assert len(seen) == 2 * (1 + FLOP_COUNTER) + result["padded_rows"] // 4 + result["num_packs"] // 4


def test_task_is_an_option_of_the_synthetic_mode():
    code, out, err = run_main(["--config", "finetune_qa_demo", "--task", "question_answering"])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--task is an option of the synthetic mode, not of --config" in err


def test_every_option_of_the_bench_belongs_to_a_mode():
    """inputs.MODES says which options each mode takes: an option no mode takes could never be given."""
    from ipu_packing.bench.inputs import MODES

    dests = {action.dest for action in bench_cli.build_parser()._actions} - {"help"}
    assert dests == {dest for options in MODES.values() for dest in options}


def test_the_harness_interleaves_every_contender_in_proportion():
    from ipu_packing.bench.harness import Contender, measure, schedule

    assert schedule([4, 2, 1]) == [(0, 0), (1, 0), (0, 1), (2, 0), (0, 2), (1, 1), (0, 3)]
    events = []
    contenders = [Contender("padded", [10, 11, 12, 13], lambda b: events.append(b),
                            after=lambda: events.append("after")),
                  Contender("packed", [20, 21], lambda b: events.append(b), before=lambda: events.append("before"),
                            warmup=29)]
    timings = measure(contenders, repeats=2, reset=lambda: events.append("reset"))
    one_pass = [10, "after", "before", 20, 11, "after", 12, "after", "before", 21, 13, "after"]
    assert events == [10, "after", "before", 29, "reset"] + one_pass * 2
    assert [len(s) for s in timings.seconds] == [2, 2] and [len(c) for c in timings.calls] == [8, 4]
    assert timings.seconds[0][1] == pytest.approx(sum(timings.calls[0][4:]))
    assert timings.peaks == [None, None] and timings.failed == [] and len(timings.load_after) == 3


def test_the_harness_runs_passes_back_to_back_rotated_and_leaves_out_a_failing_warm_up():
    from ipu_packing.bench.harness import Contender, measure, schedule

    assert schedule([2, 1, 2], "passes", 0) == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]
    assert schedule([2, 1, 2], "passes", 1) == [(1, 0), (2, 0), (2, 1), (0, 0), (0, 1)]
    calls = []

    def broken(batch):
        raise RuntimeError("no kernel\nfor this")

    contenders = [Contender("a", [1, 2], calls.append), Contender("broken", [0], broken),
                  Contender("b", [3], calls.append)]
    with pytest.raises(RuntimeError):
        measure(contenders)
    del calls[:]
    timings = measure(contenders, repeats=2, order="passes", keep_going=True)
    assert [c.name for c in timings.contenders] == ["a", "b"]
    assert timings.failed == ["broken: RuntimeError: no kernel for this"]
    assert calls == [1, 3] + [1, 2, 3] + [3, 1, 2]
    with pytest.raises(ValueError):
        measure(contenders, order="blocks")


@pytest.mark.parametrize("mode", [["--histogram", "h.json"], ["--config", "demo"]])
@pytest.mark.parametrize("attention", ["dense,dense", "dense,,varlen"])
def test_attention_lists_are_distinct_names_in_both_modes(mode, attention):
    code, out, err = run_main(mode + ["--attention", attention])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--attention takes distinct implementations separated by commas, got %r" % attention in err


def test_the_harness_reports_each_contender_over_its_median_pass_and_its_baselines():
    from ipu_packing.bench.harness import Contender, Timings, rows, table

    contenders = [Contender("padded", [1, 2, 3], None, sequences=30, computed_tokens=384),
                  Contender("packed", [1], None, sequences=30, computed_tokens=128)]
    timings = Timings(contenders, seconds=[[3.0, 6.0, 4.0], [1.0, 2.0, 9.0]], calls=[[], []], cpu=[[], []],
                      warmup=[0.1, 0.1], peaks=[None, 7])
    padded, packed = rows(timings, {"ratio": "padded", "ratio_missing": "gone"})
    assert (padded["calls"], padded["sequences"], padded["computed_tokens"]) == (3, 30, 384)
    assert (padded["sequences_per_second"], packed["sequences_per_second"]) == (30 / 4.0, 30 / 2.0)
    assert (padded["ratio"], packed["ratio"]) == (1.0, 2.0)
    assert np.isnan(packed["ratio_missing"]) and (padded["step_memory_bytes"], packed["step_memory_bytes"]) == (None, 7)
    assert table([padded, packed], [("contender", 8, lambda r: r["name"]), ("seq/s", 6, lambda r: "%.1f" % r[
        "sequences_per_second"])]) == ["contender  seq/s", "padded      7.5", "packed     15.0"]
