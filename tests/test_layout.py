"""The package's layout, counted from its source (ast, nothing imported):

- no import running up a floor: the rooms are floors, each importing only from itself and the floors below it
  (FLOORS: the top-level helpers, packing, data, model, execution, train, then bench and compare); an entry point
  (``__main__.py``) stands above them all;
- no two modules in different rooms share a file name, but for the names that mean the same thing in every room
  (SHARED_NAMES: a package, its ``python -m`` entry point, its command line);
- no private name (one leading underscore, not a dunder) of an ipu_packing module used in another module:
  imported (``from .x import _name``) or reached as an attribute (``x._name``, x an imported module);
- no import circle among ipu_packing modules: module-level imports (``import`` statements outside any
  function or class, those under a top-level ``if``/``try`` included), and, counted apart, the same with
  the lazy imports inside functions added. An edge goes to the module named (``from .pkg import mod``: to
  pkg.mod when mod is a module, else to pkg's __init__); the implicit import of a package's __init__
  before its submodules is not an edge.

``python tests/test_layout.py`` prints the counts and what they count.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
from typing import Dict, List, Set, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "ipu_packing")
FLOORS = {"": 0, "tasks": 0, "packing": 1, "data": 2, "model": 3, "execution": 4, "train": 5, "bench": 6,
          "compare": 6, "predict": 6}
"""The floor of each room (the second part of a module's dotted name; "" for the top-level helpers: errors,
signals, fsutil, jsonin, jsonout). The tasks stand on the ground floor beside them: every floor reads them, and
they name the code of higher floors only as hooks (tasks/spec.py)."""
SHARED_NAMES = ("__init__.py", "__main__.py", "cli.py")


def modules() -> Dict[str, str]:
    """{dotted name: path} of every module of the package (a package is its __init__)."""
    out = {}
    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for name in sorted(files):
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(root, name), REPO)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(root, name)
    return out


MODULES = modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, "").endswith("__init__.py")


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute name of ``from <node.module> import ...`` written in `module`."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, tree: ast.Module, lazy: bool) -> List[Tuple[str, List[str], ast.AST]]:
    """[(imported module, names imported from it, node)] of the package's own modules."""
    found = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom) and (top or lazy):
                source = _resolve(module, child)
                if source == "ipu_packing" or source.startswith("ipu_packing."):
                    found.append((source, [a.name for a in child.names], child))
            elif isinstance(child, ast.Import) and (top or lazy):
                for alias in child.names:
                    if alias.name.startswith("ipu_packing"):
                        found.append((alias.name, [], child))
            visit(child, inner)

    visit(tree, True)
    return found


def _trees() -> Dict[str, ast.Module]:
    trees = {}
    for name, path in MODULES.items():
        with open(path, encoding="utf-8") as f:
            trees[name] = ast.parse(f.read(), path)
    return trees


TREES = _trees()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS[parts[1] if len(parts) > 1 and parts[1] in FLOORS else ""] if len(parts) > 1 else 0


