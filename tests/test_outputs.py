"""Nothing of the user's overwritten (fsutil.check_output, the one rule of every output): an output is absent, a
regular file, or a directory that is empty or that this program made. predict's --output and a run directory
(checkpoint.output_dir) that is anything else (a FIFO, a device, a symlink, the input itself, the model directory
being read or a file in it, a model directory, a directory of the user's files, the dataset) is refused in one line
`error: ...`, exit status 2, before any work, and the path is left exactly as it was; so is every other command's
output (compare's and bench's --plot, the benches' --output and --workdir)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat

import pytest

import app_fixtures as fx
from ipu_packing import predict
from ipu_packing.train.cli import main as train_main

pytestmark = pytest.mark.usefixtures("one_thread")


def state_of(root):
    """{relative path: (kind, sha256 of a regular file's bytes, symlink target)} of ``root`` and everything under
    it, symlinks and special files not followed nor opened."""
    out = {}
    paths = [root]
    if os.path.isdir(root) and not os.path.islink(root):
        for base, dirs, files in os.walk(root):
            paths += [os.path.join(base, name) for name in dirs + files]
    for path in paths:
        if not os.path.lexists(path):
            out[path] = None
            continue
        info = os.lstat(path)
        digest = None
        if stat.S_ISREG(info.st_mode):
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
        out[os.path.relpath(path, root)] = (stat.S_IFMT(info.st_mode), digest, target)
    return out


def one_line(err, *words):
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A transformers classifier directory (random weights, its tokenizer): what predict serves."""
    root = tmp_path_factory.mktemp("outputs")
    return fx.hf_classifier(str(root / "model"), 2, "single_label_classification")


# -- predict --output ----------------------------------------------------------------------------------------


def _fifo(tmp_path, model, source):
    path = str(tmp_path / "out.jsonl")
    os.mkfifo(path)
    return path


def _device(tmp_path, model, source):
    path = str(tmp_path / "null")
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
    except (PermissionError, OSError):
        pytest.skip("cannot make a device node here")
    return path


def _symlink_out(tmp_path, model, source):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "precious.txt").write_text("precious\n")
    os.symlink(str(tmp_path / "elsewhere" / "precious.txt"), str(tmp_path / "out.jsonl"))
    return str(tmp_path / "out.jsonl")


def _the_input(tmp_path, model, source):
    return source


def _model_config(tmp_path, model, source):
    return os.path.join(model, "config.json")


def _new_file_in_model(tmp_path, model, source):
    return os.path.join(model, "predictions.jsonl")


def _a_directory(tmp_path, model, source):
    (tmp_path / "out").mkdir()
    return str(tmp_path / "out")


PREDICT_ROWS = [
    ("fifo", _fifo, "a FIFO"),
    ("device", _device, "a character device"),
    ("symlink-pointing-out", _symlink_out, "is a symlink"),
    ("the-input-itself", _the_input, "which this command reads"),
    ("the-models-config", _model_config, "which this command reads"),
    ("a-new-file-in-the-model-directory", _new_file_in_model, "is inside"),
    ("a-directory", _a_directory, "a directory"),
]


@pytest.mark.parametrize("name, make, words", PREDICT_ROWS, ids=[r[0] for r in PREDICT_ROWS])
def test_predict_refuses_an_output_it_must_not_replace(name, make, words, classifier, tmp_path, capsys, monkeypatch):
    model = str(tmp_path / "model")
    shutil.copytree(classifier, model)
    source = str(tmp_path / "inputs.tsv")
    with open(source, "w") as f:
        f.write("sentence1\nthe loop runs\n")
    output = make(tmp_path, model, source)
    before = state_of(str(tmp_path))
    calls = []
    monkeypatch.setattr(predict.Predictor, "from_pretrained", classmethod(lambda *a, **k: calls.append(a)))
    assert predict.main(["--model", model, "--input", source, "--output", output]) == 2
    one_line(capsys.readouterr()[1], "--output %s" % output, words)
    assert calls == []  # refused before any work
    assert state_of(str(tmp_path)) == before


def test_predict_replaces_its_own_earlier_output(classifier, tmp_path, capsys):
    source = str(tmp_path / "inputs.tsv")
    with open(source, "w") as f:
        f.write("sentence1\nthe loop runs\nmail server\n")
    output = str(tmp_path / "out.jsonl")
    with open(output, "w") as f:
        f.write("an earlier output\n")
    assert predict.main(["--model", classifier, "--input", source, "--output", output]) == 0
    assert [line.count('"index"') for line in open(output)] == [1, 1]


# -- checkpoint.output_dir -----------------------------------------------------------------------------------


def _hf_model_dir(tmp_path, data_dir, classifier):
    shutil.copytree(classifier, str(tmp_path / "run"))
    return str(tmp_path / "run")


def _users_files(tmp_path, data_dir, classifier):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"mine": true}\n')
    (run / "metrics.jsonl").write_text('{"step": 1, "mine": true}\n')
    (run / ".draft.tmp").write_text("my draft\n")
    return str(run)


