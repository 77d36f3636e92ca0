"""Poplar SDK compatibility: everything in ipu_packing/ and run_pretraining.py must run on Python 3.8.

The last Poplar SDK ships Python 3.8 with torch 2.0.1 and transformers 4.x. vermin checks the Python side
statically with target 3.8 (syntax, standard-library modules, functions and keyword arguments).

Annotations: under ``from __future__ import annotations`` they are never evaluated, so ``list[int]`` or
``int | None`` there is fine on 3.8 and vermin is run without --eval-annotations. A file without that import
evaluates its annotations at import time, so it is checked with --eval-annotations. (Code that evaluates
annotations itself, e.g. typing.get_type_hints on a config dataclass, must keep them 3.8-valid: use
typing.List / typing.Optional there.)

Opt-outs, for code that only ever runs on newer Python behind a lazy import or version check:
- a ``# novm`` (or ``# novermin``) comment on the line, vermin's own mechanism; or
- an entry in ``EXCLUDED`` below: a path relative to the repository root and the reason.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from typing import Dict, List

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = "3.8-"

EXCLUDED: Dict[str, str] = {
    # "ipu_packing/some/module.py": "why it never runs on Python 3.8 (lazily imported behind ...)",
}


def python_files() -> List[str]:
    """ipu_packing/**/*.py and run_pretraining.py (when present), minus EXCLUDED; paths relative to ROOT."""
    found = []
    for directory, subdirectories, files in os.walk(os.path.join(ROOT, "ipu_packing")):
        subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
        found.extend(
            os.path.relpath(os.path.join(directory, name), ROOT) for name in sorted(files) if name.endswith(".py")
        )
    if os.path.isfile(os.path.join(ROOT, "run_pretraining.py")):
        found.append("run_pretraining.py")
    return [path.replace(os.sep, "/") for path in found if path.replace(os.sep, "/") not in EXCLUDED]


def postpones_annotations(path: str) -> bool:
    with open(os.path.join(ROOT, path), "r", encoding="utf-8") as handle:
        return "from __future__ import annotations" in handle.read()


def vermin(paths: List[str], eval_annotations: bool, cwd: str = ROOT) -> subprocess.CompletedProcess:
    """Run the vermin CLI's main() over paths, in this process (its argv and cwd set for the call, its output
    captured, stderr with stdout); returncode 0 means every target is met."""
    from vermin import main

    args = ["-t=%s" % TARGET, "--violations", "--no-tips", "--processes=1"]
    if eval_annotations:
        args.append("--eval-annotations")
    argv, here, output = sys.argv, os.getcwd(), io.StringIO()
    try:
        sys.argv = ["vermin"] + args + paths
        os.chdir(cwd)
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            try:
                code = main()
            except SystemExit as stop:
                code = stop.code
    finally:
        sys.argv = argv
        os.chdir(here)
    return subprocess.CompletedProcess(sys.argv, code or 0, output.getvalue())


def test_package_runs_on_python_38():
    pytest.importorskip("vermin")
    files = python_files()
    assert "ipu_packing/model/modeling.py" in files and "ipu_packing/__init__.py" in files
    for stale in EXCLUDED:
        assert os.path.isfile(os.path.join(ROOT, stale)), "EXCLUDED names a missing file: %s" % stale
    postponed = [path for path in files if postpones_annotations(path)]
    evaluated = [path for path in files if path not in postponed]
    for group, eval_annotations in ((postponed, False), (evaluated, True)):
        if group:
            result = vermin(group, eval_annotations)
            assert result.returncode == 0, "not Python %s compatible:\n%s" % (TARGET, result.stdout)


def test_checker_catches_violations_and_honours_novm(tmp_path):
    """The check can fail: 3.9+ code is reported, the same code marked # novm is not."""
    pytest.importorskip("vermin")
    (tmp_path / "new.py").write_text("a = {} | {}\nb = 'xy'.removeprefix('x')\n")
    (tmp_path / "optout.py").write_text("a = {} | {}  # novm\n")
    (tmp_path / "annotated.py").write_text("def f(x: list[int]) -> None:\n    pass\n")
    (tmp_path / "postponed.py").write_text(
        "from __future__ import annotations\n\n\ndef f(x: list[int]) -> int | None:\n    pass\n"
    )
    reported = vermin(["new.py"], eval_annotations=False, cwd=str(tmp_path))
    assert reported.returncode != 0 and "dict union" in reported.stdout and "removeprefix" in reported.stdout
    assert vermin(["optout.py"], eval_annotations=False, cwd=str(tmp_path)).returncode == 0
    assert vermin(["annotated.py"], eval_annotations=True, cwd=str(tmp_path)).returncode != 0
    assert vermin(["postponed.py"], eval_annotations=False, cwd=str(tmp_path)).returncode == 0


def test_package_parses_with_the_python_38_grammar():
    """A second, independent look: Python's own parser restricted to the 3.8 grammar (match, except*, ...)."""
    import ast

    for path in python_files():
        with open(os.path.join(ROOT, path), "r", encoding="utf-8") as handle:
            source = handle.read()
        try:
            ast.parse(source, filename=path, feature_version=(3, 8))
        except SyntaxError as error:  # pragma: no cover - the failure message is the point
            pytest.fail("%s:%s is not Python 3.8 syntax: %s" % (path, error.lineno, error.msg))
    with pytest.raises(SyntaxError):  # and it can fail
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 8))
