"""Entry points are safe to re-import: a child started by multiprocessing's forkserver or spawn (PopTorch's
asynchronous DataLoader starts its worker so) imports the parent's __main__ again, as __mp_main__, before it
unpickles its task (multiprocessing/spawn.py prepare: _fixup_main_from_path for a script,
_fixup_main_from_name for ``python -m module``). An entry point that runs its command at import runs it
again in every such child.

- Static: every entry point (run_pretraining.py, each module with a ``__main__`` guard, each __main__.py)
  does nothing at import but imports, definitions and assignments; the command is behind
  ``if __name__ == "__main__":`` (run_pretraining.py keeps its imports there too).
- Dynamic: each entry point that multiprocessing re-imports (a script, a ``-m`` module; not a package's
  __main__.py, see the controls) is started as users start it (``python run_pretraining.py``,
  ``python -m ...``) with a probe (a sitecustomize on PYTHONPATH) that, when the command parses its
  arguments, starts a forkserver child (PopTorch's default) and stops the command. The child reports which
  __main__ it imported, or that the command ran in it (the probe sees it parse arguments) and exits 3.
- Controls, with a forkserver and a spawn child each (both run spawn.prepare): an unguarded script and an
  unguarded ``-m`` module do run again in both children; an unguarded package __main__.py does not,
  because multiprocessing never re-imports a module named ``__main__`` or ``*.__main__`` (spawn.py
  _fixup_main_from_name), on Python 3.8 as on 3.11. The old run_pretraining.py under the PopTorch stand-in:
  test_an_unguarded_run_pretraining_fails_under_the_stand_in.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import subprocess
import sys
import threading

import pytest

import app_fixtures as fx
import poptorch_stand_in as si

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNGUARDED_RUN_PRETRAINING = '''"""The entry point as it was: the command at module level."""

import sys

from ipu_packing.train.cli import main

sys.exit(main())
'''
# how each entry point is started (README, docs): a path, or -m NAME
ENTRY_POINTS = {
    "run_pretraining.py": ["run_pretraining.py"],
    "ipu_packing/bench/__main__.py": ["-m", "ipu_packing.bench"],
    "ipu_packing/bench/convergence.py": ["-m", "ipu_packing.bench.convergence"],
    "ipu_packing/bench/gpu_check.py": ["-m", "ipu_packing.bench.gpu_check"],
    "ipu_packing/compare.py": ["-m", "ipu_packing.compare"],
    "ipu_packing/predict.py": ["-m", "ipu_packing.predict"],
    "run_finetuning.py": ["run_finetuning.py"],
    "ipu_packing/bench/planner.py": ["-m", "ipu_packing.bench.planner"],
    "ipu_packing/bench/prepare_scale.py": ["-m", "ipu_packing.bench.prepare_scale"],
    "ipu_packing/bench/pack_existing.py": ["-m", "ipu_packing.bench.pack_existing"],
    "ipu_packing/data/__main__.py": ["-m", "ipu_packing.data"],
    "ipu_packing/execution/__main__.py": ["-m", "ipu_packing.execution"],
    "ipu_packing/packing/__main__.py": ["-m", "ipu_packing.packing"],
}
NOT_GUARDED_YET = {}  # path: why (none left)

PROBE = r'''
"""Test probe (tests/test_entry_points.py): the first time the command parses its arguments, start a child
with each start method asked for, record what they report, and stop the command."""
import argparse
import json
import os
import sys

_LOG = os.environ["ENTRY_POINT_PROBE_LOG"]
_METHODS = os.environ["ENTRY_POINT_PROBE_METHODS"].split(",")
_parse = argparse.ArgumentParser.parse_known_args


def _record(**line):
    with open(_LOG, "a") as f:
        f.write(json.dumps(line) + "\n")


def _child(method):
    main = sys.modules.get("__main__")
    _record(role="child", method=method, main_name=getattr(main, "__name__", None),
            main_file=getattr(main, "__file__", None))


def parse_known_args(self, *args, **kwargs):
    import multiprocessing

    if os.environ.get("ENTRY_POINT_PROBE_ROLE") == "child":  # the command runs in a child: it was re-run
        _record(role="rerun", pid=os.getpid())
        os._exit(3)
    os.environ["ENTRY_POINT_PROBE_ROLE"] = "child"
    children = {m: multiprocessing.get_context(m).Process(target=_child, args=(m,)) for m in _METHODS}
    for child in children.values():
        child.start()
    for child in children.values():
        child.join(300)
    _record(role="parent", exitcodes={m: c.exitcode for m, c in children.items()})
    sys.stdout.flush()
    os._exit(0)


argparse.ArgumentParser.parse_known_args = parse_known_args
'''


def _entry_point_files():
    """run_pretraining.py and every file of ipu_packing/ that is run as a command: a __main__.py, a module
    with an ``if __name__ == "__main__":`` block, or one that calls sys.exit at module level."""
    found = {"run_pretraining.py", "run_finetuning.py"}
    for directory, _, names in os.walk(os.path.join(REPO, "ipu_packing")):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            with open(path, "r", encoding="utf-8") as f:
                text = f.read()
            if name == "__main__.py" or "__main__" in text or "sys.exit(" in text:
                found.add(os.path.relpath(path, REPO).replace(os.sep, "/"))
    return found


def _is_guard(node) -> bool:
    guard = ast.parse('__name__ == "__main__"').body[0].value
    return isinstance(node, ast.If) and ast.dump(node.test) == ast.dump(guard)


def _work_at_import(path: str):
    """Module-level statements of ``path`` that do something when it is imported: any statement but a
    docstring, an import, a definition, an assignment or the __main__ guard; in run_pretraining.py imports of
    the package too (they belong behind the guard: a worker has no use for the command's modules)."""
    with open(os.path.join(REPO, path), "r", encoding="utf-8") as f:
        source = f.read()
    work = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # the module's docstring, or an attribute's
        if _is_guard(node) or isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
                path == "run_pretraining.py" and "ipu_packing" in ast.dump(node)):
            continue
        work.append("line %d: %s" % (node.lineno, ast.get_source_segment(source, node)))
    return work


