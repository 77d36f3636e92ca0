"""bench --peers: the transformers rows train on exactly our sequences, tokens and labels (and, with the same
weights, compute our losses), grouping by length is the Trainer's, every contender is timed on every batch
with the calls interleaved, and bad input is one line. Speed is reported by the command, never asserted."""

import contextlib
import io
import json

import numpy as np
import pytest
import torch

from ipu_packing.bench import cli as bench_cli
from ipu_packing.bench import peers
from ipu_packing.bench import throughput as bench
from ipu_packing.data.format import IGNORE_INDEX

pytestmark = pytest.mark.usefixtures("one_thread")

NAMES = ["transformers padded", "transformers grouped"] + ["ours %s %s" % (layout, attention)
                                                           for layout in ("padded", "packed")
                                                           for attention in peers.ATTENTIONS]
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=120,
            max_position_embeddings=64, attention_probs_dropout_prob=0.0)


def histogram(S=64):
    hist = np.zeros(S)
    hist[5:20] = 30  # short sequences
    hist[S - 1] = 200  # many full-length ones
    hist[30:40] = 20
    return hist


def layouts(timed_packs=12, S=64, vocab_size=120, seed=0):
    plan = bench.plan_histogram(histogram(S), S, 3, "lpfhp")
    return bench.timed_layouts(plan, S, 3, timed_packs, vocab_size, seed)


def test_the_transformers_rows_hold_our_sequences_tokens_and_labels():
    padded, packed = layouts()
    instances = peers.layout_instances(padded)
    assert len(instances) == padded.sequences == packed.sequences
    ours = {name: peers.layout_contents(peers.layout_batches(layout, 4)) for name, layout in
            (("padded", padded), ("packed", packed))}
    theirs = {"padded": peers.hf_contents(peers.padded_batches(instances, 4, 64)),
              "grouped": peers.hf_contents(peers.grouped_batches(instances, 4, seed=0))}
    for contents in list(ours.values()) + list(theirs.values()):
        assert contents.same_sequences(ours["padded"])
        assert contents.sequences == padded.sequences and contents.tokens == padded.tokens
    # the label multisets are the records' own, not just equal among the contenders
    assert ours["packed"].mlm_labels == sorted(packed.arrays["mlm_labels"][packed.arrays["mlm_labels"] != -100])
    assert sum(theirs["padded"].lengths) == int((padded.arrays["sequence_ids"] != 0).sum())
    assert theirs["padded"].computed_tokens == padded.rows * 64 > theirs["grouped"].computed_tokens >= padded.tokens

    # row by row: transformers' padded batches are our padded rows, each label at its token's position
    rows = peers.padded_batches(instances, 4, 64)
    stacked = {k: np.concatenate([b[k] for b in rows]) for k in rows[0]}
    a = padded.arrays
    for i in range(padded.rows):
        n = int((a["sequence_ids"][i] != 0).sum())
        assert stacked["attention_mask"][i].tolist() == [1] * n + [0] * (64 - n)
        assert np.array_equal(stacked["input_ids"][i, :n], a["input_ids"][i, :n])
        assert np.array_equal(stacked["token_type_ids"][i, :n], a["token_type_ids"][i, :n])
        valid = a["mlm_labels"][i] != IGNORE_INDEX
        expected = np.full(64, IGNORE_INDEX)
        expected[a["mlm_positions"][i][valid]] = a["mlm_labels"][i][valid]
        assert np.array_equal(stacked["labels"][i], expected)
        assert stacked["next_sentence_label"][i] == a["nsp_labels"][i, 0]


def test_grouped_batches_hold_every_sequence_once_padded_to_their_longest():
    padded, _ = layouts(timed_packs=40)
    instances = peers.layout_instances(padded)
    lengths = [len(s) for s in instances]
    order = peers.length_grouped_order(lengths, 4, seed=3)
    assert sorted(order) == list(range(len(instances)))  # a permutation: every sequence once
    batches = peers.grouped_batches(instances, 4, seed=3)
    assert sum(len(b["next_sentence_label"]) for b in batches) == len(instances)
    assert [len(b["next_sentence_label"]) for b in batches[:-1]] == [4] * (len(batches) - 1)
    for b, start in zip(batches, range(0, len(order), 4)):
        chosen = [lengths[j] for j in order[start:start + 4]]
        assert b["input_ids"].shape[1] == max(chosen)  # padded to the batch's longest, not to S
        assert b["attention_mask"].sum(axis=1).tolist() == chosen
    assert max(lengths) in [lengths[j] for j in order[:4]]  # the longest batch goes first
    again, other = (peers.length_grouped_order(lengths, 4, seed=seed) for seed in (3, 4))
    assert again == order != other  # seeded


