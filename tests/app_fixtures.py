"""Small prepared datasets for the application's tests, written by the data package's own writers.

`write_prepared(root, ...)` writes root/packed (K sequences per pack) and root/padded (K = 1) from the
same random NSP/MLM instances, as `python -m ipu_packing.data prepare` does: the packing engine plans
and assigns the packs, data/write/packs.py writes the shards, data/format.py the manifest. Tokens are random;
only shapes and bookkeeping matter.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import numpy as np

from ipu_packing.data.format import (FORMAT_VERSION, SPECIAL_TOKENS, VOCAB, field_dtypes, max_predictions, mlm_slots,
                                     pack_statistics, sha256_file, write_manifest)
from ipu_packing.data.instance_files import Instances, load_instances, save_instances
from ipu_packing.data.random_instances import draw_instances
from ipu_packing.data.write.packs import PackLayout, write_dataset_in_memory
from ipu_packing.packing import assign_sequences, histogram_from_lengths, plan_packing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _instances(rng: np.random.Generator, n: int, S: int, V: int, cap: int) -> Instances:
    """`n` random instances of 8..S tokens (70% uniform in [8, S], the rest in [8, S // 3)) by the data
    package's one generator (data/random_instances.py: [CLS] A [SEP] B [SEP], the recipe's count masked)."""
    long, short = rng.integers(8, S + 1, n), rng.integers(8, max(9, S // 3), n)
    lengths = np.where(rng.random(n) < 0.7, long, short)
    drawn = draw_instances(rng, lengths, V, max_predictions_per_seq=cap, width=S)
    counts = drawn.mlm_counts

    def as32(values):
        return np.asarray(values, dtype=np.int32)

    return Instances(as32(drawn.input_ids[np.arange(S)[None, :] < lengths[:, None]]), as32(lengths),
                     as32(drawn.a_lengths), as32(drawn.nsp_labels), as32(counts),
                     as32(drawn.mlm_positions[np.arange(cap)[None, :] < counts[:, None]]),
                     as32(drawn.mlm_labels[np.arange(cap)[None, :] < counts[:, None]]))


def _write(directory: str, store: Instances, members, offsets, S: int, K: int, kind: str, algorithm: str,
           seed: int, vocab_lines, cap: int) -> None:
    """One dataset directory: two shards, vocab.txt and manifest.json."""
    os.makedirs(directory)
    with open(os.path.join(directory, VOCAB), "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in vocab_lines))
    layout = PackLayout(S, K, mlm_slots(S, K), len(vocab_lines))
    num_packs = len(offsets) - 1
    half = layout.record_bytes * ((num_packs + 1) // 2)
    manifest = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "max_seq_length": S,
        "max_sequences_per_pack": K,
        "mlm_slots": layout.mlm_slots,
        "vocab_file": VOCAB,
        "vocab_size": len(vocab_lines),
        "vocab_checksum": sha256_file(os.path.join(directory, VOCAB)),
        "do_lower_case": True,
        "special_token_ids": {t: i for i, t in enumerate(SPECIAL_TOKENS)},
        "packing_algorithm": algorithm,
        "seed": seed,
        "recipe": {"masked_lm_prob": 0.15, "max_predictions_per_seq": cap},
        "corpus": {"name": "random test fixture"},
        "shards": write_dataset_in_memory(store, members, offsets, np.arange(num_packs), layout, directory, half),
        "field_dtypes": {name: dtype.str for name, dtype in field_dtypes(S, K, len(vocab_lines)).items()},
    }
    manifest.update(pack_statistics(store.lengths, store.mlm_counts, np.diff(offsets), S, K))
    write_manifest(directory, manifest)


def write_prepared(root: str, S: int = 32, K: int = 3, V: int = 64, num_sequences: int = 96, seed: int = 0,
                   vocab_tag: str = "") -> str:
    """Write root/packed and root/padded from the same instances; returns root."""
    rng = np.random.default_rng(seed)
    cap = max_predictions(S)
    vocab_lines = list(SPECIAL_TOKENS) + ["tok%s%d" % (vocab_tag, i) for i in range(V - len(SPECIAL_TOKENS))]
    with tempfile.TemporaryDirectory() as work:
        save_instances(os.path.join(work, "instances.npz"), _instances(rng, num_sequences, S, V, cap), V)
        store = load_instances(os.path.join(work, "instances.npz"))
        plan = plan_packing(histogram_from_lengths(store.lengths, S), S, K, "optimal")
        assignment = assign_sequences(plan, store.lengths, seed)
        _write(os.path.join(root, "packed"), store, np.asarray(assignment.indices, dtype=np.int64),
               np.asarray(assignment.offsets, dtype=np.int64), S, K, "packed", plan.algorithm, seed, vocab_lines, cap)
        single = np.arange(num_sequences + 1, dtype=np.int64)
        _write(os.path.join(root, "padded"), store, single[:-1], single, S, 1, "padded", "none (one sequence per row)",
               seed, vocab_lines, cap)
    return root


# ---- tiny training runs -----------------------------------------------------------------------------------------

TINY = [
    "model.vocab_size=64", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2",
    "model.num_attention_heads=2", "model.hidden_dropout_prob=0.1",
    "data.max_seq_length=32", "execution.micro_batch_size=4", "training.global_batch_sequences=16",
    "logging.progress_bar=false", "logging.tensorboard=false", "optimizer.lr=0.01",
]
"""Overrides of the demo config for a 2-layer, 32-wide BERT on write_prepared's S=32, V=64 data."""


TINY_RUN = ["training.steps=4", "checkpoint.every_steps=2"]
"""The session's trained run (conftest.py tiny_run): 4 steps, a checkpoint every 2, the export at the end."""


def prepare_demo_task(out: str, max_seq_length: int = 64, max_sequences_per_pack: int = 6) -> str:
    """``prepare --task classification --input default`` (the embedded demo task, default vocabulary) into out."""
    from ipu_packing.data.cli import main

    code, _, err = captured(main, ["prepare", "--task", "classification", "--input", "default", "--output", out,
                                   "--max-seq-length", str(max_seq_length), "--max-sequences-per-pack",
                                   str(max_sequences_per_pack), "--workers", "1", "--quiet"])
    assert code == 0, err
    return out


QA_DEMO_ARGS = ["--max-seq-length", "64", "--doc-stride", "16", "--max-query-length", "32",
                "--max-sequences-per-pack", "4"]
"""The question-answering tests' demo task: short windows (most questions have several), four to a pack."""


QA_TEST_TRAIN_QUESTIONS = 3000
"""The tests' demo train split: 3000 train questions (the demo's 20,000 would make each preparation of the demo
several seconds slower); the validation split follows it as in the demo (qa_demo.py, recipe step 3)."""
QA_TEST_WORDS_PER_CONTEXT = (15, 40)
"""The tests' demo passages: 15 to 40 words, so that at QA_DEMO_ARGS' S=64 most questions have several windows and
a pack holds windows of several questions (the demo's passages of 6 to 24 words mostly fit one window)."""


@contextlib.contextmanager
def qa_test_demo():
    """The embedded demo question-answering task's recipe with QA_TEST_TRAIN_QUESTIONS train questions on passages of
    QA_TEST_WORDS_PER_CONTEXT words, while inside."""
    from ipu_packing.data.finetune import qa_demo

    full = qa_demo.TRAIN_QUESTIONS, qa_demo.MIN_WORDS_PER_CONTEXT, qa_demo.MAX_WORDS_PER_CONTEXT
    qa_demo.TRAIN_QUESTIONS = QA_TEST_TRAIN_QUESTIONS
    qa_demo.MIN_WORDS_PER_CONTEXT, qa_demo.MAX_WORDS_PER_CONTEXT = QA_TEST_WORDS_PER_CONTEXT
    try:
        yield
    finally:
        qa_demo.TRAIN_QUESTIONS, qa_demo.MIN_WORDS_PER_CONTEXT, qa_demo.MAX_WORDS_PER_CONTEXT = full


def prepare_qa_demo_task(out: str) -> str:
    """``prepare --task question_answering --input default`` (the embedded demo task, default vocabulary, its tests'
    size: qa_test_demo) into out, with QA_DEMO_ARGS."""
    from ipu_packing.data.cli import main

    with qa_test_demo():
        code, _, err = captured(main, ["prepare", "--task", "question_answering", "--input", "default", "--output",
                                       out] + QA_DEMO_ARGS + ["--workers", "1", "--quiet"])
    assert code == 0, err
    return out


def num_questions(task_root: str, split: str) -> int:
    """The questions of a prepared question-answering split, as its manifest counts them (its windows are its
    num_sequences)."""
    import json

    with open(os.path.join(task_root, split, "packed", "manifest.json"), encoding="utf-8") as f:
        return int(json.load(f)["task"]["num_examples"])


def num_examples(task_root: str, split: str) -> int:
    """The examples of a prepared task's split, as its manifest counts them (the demo task's size depends on the
    running Python's standard library, from which it is made)."""
    import json

    with open(os.path.join(task_root, split, "packed", "manifest.json"), encoding="utf-8") as f:
        return int(json.load(f)["num_sequences"])


def tiny_run_args(data_dir, run_dir, *extra):
    """run_pretraining.py's arguments of the session's trained run (conftest.py tiny_run), and ``extra``."""
    return ["--config", "demo"] + TINY + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run_dir] + TINY_RUN \
        + list(extra)