def upward_imports(graph: Dict[str, Set[str]]) -> List[Tuple[str, str]]:
    """(importer, imported) where the importer's floor is below the imported module's; entry points excepted."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if floor(b) > floor(a) and not MODULES[a].endswith("__main__.py"))


def shared_names() -> Dict[str, List[str]]:
    """{file name: [modules]} of the file names that more than one room uses (SHARED_NAMES excepted)."""
    rooms: Dict[str, List[str]] = {}
    for name, path in MODULES.items():
        base = os.path.basename(path)
        if base not in SHARED_NAMES:
            rooms.setdefault(base, []).append(name)
    return {base: sorted(names) for base, names in sorted(rooms.items()) if len(names) > 1}


def module_lines() -> List[Tuple[str, int]]:
    out = []
    for name, path in MODULES.items():
        with open(path, encoding="utf-8") as f:
            out.append((name, sum(1 for _ in f)))
    return sorted(out, key=lambda item: -item[1])


def private_uses() -> List[str]:
    """'module: name from other' for every private name of one package module used in another."""
    out = []
    for module, tree in TREES.items():
        aliases: Dict[str, str] = {}  # local name -> package module it is bound to
        for source, names, node in _imports(module, tree, lazy=True):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                continue
            for alias in node.names:
                target = source + "." + alias.name
                if target in MODULES:  # a module imported by name
                    aliases[alias.asname or alias.name] = target
                elif _private(alias.name) and source != module:
                    out.append("%s: %s from %s" % (module, alias.name, source))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and _private(node.attr) and aliases[node.value.id] != module):
                out.append("%s: %s.%s" % (module, aliases[node.value.id], node.attr))
    return sorted(set(out))


def import_graph(lazy: bool) -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {name: set() for name in MODULES}
    for module, tree in TREES.items():
        for source, names, node in _imports(module, tree, lazy):
            targets = [source + "." + n for n in names if source + "." + n in MODULES]
            if len(targets) < len(names) or not names:  # some names are not modules: the source itself
                targets.append(source)
            graph[module].update(t for t in targets if t in MODULES and t != module)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


def test_packages_import():
    for name in ("packing", "data", "model", "execution", "train", "bench"):
        mod = importlib.import_module("ipu_packing." + name)
        assert mod.__name__ == "ipu_packing." + name


def test_the_checker_sees_the_package():
    assert len(MODULES) > 70
    assert "ipu_packing.data.format" in MODULES and "ipu_packing.bench" in MODULES
    assert "ipu_packing.data.format" in import_graph(lazy=False)["ipu_packing.data.dataset"]


def test_the_checks_find_what_they_count(tmp_path):
    """The counters on a toy graph and a toy private import: they can fail."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("from .format import _secret, public\nfrom . import format\nformat._other\n")
    TREES["ipu_packing.data.toy"] = tree
    MODULES["ipu_packing.data.toy"] = str(tmp_path / "toy.py")
    try:
        found = [u for u in private_uses() if u.startswith("ipu_packing.data.toy")]
    finally:
        del TREES["ipu_packing.data.toy"], MODULES["ipu_packing.data.toy"]
    assert found == ["ipu_packing.data.toy: _secret from ipu_packing.data.format",
                     "ipu_packing.data.toy: ipu_packing.data.format._other"]


def test_no_import_runs_up_a_floor():
    assert upward_imports(import_graph(lazy=True)) == []


def test_the_floor_check_finds_an_upward_import():
    graph = {"ipu_packing.data.format": {"ipu_packing.train.loop"}, "ipu_packing.train.loop": {"ipu_packing.data"}}
    assert upward_imports(graph) == [("ipu_packing.data.format", "ipu_packing.train.loop")]


def test_no_two_rooms_share_a_module_name():
    assert shared_names() == {}


def test_no_private_name_is_used_outside_its_module():
    assert private_uses() == []


def test_no_import_circle_at_module_level():
    assert cycles(import_graph(lazy=False)) == []


def test_no_import_circle_with_the_lazy_imports():
    assert cycles(import_graph(lazy=True)) == []


def test_no_test_module_imports_another():
    """Shared fixtures live in conftest.py and the support modules (app_fixtures, ...), never in a test module:
    no module of tests/ (test or support) imports a test module."""
    tests = os.path.dirname(os.path.abspath(__file__))
    found = []
    for name in sorted(os.listdir(tests)):
        if name.endswith(".py"):
            with open(os.path.join(tests, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("test_"):
                    found.append("%s: %s" % (name, node.module))
                elif isinstance(node, ast.Import):
                    found += ["%s: %s" % (name, a.name) for a in node.names if a.name.startswith("test_")]
    assert found == []


if __name__ == "__main__":
    print("modules: %d (longest: %s)" % (len(MODULES), ", ".join("%s %d" % item for item in module_lines()[:5])))
    print("file names shared across rooms: %d %s" % (len(shared_names()), shared_names()))
    print("imports running up a floor: %d %s" % (len(upward_imports(import_graph(True))),
                                                  upward_imports(import_graph(True))))
    print("private names used across modules: %d" % len(private_uses()))
    for use in private_uses():
        print("  " + use)
    for lazy in (False, True):
        found = cycles(import_graph(lazy))
        print("import circles (%s): %d" % ("lazy imports included" if lazy else "module level", len(found)))
        for component in found:
            print("  " + " <-> ".join(component))