def _symlink_to_empty_dir(tmp_path, data_dir, classifier):
    (tmp_path / "real").mkdir()
    os.symlink(str(tmp_path / "real"), str(tmp_path / "run"))
    return str(tmp_path / "run")


def _a_file(tmp_path, data_dir, classifier):
    (tmp_path / "run").write_text("mine\n")
    return str(tmp_path / "run")


def _the_dataset(tmp_path, data_dir, classifier):
    shutil.copytree(data_dir, str(tmp_path / "data"))
    return str(tmp_path / "data")


RUN_ROWS = [
    ("a-transformers-model-directory", _hf_model_dir, "not empty"),
    ("a-directory-of-the-users-files", _users_files, "not empty"),
    ("a-symlink-to-an-empty-directory", _symlink_to_empty_dir, "is a symlink"),
    ("a-file", _a_file, "not a directory"),
    ("the-dataset", _the_dataset, "which this command reads"),
]


@pytest.mark.parametrize("name, make, words", RUN_ROWS, ids=[r[0] for r in RUN_ROWS])
def test_a_run_refuses_an_output_dir_it_must_not_write_into(name, make, words, data_dir, classifier, tmp_path,
                                                            capsys):
    run = make(tmp_path, data_dir, classifier)
    data = str(tmp_path / "data") if name == "the-dataset" else data_dir
    before = state_of(str(tmp_path))
    code = train_main(fx.tiny_run_args(data, run, "training.steps=2"))
    one_line(capsys.readouterr()[1], "checkpoint.output_dir %s" % run, words)
    assert code == 2
    assert state_of(str(tmp_path)) == before


# -- every other command's outputs ---------------------------------------------------------------------------
# Each command that writes a file or directory the user names checks it by the same rule before any work: the work
# (the function each command's arguments name) is replaced by one that records its call, and must never be called.
# The other commands (ipu_packing.packing, bench.planner, --json everywhere) print only.


def _histogram(tmp_path):
    path = str(tmp_path / "hist.json")
    with open(path, "w") as f:
        f.write('{"histogram": [1, 2, 3, 4], "max_sequence_length": 8}')
    return path


def _compare(tmp_path, out):
    for name in ("a", "b"):
        os.makedirs(str(tmp_path / name), exist_ok=True)
    return "ipu_packing.compare", "read_run", [str(tmp_path / "a"), str(tmp_path / "b"), "--plot", out]


def _bench(tmp_path, out):
    return "ipu_packing.bench.cli", "run_bench", ["--histogram", _histogram(tmp_path), "--plot", out]


def _bench_config(tmp_path, out):
    return ("ipu_packing.bench.config_bench", "run_config_bench",
            ["--config", "demo", "--histogram", _histogram(tmp_path), "--plot", out])


def _convergence(tmp_path, out):
    os.makedirs(str(tmp_path / "data"), exist_ok=True)
    return "ipu_packing.bench.convergence", "one_run", ["--output", out, "data.dir=%s" % (tmp_path / "data")]


def _gpu_check(tmp_path, out):
    return "ipu_packing.bench.gpu_check", "check", ["--cpu", "--output", out, "--data", str(tmp_path / "data")]


def _prepare_scale(tmp_path, out):
    return "ipu_packing.bench.prepare_scale", "build_corpus", ["--mb", "1", "--workdir", out]


def _pack_existing(tmp_path, out):
    return "ipu_packing.bench.pack_existing", "write_vocab", ["--instances", "1", "--workdir", out]