def tiny(data_dir, run_dir, *extra):
    """The demo config with TINY, on ``data_dir`` (write_prepared's root), into ``run_dir``."""
    from ipu_packing.train import load_config

    return load_config("demo", TINY + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run_dir] + list(extra))


def train(config, **kwargs):
    """Plan and train ``config`` in this process, silently; returns the summary."""
    from ipu_packing.data import open_dataset
    from ipu_packing.train.loop import execute, plan_run

    return execute(plan_run(config, open_dataset=open_dataset), log=lambda m: None, **kwargs)


# ---- a transformers classifier ------------------------------------------------------------------------------

CLASSIFIER_WORDS = ("the loop runs a task socket server mail header test case event thread lock queue request http "
                    "message assert mock fixture async await selector protocol transport").split()
"""The words of hf_classifier's vocabulary."""


def hf_bert(directory, head, seed=0, **config):
    """A transformers BERT of class ``head`` (random weights, seeded: 2 layers of 32, 128 positions) and a
    BertTokenizerFast of CLASSIFIER_WORDS, saved to ``directory``; ``config``: more BertConfig arguments."""
    import torch
    import transformers

    words = sorted(set(CLASSIFIER_WORDS))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + [c for c in "abcdefghijklmnopqrstuvwxyz"
                                                                       if c not in words]
    os.makedirs(directory)
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    tokenizer = transformers.BertTokenizerFast(os.path.join(directory, "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(directory)
    torch.manual_seed(seed)
    bert = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=128, **config)
    getattr(transformers, head)(bert).save_pretrained(directory)
    return directory


def hf_classifier(directory, num_labels, problem_type, seed=0):
    """A transformers BertForSequenceClassification (hf_bert) with labels label_0, label_1, ..."""
    return hf_bert(directory, "BertForSequenceClassification", seed, num_labels=num_labels, problem_type=problem_type,
                   id2label={i: "label_%d" % i for i in range(num_labels)},
                   label2id={"label_%d" % i: i for i in range(num_labels)})


def hf_question_answering(directory, seed=0):
    """A transformers BertForQuestionAnswering (hf_bert)."""
    return hf_bert(directory, "BertForQuestionAnswering", seed)


# ---- a question-answering dataset's examples file -------------------------------------------------------

def rewrite_examples(directory, edit):
    """The examples file of a dataset ``directory`` rewritten by ``edit`` (its rows -> rows), the manifest's sha256
    of it updated: a file that passes its checksum whatever it holds."""
    import hashlib
    import json

    path = os.path.join(directory, "examples.jsonl")
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f.read().split("\n") if line]
    data = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in edit(rows)).encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    manifest["task"]["examples_sha256"] = hashlib.sha256(data).hexdigest()
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)


