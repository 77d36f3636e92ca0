"""The house counted: ``python tests/house.py [REPO]`` (default: this checkout).

Prints the package's modules and lines per room, and for each task the modules outside its recipe (tasks/) and
outside bench/ that spell its name as a string, the modules outside bench/ whose text names the one task whose name
is no word of the prose, and the places that list all three tasks by name. These are the
counts docs/architecture.md quotes.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Dict, List

TASK_NAMES = ("pretraining", "classification", "question_answering")


def modules(repo: str) -> Dict[str, str]:
    """{path relative to the repository: text} of every module of the package."""
    out = {}
    for root, _, files in os.walk(os.path.join(repo, "ipu_packing")):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    out[os.path.relpath(path, repo)] = f.read()
    return dict(sorted(out.items()))


def rooms(mods: Dict[str, str]) -> Dict[str, List[int]]:
    """{room: [modules, lines]}: a room is a subpackage; modules at the top are the room "(top)"."""
    out: Dict[str, List[int]] = {}
    for path, text in mods.items():
        parts = path.split(os.sep)
        room = parts[1] if len(parts) > 2 else "(top)"
        entry = out.setdefault(room, [0, 0])
        entry[0] += 1
        entry[1] += text.count("\n")
    return out


def naming(mods: Dict[str, str], task: str) -> List[str]:
    """Modules outside tasks/ and bench/ that spell ``task`` as a string literal (the code, not its docs)."""
    pattern = re.compile(r"""["']%s["']""" % task)
    found = []
    for path, text in mods.items():
        inside = path.split(os.sep)[1] if path.count(os.sep) > 1 else ""
        if inside in ("tasks", "bench"):
            continue
        if pattern.search(_code(text)):
            found.append(path)
    return found


def mentions(mods: Dict[str, str], word: str) -> List[str]:
    """Modules outside bench/ whose text, docs included, holds ``word`` anywhere (a module name in an import, a
    method's name, a help text): a task's footprint where its name is no word of the prose ("question_answering";
    "pretraining" and "classification" are also words the docs use)."""
    return [path for path, text in mods.items() if word in text and os.sep + "bench" + os.sep not in path]


def task_lists(mods: Dict[str, str]) -> List[str]:
    """Lines that spell all three task names (a list of the tasks written out)."""
    out = []
    for path, text in mods.items():
        for i, line in enumerate(text.splitlines(), 1):
            if all(re.search(r"""["']%s["']""" % t, line) for t in TASK_NAMES):
                out.append("%s:%d" % (path, i))
    return out


def _code(text: str) -> str:
    """``text`` without its docstrings and comments (roughly: triple-quoted blocks and # to the line's end)."""
    text = re.sub(r'"""[\s\S]*?"""', "", text)
    return re.sub(r"#[^\n]*", "", text)


def main(argv: List[str]) -> int:
    repo = os.path.abspath(argv[0] if argv else os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    mods = modules(repo)
    total = rooms(mods)
    print("package: %d modules, %d lines" % (len(mods), sum(v[1] for v in total.values())))
    for room, (count, lines) in sorted(total.items()):
        print("  %-10s %3d modules %6d lines" % (room, count, lines))
    for task in TASK_NAMES:
        found = naming(mods, task)
        print("modules outside tasks/ and bench/ that name %r: %d" % (task, len(found)))
        for path in found:
            print("  " + path)
    found = mentions(mods, "question_answering")
    print("modules outside bench/ whose text, docs included, holds 'question_answering': %d" % len(found))
    for path in found:
        print("  " + path)
    lists = task_lists(mods)
    print("task lists written out: %d" % len(lists))
    for where in lists:
        print("  " + where)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