def test_every_entry_point_is_listed():
    assert _entry_point_files() == set(ENTRY_POINTS)


@pytest.mark.parametrize("path", sorted(ENTRY_POINTS))
def test_an_entry_point_does_nothing_at_import_but_define(path):
    work = _work_at_import(path)
    if path in NOT_GUARDED_YET:
        assert work, "%s is guarded now: remove it from NOT_GUARDED_YET" % path
        return
    assert work == []


def test_the_static_check_sees_an_unguarded_entry_point(tmp_path, monkeypatch):
    (tmp_path / "run_pretraining.py").write_text(UNGUARDED_RUN_PRETRAINING)
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    assert _work_at_import("run_pretraining.py") == [
        "line 5: from ipu_packing.train.cli import main", "line 7: sys.exit(main())"]


def _probe(tmp_path, name: str, argv, cwd: str, pythonpath=(), methods=("forkserver",)):
    """Start ``python ARGV --help`` with the probe; what the parent and its children recorded."""
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir(exist_ok=True)
    # Written whole, by a rename: _in_pairs runs two probes at once, and the interpreters of the other one (its
    # command, its forkserver) import this file at their start. Rewritten in place, a forkserver could read it
    # truncated; its child then fails to unpickle _child ("Can't get attribute '_child' on <module
    # 'sitecustomize'>") and exits 1.
    staged = probe_dir / ("sitecustomize.%d.%d.tmp" % (os.getpid(), threading.get_ident()))
    staged.write_text(PROBE)
    os.replace(str(staged), str(probe_dir / "sitecustomize.py"))
    log = str(tmp_path / ("%s.jsonl" % name.replace("/", "_")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTRY_POINT_PROBE")}
    env.update(ENTRY_POINT_PROBE_LOG=log, ENTRY_POINT_PROBE_METHODS=",".join(methods), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(probe_dir)] + list(pythonpath) + [REPO]))
    proc = subprocess.run([sys.executable] + list(argv) + ["--help"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    lines = []
    if os.path.exists(log):  # no log: the probe never ran in the command (its stderr says why)
        with open(log, "r") as f:
            lines = [json.loads(line) for line in f]
    return proc, lines


def _children(lines):
    return {line["method"]: line for line in lines if line["role"] == "child"}


def _in_pairs(jobs):
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(lambda job: jobs[job](), jobs)))