def line_breaks_in_contexts(rows):
    """Spaces of the first rows' contexts outside their answers replaced, one for one, by characters that
    str.splitlines breaks at: the answers' offsets still hold."""
    for row, ch in zip(rows, ["\u2028", "\u0085", "\u2029", "\x1c"]):
        context, start = row["context"], row["answers"]["answer_start"][0] if row["answers"]["answer_start"] else 0
        space = context.index(" ", start + len(row["answers"]["text"][0]) if row["answers"]["text"] else 0)
        row["context"] = context[:space] + ch + context[space + 1:]
    return rows


# ---- reading a run directory (through its owner) -------------------------------------------------------------


def checkpoints(run_dir):
    """The run's step checkpoints, oldest first."""
    from ipu_packing.train.run_dir import RunDirectory

    return RunDirectory(run_dir).checkpoints()


def latest(run_dir):
    from ipu_packing.train.run_dir import RunDirectory

    return RunDirectory(run_dir).latest()


def load(path):
    """A step checkpoint, read and checked (TrainingState.load)."""
    from ipu_packing.train.state import TrainingState

    return TrainingState.load(path)


def save(run_dir, state, keep=2):
    from ipu_packing.train.run_dir import RunDirectory

    return RunDirectory(run_dir).save(state, keep)


