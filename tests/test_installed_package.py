"""Installed like a package: the shipped configs come from the checkout (recognised by its pyproject.toml) or
from the package's installed data, never from another package's site-packages/configs/ (train/loader.py
`_config_dir`); a missing optional extra is one line naming it (errors.require_extra); memory running out in
torch's allocators is one line (errors.describe_dependency_fault), while a bug's RuntimeError keeps its
traceback."""

from __future__ import annotations

import contextlib
import io
import os
import site
import sys

import pytest

from ipu_packing.errors import run_command
from ipu_packing.train import loader

PYPROJECT = '[build-system]\nrequires = ["setuptools"]\n\n[project]\nname = "%s"\nversion = "0.1.0"\n'


def _tree(tmp, files):
    for name, text in files.items():
        path = os.path.join(tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def config_dir(files, package, expected):
    """`_config_dir` with the package's loader.py at `package` (relative to tmp), sys.prefix at tmp/prefix and
    the user base at tmp/user; `expected` is the directory (relative to tmp) it must answer."""
    def row(tmp, monkeypatch):
        _tree(tmp, files)
        monkeypatch.setattr(loader, "__file__", os.path.join(tmp, package, "ipu_packing", "train", "loader.py"))
        monkeypatch.setattr(sys, "prefix", os.path.join(tmp, "prefix"))
        monkeypatch.setattr(site, "getuserbase", lambda: os.path.join(tmp, "user"), raising=False)
        monkeypatch.setattr(site, "USER_BASE", os.path.join(tmp, "user"), raising=False)
        got = os.path.relpath(loader._config_dir(), tmp)
        return "config dir %s" % got, "config dir %s" % expected
    return row


SITE = "prefix/lib/python3/site-packages"
SHARED = "prefix/share/ipu-packing/configs"
OTHERS = {SITE + "/configs/demo.yaml": "another package's demo\n"}


def missing_extra(module, run, extra, importers=()):
    """`run(tmp)` (a command's exit code) with `module` not importable: exit 2, one line naming the extra.
    ``importers`` are modules that import it, imported again (an earlier test in this process may hold them)."""
    def row(tmp, monkeypatch):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
        for name in [m for m in sys.modules for i in importers if m == i or m.startswith(i + ".")]:
            monkeypatch.delitem(sys.modules, name)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = run(tmp)
        return "exit %d: %s" % (code, err.getvalue().strip()), "pip install 'ipu-packing[%s]'" % extra
    return row


def _runs(tmp):
    import json

    paths = []
    for name in ("a", "b"):
        path = os.path.join(tmp, name)
        os.makedirs(path)
        with open(os.path.join(path, "metrics.jsonl"), "w") as f:
            for i in range(3):
                f.write(json.dumps({"step": i + 1, "sequences": 4, "tokens": 40, "seconds": 1.0, "mlm_loss": 5.0 - i,
                                    "mlm_accuracy": 0.1, "nsp_accuracy": 0.5}) + "\n")
        paths.append(path)
    return paths


def compare_plot(tmp):
    from ipu_packing.compare import main

    return main(_runs(tmp) + ["--plot", os.path.join(tmp, "plot.png")])


def pack(tmp, head):
    from ipu_packing.data.cli import main
    from ipu_packing.data.format import SPECIAL_TOKENS

    path = os.path.join(tmp, "input.bin")
    with open(path, "wb") as f:
        f.write(head + b"\0" * 64)
    vocab = os.path.join(tmp, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(list(SPECIAL_TOKENS) + ["w%d" % i for i in range(10)]) + "\n")
    return main(["pack", "--input", path, "--vocab", vocab, "--output", os.path.join(tmp, "out"), "--quiet"])


def tensorboard(tmp):
    from ipu_packing.errors import require_extra

    def main(argv):
        require_extra("torch.utils.tensorboard", "logging.tensorboard")
        return 0
    return run_command(main, [])


def raising(make):
    """`run_command` of a command that raises `make()`: its exit code and its one line (or the exception)."""
    def row(tmp, monkeypatch):
        def main(argv):
            raise make()
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                code = run_command(main, [])
        except RuntimeError as exc:
            return "traceback kept: %s" % exc, None
        return "exit %d: %s" % (code, err.getvalue().strip()), None
    return row


def _allocate_too_much():
    import torch

    try:
        torch.empty(1 << 50, dtype=torch.uint8)  # 1 PiB: refused by the allocator before any page is touched
    except RuntimeError as exc:
        return exc
    pytest.skip("this machine allocated 1 PiB")


def _cuda_out_of_memory():
    import torch

    kind = getattr(torch.cuda, "OutOfMemoryError", None)
    if kind is None:
        pytest.skip("torch %s has no torch.cuda.OutOfMemoryError" % torch.__version__)
    return kind("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 15.78 GiB total capacity)")


ROWS = [
    ("another-packages-configs-beside-an-installed-package",
     config_dir(dict(OTHERS, **{SHARED + "/demo.yaml": "ours\n"}), SITE, SHARED), None),
    ("another-packages-configs-and-ours-missing", config_dir(OTHERS, SITE, SHARED), None),
    ("a-parent-project-vendoring-the-package",
     config_dir({"vendor/pyproject.toml": PYPROJECT % "other-project", "vendor/configs/demo.yaml": "theirs\n",
                 SHARED + "/demo.yaml": "ours\n"}, "vendor", SHARED), None),
    ("configs-without-a-pyproject", config_dir({"unpacked/configs/demo.yaml": "whose?\n"}, "unpacked", SHARED), None),
    ("ipu-packing-named-outside-project",
     config_dir({"x/pyproject.toml": '[tool.x]\nname = "ipu-packing"\n\n[project]\nname = "x"\n',
                 "x/configs/demo.yaml": "x's\n"}, "x", SHARED), None),
    ("a-user-install", config_dir({"user/share/ipu-packing/configs/demo.yaml": "ours\n"}, "user/lib/site-packages",
                                  "user/share/ipu-packing/configs"), None),
    ("the-checkout", config_dir({"repo/pyproject.toml": PYPROJECT % "ipu-packing", "repo/configs/demo.yaml": "ours\n"},
                                "repo", "repo/configs"), None),
    ("compare-plot-without-matplotlib", missing_extra("matplotlib", compare_plot, "plots"), None),
    ("pack-tfrecord-without-crc32c", missing_extra("crc32c", lambda tmp: pack(tmp, b"\x10\0\0\0"), "data"), None),
    ("pack-hdf5-without-h5py", missing_extra("h5py", lambda tmp: pack(tmp, b"\x89HDF\r\n\x1a\n"), "data"), None),
    ("tensorboard-missing", missing_extra("tensorboard", tensorboard, "tensorboard", ["torch.utils.tensorboard"]), None),
    ("cpu-allocator-out-of-memory", raising(lambda: RuntimeError(
        "[enforce fail at alloc_cpu.cpp:83] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
        "68719476736 bytes. Error code 12 (Cannot allocate memory)")), "exit 2: error: out of memory"),
    ("a-real-allocation-past-memory", raising(_allocate_too_much), "exit 2: error: out of memory"),
    ("cuda-out-of-memory", raising(_cuda_out_of_memory), "exit 2: error: out of memory: CUDA out of memory"),
    ("a-bug-keeps-its-traceback", raising(lambda: RuntimeError("shape mismatch in our own code")), "traceback kept"),
]


@pytest.mark.parametrize("name, row, words", ROWS, ids=[r[0] for r in ROWS])
def test_installed_like_a_package(name, row, words, tmp_path, monkeypatch):
    got, wanted = row(str(tmp_path), monkeypatch)
    wanted = words or wanted
    assert wanted in got, got
    assert got.count("\n") == 0, got