@pytest.mark.parametrize("n,batch_size", [(7, 4), (41, 4), (250, 2), (1000, 3)])
def test_length_grouping_is_the_trainers(n, batch_size):
    trainer_pt_utils = pytest.importorskip("transformers.trainer_pt_utils")
    lengths = np.random.default_rng(n).integers(5, 512, size=n).tolist()
    generator = torch.Generator()
    generator.manual_seed(11)
    expected = trainer_pt_utils.get_length_grouped_indices(lengths, batch_size, generator=generator)
    assert peers.length_grouped_order(lengths, batch_size, seed=11) == expected


def test_same_weights_give_transformers_losses():
    padded, packed = layouts(timed_packs=6)
    contenders, models, skipped, _ = peers.build_contenders(padded, packed, TINY, 4, "cpu", "fp32", seed=0)
    assert skipped == [] and [c.name for c in contenders] == NAMES
    hf = models[0][0].eval()
    by_name = {c.name: c for c in contenders}
    with torch.no_grad():
        for b, batch in enumerate(by_name["transformers padded"].batches):
            expected = hf(**batch)  # its loss: the MLM mean over the batch's masked tokens + the NSP mean, as ours
            masked = batch["labels"] != IGNORE_INDEX
            for (model, _), attention in zip(models[1:], peers.ATTENTIONS):
                fields = by_name["ours padded %s" % attention].batches[b]
                ours = model.eval()(**fields)
                assert float(ours.loss) == pytest.approx(float(expected.loss), abs=2e-5), (attention, b)
                valid = fields["mlm_labels"] != IGNORE_INDEX  # our slots, in position order as transformers'
                assert torch.allclose(ours.mlm_logits[valid], expected.prediction_logits[masked], atol=2e-5)
                assert torch.allclose(ours.nsp_logits[:, 0], expected.seq_relationship_logits, atol=2e-5)


@pytest.mark.slow
def test_every_contender_steps_on_every_batch_interleaved(monkeypatch):
    calls = []
    original = peers.build_contenders

    def counting(*args, **kwargs):
        contenders, models, skipped, attention = original(*args, **kwargs)
        for c in contenders:
            def step(batch, c=c, inner=c.call):
                calls.append((c.name, int(next(iter(batch.values())).shape[0])))
                return inner(batch)
            c.call = step
        counting.contenders = contenders
        return contenders, models, skipped, attention

    monkeypatch.setattr(peers, "build_contenders", counting)
    result = peers.run_peers(histogram(), 64, 3, micro_batch_size=4, repeats=2, timed_packs=9)
    contenders = counting.contenders
    for c in contenders:  # every sequence, or pack, in some batch: 9 packs are 4 + 4 + 1
        rows = [len(next(iter(b.values()))) for b in c.batches]
        assert sum(rows) == (9 if c.layout == "packed" else result["num_sequences"]), c.name
    assert [len(next(iter(b.values()))) for b in contenders[-1].batches] == [4, 4, 1]
    warm, timed = calls[:len(contenders)], calls[len(contenders):]
    assert [name for name, _ in warm] == NAMES  # one warm-up step each
    per_pass = sum(len(c.batches) for c in contenders)
    assert len(timed) == 2 * per_pass
    for r in range(2):
        one = timed[r * per_pass:(r + 1) * per_pass]
        for c in contenders:  # every batch of every contender, the short last one included
            assert [rows for name, rows in one if name == c.name] == [len(next(iter(b.values()))) for b in c.batches]
        # interleaved: the pass opens with one step of each contender, not all of one contender's steps
        first = [name for name, _ in one[:len(contenders)]]
        assert sorted(first) == sorted(NAMES)
    assert [row["calls"] for row in result["rows"]] == [len(c.batches) for c in contenders]


def test_the_adamw_state_of_the_warm_up_stays_for_the_timed_steps(monkeypatch):
    """The reset after the warm-up restores the weights only: a timed step allocates no optimizer state (on CUDA a
    contender's peak would otherwise count its AdamW state twice, in the step and in resident_bytes)."""
    original = peers.build_contenders

    def keeping(*args, **kwargs):
        contenders, models, skipped, attention = original(*args, **kwargs)
        keeping.built = contenders, models
        return contenders, models, skipped, attention

    monkeypatch.setattr(peers, "build_contenders", keeping)
    peers.run_peers(histogram(), 64, 3, micro_batch_size=4, repeats=2, timed_packs=4)
    contenders, models = keeping.built
    steps = {}  # model -> its optimizer steps: one warm-up call of each contender, then every batch of every repeat
    for c in contenders:
        model = models[0][0] if c.library == "transformers" else models[1 + peers.ATTENTIONS.index(c.attention)][0]
        steps[id(model)] = steps.get(id(model), 0) + 1 + 2 * len(c.batches)
    for model, optimizer in models:
        counts = {int(state["step"]) for state in optimizer.state.values()}
        assert counts == {steps[id(model)]}, counts