COMMANDS = {  # the command's module (its main), its arguments, the option named, a file or a directory
    "compare --plot": ("ipu_packing.compare", _compare, "--plot", "file"),
    "bench --plot": ("ipu_packing.bench.cli", _bench, "--plot", "file"),
    "bench --config --plot": ("ipu_packing.bench.cli", _bench_config, "--plot", "file"),
    "bench.convergence --output": ("ipu_packing.bench.convergence", _convergence, "--output", "dir"),
    "bench.gpu_check --output": ("ipu_packing.bench.gpu_check", _gpu_check, "--output", "dir"),
    "bench.prepare_scale --workdir": ("ipu_packing.bench.prepare_scale", _prepare_scale, "--workdir", "dir"),
    "bench.pack_existing --workdir": ("ipu_packing.bench.pack_existing", _pack_existing, "--workdir", "dir"),
}


def _out_symlink(tmp_path, kind):
    target = tmp_path / "elsewhere"
    if kind == "dir":
        target.mkdir()
    else:
        target.write_text("precious\n")
    os.symlink(str(target), str(tmp_path / "out.png"))
    return str(tmp_path / "out.png")


def _out_fifo(tmp_path, kind):
    os.mkfifo(str(tmp_path / "out.png"))
    return str(tmp_path / "out.png")


def _out_file(tmp_path, kind):
    (tmp_path / "out.png").write_text("precious\n")
    return str(tmp_path / "out.png")


def _out_users_dir(tmp_path, kind):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine\n")
    return str(tmp_path / "out")


def _out_in_run(tmp_path, kind):
    return str(tmp_path / "a" / "plot.png")


def _out_histogram(tmp_path, kind):
    return str(tmp_path / "hist.json")


def _out_data(tmp_path, kind):
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "x").write_text("dataset\n")
    return str(tmp_path / "data")


OTHER_ROWS = [
    ("compare --plot", "symlink", _out_symlink, "is a symlink"),
    ("compare --plot", "fifo", _out_fifo, "a FIFO"),
    ("compare --plot", "inside-a-compared-run", _out_in_run, "which this command reads"),
    ("bench --plot", "symlink", _out_symlink, "is a symlink"),
    ("bench --plot", "fifo", _out_fifo, "a FIFO"),
    ("bench --plot", "the-histogram-itself", _out_histogram, "which this command reads"),
    ("bench --config --plot", "symlink", _out_symlink, "is a symlink"),
    ("bench --config --plot", "the-histogram-itself", _out_histogram, "which this command reads"),
    ("bench.convergence --output", "symlink", _out_symlink, "is a symlink"),
    ("bench.convergence --output", "fifo", _out_fifo, "a FIFO"),
    ("bench.convergence --output", "a-directory-of-the-users-files", _out_users_dir, "not empty"),
    ("bench.convergence --output", "the-dataset", _out_data, "which this command reads"),
    ("bench.gpu_check --output", "symlink", _out_symlink, "is a symlink"),
    ("bench.gpu_check --output", "fifo", _out_fifo, "a FIFO"),
    ("bench.gpu_check --output", "the-dataset", _out_data, "which this command reads"),
    ("bench.prepare_scale --workdir", "symlink", _out_symlink, "is a symlink"),
    ("bench.prepare_scale --workdir", "fifo", _out_fifo, "a FIFO"),
    ("bench.prepare_scale --workdir", "a-file", _out_file, "not a directory"),
    ("bench.pack_existing --workdir", "symlink", _out_symlink, "is a symlink"),
    ("bench.pack_existing --workdir", "fifo", _out_fifo, "a FIFO"),
    ("bench.pack_existing --workdir", "a-file", _out_file, "not a directory"),
]


@pytest.mark.parametrize("command, name, make, words", OTHER_ROWS, ids=["%s: %s" % r[:2] for r in OTHER_ROWS])
def test_every_command_refuses_an_output_it_must_not_replace(command, name, make, words, tmp_path, capsys,
                                                              monkeypatch):
    import importlib

    command_module, arguments, option, kind = COMMANDS[command]
    output = make(tmp_path, kind)
    module_name, work, argv = arguments(tmp_path, output)
    module = importlib.import_module(module_name)
    main = importlib.import_module(command_module).main
    calls = []

    def started(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("the work started")

    monkeypatch.setattr(module, work, started)
    before = state_of(str(tmp_path))
    code = main(argv)
    one_line(capsys.readouterr()[1], option, words)
    assert code == 2
    assert calls == []  # refused before any work
    assert state_of(str(tmp_path)) == before
