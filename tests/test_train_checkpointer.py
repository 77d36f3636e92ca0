"""The checkpointer (train/checkpointer.py) is the one owner of resuming, saving, the export and the lock: no other
module of the package calls the run directory's methods for them."""

from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OWNED = ("lock", "unlock", "save", "resume_point", "finished", "export", "prepare", "record_forced")
"""RunDirectory's methods that only the checkpointer calls."""


def callers(package: str, names=OWNED):
    """{module path: sorted method names} of every module of ``package`` that calls ``<x>.run_dir.<name>(...)``,
    ``run_dir.<name>(...)`` or ``self.run_dir.<name>(...)`` for a name in ``names``."""
    found = {}
    for root, _, files in os.walk(package):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(root, file)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
                    owner = node.func.value
                    owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                    if owner_name == "run_dir":
                        found.setdefault(os.path.relpath(path, REPO), set()).add(node.func.attr)
    return {path: sorted(names) for path, names in found.items()}


def test_only_the_checkpointer_locks_resumes_saves_and_exports():
    assert callers(os.path.join(REPO, "ipu_packing")) == {
        os.path.join("ipu_packing", "train", "checkpointer.py"): sorted(OWNED)}


def test_the_owner_check_finds_a_second_caller(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "loop.py").write_text("def f(plan):\n    plan.run_dir.lock()\n    run_dir.save(1, 2)\n")
    assert callers(str(package)) == {os.path.relpath(str(package / "loop.py"), REPO): ["lock", "save"]}
