"""Where the config goes, counted: ``python tests/config_walk.py [TASK]``.

Runs the training entry's ``main`` in this process for one optimizer step of a tiny BERT (as tests/step_path.py
does: load -> one step -> checkpoint -> export), and watches every call into the package whose arguments hold the
parsed config or one of its sections (RunConfig, its section dataclasses, ExecutionConfig; ``self`` included, so
a config's own methods count). Each such call is a hand-off: a *stay* when the caller is in the same module, a
*climb* when it is in another; those where an argument other than ``self`` holds it (the config handed to another
function, not a config's own method or property) are also counted apart. Prints the counts and the functions and
modules the config reaches, then the modules by hand-offs. docs/architecture.md quotes the totals.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import sys
from typing import Dict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_TYPES = {"RunConfig", "ExecutionConfig", "TrainingConfig", "DataConfig", "OptimizerConfig", "ScheduleConfig",
                "CheckpointConfig", "LoggingConfig", "TaskConfig"}
"""The parsed config and its sections, by class name (the same names before and after the renovation)."""


def config_walk(task: str = "pretraining") -> Dict[str, object]:
    sys.path[:0] = [REPO, os.path.join(REPO, "tests")]
    import step_path

    argv, entry = step_path.command(task)
    package = os.path.join(REPO, "ipu_packing")
    counts = collections.Counter()  # type: collections.Counter
    functions = set()
    by_module = collections.Counter()  # type: collections.Counter

    def holds_config(frame) -> str:
        """"passed": an argument other than self holds the config or a section; "method": only self does; ""."""
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        held = [name for name in names if type(frame.f_locals.get(name)).__name__ in CONFIG_TYPES]
        return "" if not held else ("method" if held == ["self"] else "passed")

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(package) or code.co_name == "<module>":
            return
        how = holds_config(frame)
        if not how:
            return
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        where = "stays" if caller == code.co_filename else "climbs"
        counts["hand-offs"] += 1
        counts[where] += 1
        if how == "passed":
            counts["passed"] += 1
            counts["passed " + where] += 1
        functions.add((code.co_filename, code.co_name))
        by_module[os.path.relpath(code.co_filename, REPO)] += 1

    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = entry(argv)
    finally:
        sys.setprofile(None)
    if code != 0:
        raise SystemExit("the step's command failed (exit %s): %s" % (code, " ".join(argv)))
    return dict(counts, functions=len(functions), modules=len(by_module), by_module=by_module)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    task = args[0] if args else "pretraining"
    walk = config_walk(task)
    print("%s: %d hand-offs of the config (%d stays, %d climbs) through %d functions in %d modules; as an argument "
          "other than self: %d (%d stays, %d climbs)"
          % (task, walk["hand-offs"], walk["stays"], walk["climbs"], walk["functions"], walk["modules"],
             walk.get("passed", 0), walk.get("passed stays", 0), walk.get("passed climbs", 0)))
    for module, n in walk["by_module"].most_common():  # type: Tuple[str, int]
        print("  %4d  %s" % (n, module))
    return 0


if __name__ == "__main__":
    sys.exit(main())