def run_main(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = bench_cli.main(args)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_json_has_every_contender(tmp_path):
    hist_file = tmp_path / "hist.json"
    hist_file.write_text(json.dumps({"histogram": histogram().tolist()}))
    code, out, err = run_main(["--peers", "--histogram", str(hist_file), "--max-seq-length", "64",
                               "--timed-packs", "8", "--micro-batch-size", "4", "--repeats", "2", "--json"])
    assert code == 0, err
    result = json.loads(out)
    rows = {row["name"]: row for row in result["rows"]}
    assert sorted(rows) == sorted(NAMES) and result["skipped"] == []
    baseline = rows["transformers padded"]["sequences_per_second"]
    for row in rows.values():
        assert row["sequences"] == result["num_sequences"] and row["tokens"] == result["num_tokens"]
        assert len(row["seconds"]) == 2 and all(s > 0 for s in row["seconds"])
        assert row["sequences_per_second"] == pytest.approx(row["sequences"] / float(np.median(row["seconds"])))
        assert row["ratio"] == pytest.approx(row["sequences_per_second"] / baseline)
        assert row["peak_memory_bytes"] is None  # CPU
    assert rows["transformers padded"]["computed_tokens"] == rows["transformers padded"]["sequences"] * 64
    assert rows["ours packed dense"]["computed_tokens"] == result["timed_packs"] * 64 == 8 * 64
    assert len(result["load_before"]) == len(result["load_after"]) == 3
    assert result["optimizer"] == dict(peers.ADAMW, name="AdamW", betas=list(peers.ADAMW["betas"]))
    assert result["torch_threads"] == 1 and result["device"] == "cpu"


def test_an_attention_this_torch_cannot_run_is_left_out_and_said(monkeypatch):
    from ipu_packing.model import attention

    monkeypatch.setattr(attention, "missing_torch_support",
                        lambda name: "needs a newer torch" if name == "varlen" else None)
    result = peers.run_peers(histogram(), 64, 3, micro_batch_size=4, repeats=1, timed_packs=4)
    assert [row["name"] for row in result["rows"]] == [n for n in NAMES if not n.endswith("varlen")]
    assert result["skipped"] == ["ours varlen: needs a newer torch"]
    assert "skipped ours varlen: needs a newer torch" in peers.format_peers(result)


@pytest.mark.parametrize("args,message", [
    (["--peers", "--config", "demo"], "--peers and --config"),
    (["--peers", "--attention", "dense"],
     "--attention is an option of the synthetic mode and --config, not of --peers"),
    (["--peers", "--plot", "x.png"], "--plot is an option of the synthetic mode and --config, not of --peers"),
    (["--config", "demo", "--device", "cuda"],
     "--device is an option of the synthetic mode and --peers, not of --config"),
    (["--config", "demo", "--precision", "bf16"],
     "--precision is an option of the synthetic mode and --peers, not of --config"),
    (["--peers", "--precision", "fp16"], "invalid choice"),
    (["--peers", "--micro-batch-size", "0"], "--micro-batch-size must be >= 1"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    hist_file = tmp_path / "hist.json"
    hist_file.write_text(json.dumps({"histogram": histogram().tolist()}))
    code, out, err = run_main(["--histogram", str(hist_file)] + args)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a torch without CUDA")
@pytest.mark.parametrize("mode", [["--peers"], []], ids=["peers", "synthetic"])
def test_device_cuda_without_cuda_is_one_line_exit_2(tmp_path, mode):
    hist_file = tmp_path / "hist.json"
    hist_file.write_text(json.dumps({"histogram": histogram().tolist()}))
    code, out, err = run_main(["--histogram", str(hist_file), "--device", "cuda"] + mode)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "--device cuda: torch" in err and "sees no CUDA device" in err


def test_keep_going_leaves_out_a_contender_whose_warm_up_fails(monkeypatch):
    original = peers.build_contenders

    def one_broken(*args, **kwargs):
        contenders, models, skipped, attention = original(*args, **kwargs)

        def boom(batch):
            raise RuntimeError("no kernel\nfor this")

        [c for c in contenders if c.name == "ours packed sdpa"][0].call = boom
        return contenders, models, skipped, attention

    monkeypatch.setattr(peers, "build_contenders", one_broken)
    with pytest.raises(RuntimeError, match="no kernel"):  # the bench itself: a failing contender is a bug
        peers.run_peers(histogram(), 64, 3, micro_batch_size=4, repeats=1, timed_packs=4)
    result = peers.run_peers(histogram(), 64, 3, micro_batch_size=4, repeats=1, timed_packs=4, keep_going=True)
    assert [row["name"] for row in result["rows"]] == [n for n in NAMES if n != "ours packed sdpa"]
    assert result["failed"] == ["ours packed sdpa: RuntimeError: no kernel for this"]
    assert "FAILED ours packed sdpa: RuntimeError: no kernel for this" in peers.format_peers(result)