@pytest.mark.slow
@pytest.mark.serial
def test_each_entry_point_s_forkserver_child_does_not_run_its_command(tmp_path):
    results = _in_pairs({path: (lambda path=path, argv=argv: _probe(tmp_path, path, argv, REPO))
                         for path, argv in ENTRY_POINTS.items() if not path.endswith("__main__.py")})
    assert len(results) == 9  # scripts and -m modules; a package __main__.py (bench, data, ...) is never re-imported
    for path, (proc, lines) in results.items():
        assert proc.returncode == 0, (path, proc.stderr[-2000:])
        assert [line for line in lines if line["role"] == "parent"] == [
            {"role": "parent", "exitcodes": {"forkserver": 0}}], (path, lines, proc.stderr[-3000:])
        assert [line for line in lines if line["role"] == "rerun"] == [], path
        children = _children(lines)
        assert sorted(children) == ["forkserver"], (path, lines)
        (child,) = children.values()  # it imported the entry point again, as __mp_main__; the command did not run
        assert child["main_name"] == "__mp_main__", (path, child)
        assert child["main_file"] == os.path.join(REPO, path), (path, child)


@pytest.mark.serial
def test_unguarded_entry_points_do_run_again_in_the_children(tmp_path):
    command = "import argparse\nargparse.ArgumentParser().parse_args()\n"  # a command at module level
    (tmp_path / "script.py").write_text(command)
    package = tmp_path / "probed_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "command.py").write_text(command)
    (package / "__main__.py").write_text(command)
    both, here = ("forkserver", "spawn"), str(tmp_path)
    results = _in_pairs({
        "script": lambda: _probe(tmp_path, "script", [str(tmp_path / "script.py")], here, methods=both),
        "module": lambda: _probe(tmp_path, "module", ["-m", "probed_package.command"], here, [here], both),
        "package": lambda: _probe(tmp_path, "package", ["-m", "probed_package"], here, [here], both),
    })
    for kind in ("script", "module"):  # the command ran again in both children, which never reached their task
        proc, lines = results[kind]
        assert proc.returncode == 0, (kind, proc.stderr[-2000:])
        # a child's exception (exit 1) is printed on the command's stderr: shown when this fails
        assert [line["exitcodes"] for line in lines if line["role"] == "parent"] == [{"forkserver": 3, "spawn": 3}], (
            kind, lines, proc.stderr[-3000:])
        assert len([line for line in lines if line["role"] == "rerun"]) == 2 and _children(lines) == {}, kind
    proc, lines = results["package"]  # python -m PACKAGE: its __main__.py is not re-imported
    assert [line["exitcodes"] for line in lines if line["role"] == "parent"] == [{"forkserver": 0, "spawn": 0}]
    children = _children(lines)
    assert sorted(children) == ["forkserver", "spawn"]
    assert {(c["main_name"], c["main_file"]) for c in children.values()} == {("__main__", None)}


@pytest.mark.slow
@pytest.mark.serial
def test_an_unguarded_run_pretraining_fails_under_the_stand_in(tmp_path):
    """The old entry point, a training run of a shipped IPU config under the PopTorch stand-in: the loader's
    forkserver child runs the command again, meets the run lock its parent holds, and exits; the parent gets
    PopTorch's error. (The same run from the guarded run_pretraining.py trains: test_ipu_configs_run.py.)"""
    data = fx.write_prepared(str(tmp_path / "data"), S=32, K=3, V=64, num_sequences=200, seed=0)
    (tmp_path / "run_pretraining.py").write_text(UNGUARDED_RUN_PRETRAINING)
    run = str(tmp_path / "run")
    overrides = ["model.hidden_size=16", "model.num_attention_heads=2", "model.intermediate_size=32",
                 "model.vocab_size=64", "model.num_hidden_layers=4", "execution.layers_per_ipu=[1,1,1,1]",
                 "execution.precision=fp32", "data.max_seq_length=32", "data.dir=%s" % data,
                 "training.global_batch_sequences=144", "training.steps=1", "checkpoint.output_dir=%s" % run,
                 "logging.progress_bar=false", "logging.tensorboard=false", "checkpoint.export=false"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([si.STAND_IN_DIR, REPO]), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(tmp_path / "run_pretraining.py"), "--config", "bert_large_512_pod16"]
                            + overrides, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]
    # the child's run, refused by the lock of the parent's (one line, the run_command convention) ...
    refused = "error: run directory %s is in use by pid %d on " % (run, proc.pid)
    assert [line for line in err.splitlines() if line.startswith("error:")][0].startswith(refused), err[-3000:]
    # ... and the parent: its loader's worker never started
    assert err.rstrip().splitlines()[-1] == (
        "poptorch.Error: 'poptorch_py_error': AsynchronousDataAccessor worker thread failed to start "
        "(Check above for details)")
    assert not os.path.exists(os.path.join(run, "checkpoints"))