def metrics(run_dir):
    """The records of the run's metrics.jsonl."""
    from ipu_packing.train.run_dir import RunDirectory

    return RunDirectory(run_dir).read_metrics()


def read_jsonl(path):
    import json

    with open(path, "r", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(run_dir):
    """(step, loss, mlm_loss, nsp_loss) of every record of the run."""
    return [(r["step"], r["loss"], r["mlm_loss"], r["nsp_loss"]) for r in metrics(run_dir)]


def holding(run_dir):
    """``with holding(run_dir):`` this process holds the run directory's lock, as a live run would."""
    import contextlib

    from ipu_packing.train.run_dir import RunDirectory

    @contextlib.contextmanager
    def held():
        directory = RunDirectory(run_dir)
        directory.lock()
        try:
            yield directory
        finally:
            directory.unlock()

    return held()


def losses_of(run_dir, *names):
    """(step, *names) of every record of the run."""
    return [tuple([r["step"]] + [r[n] for n in names]) for r in metrics(run_dir)]


def snapshot(root):
    """{relative path: sha256} of every file under ``root``, and every directory (None): what a test that must
    write nothing compares before and after."""
    import hashlib

    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(base, name), root) + "/"] = None
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


# ---- commands in this process ------------------------------------------------------------------------------

def captured(main, argv):
    """(what ``main(argv)`` returned, its stdout, its stderr): a command's main() run in this process."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def call(main, argv):
    """(exit status, stdout, stderr) of a command's main(), in this process."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code or 0, out.getvalue(), err.getvalue()


def both_dry_runs(config, *overrides):
    """The dry-run report of both commands, ``python -m ipu_packing.execution dry-run --config X`` and
    ``run_pretraining.py --config X --dry-run``: two (exit status, stdout, stderr)."""
    from ipu_packing.train.cli import execution_main
    from ipu_packing.train.cli import main as train_main

    execution = call(execution_main, ["dry-run", "--config", config] + list(overrides))
    train = call(train_main, ["--config", config, "--dry-run"] + list(overrides))
    return execution, train


def console_scripts():
    """{name: "module:function"} from [project.scripts] (read as text: tomllib is Python >= 3.11)."""
    import re

    with open(os.path.join(REPO, "pyproject.toml")) as f:
        text = f.read()
    block = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+) = "([\w.:]+)"', block, flags=re.M))


# ---- run directories as compare reads them -----------------------------------------------------------------

def write_run(root, name, sequences, seconds, mlm_loss, batch=40):
    """A made-up run directory ROOT/NAME: metrics.jsonl with a step per (sequences, seconds, mlm_loss) and a
    config.json of global batch ``batch``."""
    import json

    path = os.path.join(str(root), name)
    os.makedirs(path)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for i, (s, t, loss) in enumerate(zip(sequences, seconds, mlm_loss)):
            f.write(json.dumps({"step": i + 1, "sequences": s, "tokens": 10 * s, "seconds": t, "mlm_loss": loss,
                                "mlm_accuracy": 0.1 * (i + 1), "nsp_accuracy": 0.5, "loss": loss + 0.7}) + "\n")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"training": {"global_batch_sequences": batch, "batch_accounting": "accumulation"}}, f)
    return path


# ---- machine-readable output, read as a standard JSON reader reads it --------------------------------------------

def strict_json(text):
    """json.loads that refuses NaN, Infinity and -Infinity (as a standard JSON reader does: jq, JavaScript)."""
    import json

    def refuse(name):
        raise AssertionError("non-standard JSON constant %s in %s" % (name, text[:200]))
    return json.loads(text, parse_constant=refuse)
