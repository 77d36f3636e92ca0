"""Durable replacement: old content or all of the new, fsync of the file and of its directory; a name read from a
file becomes a path only inside its directory (contained_path)."""

import os
import stat

import pytest

from ipu_packing import fsutil
from ipu_packing.errors import InputError
from ipu_packing.fsutil import contained_path


def test_replace_is_all_or_nothing(tmp_path):
    path = str(tmp_path / "manifest.json")
    fsutil.atomic_write_text(path, "old")
    with pytest.raises(RuntimeError):
        with fsutil.atomic_open(path, "w", encoding="utf-8") as f:
            f.write("half of the new")
            raise RuntimeError("killed mid-write")
    assert open(path).read() == "old"
    assert os.listdir(str(tmp_path)) == ["manifest.json"]  # no temporary left
    fsutil.atomic_write_bytes(path, b"new")
    assert open(path, "rb").read() == b"new"


@pytest.fixture
def synced(monkeypatch):
    """For every os.fsync call, whether its descriptor was a directory."""
    calls = []
    real = os.fsync

    def record(fd):
        calls.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return calls


def test_file_and_directory_are_fsynced(tmp_path, synced):
    fsutil.atomic_write_text(str(tmp_path / "a.txt"), "x")
    assert synced == [False, True]  # the data, then the directory entry


def test_stale_temporaries_are_removed(tmp_path):
    for name in (".step_0000010.pt.abc123.tmp", ".manifest.json.x.tmp", "keep.tmp", "step_0000010.pt"):
        (tmp_path / name).write_text("")
    assert fsutil.remove_stale_temporaries(str(tmp_path)) == 2
    assert sorted(os.listdir(str(tmp_path))) == ["keep.tmp", "step_0000010.pt"]


def test_fsync_tree_syncs_every_file_and_directory(tmp_path, synced):
    (tmp_path / "packed").mkdir()
    for name in ("packed/shard-00000.npy", "packed/manifest.json", "top.txt"):
        (tmp_path / name).write_text("x")
    del synced[:]  # only what fsync_tree does
    fsutil.fsync_tree(str(tmp_path))
    assert sorted(synced) == [False, False, False, True, True]


# -- paths inside files stay inside their directory ----------------------------------------------------------------
# fsutil.contained_path(root, name), the one place a name read from a file becomes a path: it refuses a non-string
# or empty name, a NUL, an absolute path, a `..` that climbs out, and a name whose real path (symlinks resolved)
# leaves the root's real path.

@pytest.fixture()
def tree(tmp_path):
    """tmp/root/{a.txt, sub/b.txt, in_link -> a.txt, out_link -> ../outside.txt, out_dir -> ../elsewhere}."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    (tmp_path / "outside.txt").write_text("secret")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "c.txt").write_text("c")
    os.symlink("a.txt", str(root / "in_link"))
    os.symlink(os.path.join("..", "outside.txt"), str(root / "out_link"))
    os.symlink(str(tmp_path / "elsewhere"), str(root / "out_dir"))
    os.symlink("/etc", str(root / "etc_link"))
    return str(root)


REFUSED = [
    ("absolute", lambda root: "/etc/passwd", "absolute"),
    ("absolute-into-root", lambda root: os.path.join(root, "a.txt"), "absolute"),
    ("double-slash", lambda root: "//etc/passwd", "absolute"),
    ("dotdot", lambda root: "../outside.txt", "leaves"),
    ("dotdot-deep", lambda root: "sub/../../outside.txt", "leaves"),
    ("dotdot-dot", lambda root: "./../outside.txt", "leaves"),
    ("dotdot-many", lambda root: "/".join([".."] * 30) + "/etc/passwd", "leaves"),
    ("dotdot-sibling", lambda root: "../root2/a.txt", "leaves"),
    ("symlink-file-out", lambda root: "out_link", "symlink"),
    ("symlink-dir-out", lambda root: "out_dir/c.txt", "symlink"),
    ("symlink-etc", lambda root: "etc_link/passwd", "symlink"),
    ("symlink-dir-missing-file", lambda root: "out_dir/not_there", "symlink"),
    ("empty", lambda root: "", "not a file name"),
    ("nul", lambda root: "a.txt\0.safetensors", "not a file name"),
    ("int", lambda root: 7, "not a file name"),
    ("none", lambda root: None, "not a file name"),
    ("list", lambda root: ["a.txt"], "not a file name"),
]

KEPT = [
    ("plain", "a.txt", "a.txt"),
    ("subdir", "sub/b.txt", "sub/b.txt"),
    ("dot", "./a.txt", "a.txt"),
    ("dotdot-inside", "sub/../a.txt", "a.txt"),
    ("symlink-inside", "in_link", "in_link"),
    ("not-yet-there", "sub/new.bin", "sub/new.bin"),
]


@pytest.mark.parametrize("name, relative, words", REFUSED, ids=[c[0] for c in REFUSED])
def test_contained_path_refuses(name, relative, words, tree):
    with pytest.raises(InputError, match=words) as info:
        contained_path(tree, relative(tree), "shard")
    assert str(info.value).startswith("shard ") and "\n" not in str(info.value)


@pytest.mark.parametrize("name, relative, expected", KEPT, ids=[c[0] for c in KEPT])
def test_contained_path_keeps(name, relative, expected, tree):
    assert contained_path(tree, relative) == os.path.join(tree, expected)


# -- outputs honour the umask: every file atomic_open writes gets file_mode() = 0o666 & ~umask (mkstemp alone gives
# 0600), every directory make_temp_dir makes gets dir_mode() = 0o777 & ~umask (mkdtemp alone gives 0700). A real
# training run under umask 002: tests/test_train_run_dir.py.

UMASKS = [0o022, 0o002, 0o077, 0o027, 0o000, 0o007]


@pytest.fixture()
def umask():
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda mask: os.umask(mask)
    os.umask(saved)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _text(path):
    fsutil.atomic_write_text(path, "x")


def _bytes(path):
    fsutil.atomic_write_bytes(path, b"x")


def _open_text(path):
    with fsutil.atomic_open(path, "w", encoding="utf-8") as f:
        f.write("x")


def _replace_existing(path):
    with open(path, "w") as f:  # an older file of another mode: the new one gets the umask's mode
        f.write("old")
    os.chmod(path, 0o600)
    fsutil.atomic_write_text(path, "new")


def _in_new_directory(path):
    fsutil.atomic_write_bytes(os.path.join(path + ".d", "deeper", "f"), b"x")
    os.replace(os.path.join(path + ".d", "deeper", "f"), path)


WRITERS = [("atomic_write_text", _text), ("atomic_write_bytes", _bytes), ("atomic_open", _open_text),
           ("replace-0600-file", _replace_existing), ("in-new-directory", _in_new_directory)]


@pytest.mark.parametrize("mask", UMASKS, ids=["umask%03o" % m for m in UMASKS])
@pytest.mark.parametrize("name, writer", WRITERS, ids=[w[0] for w in WRITERS])
def test_files_get_the_umask_mode(name, writer, mask, umask, tmp_path):
    umask(mask)
    path = str(tmp_path / "out.bin")
    writer(path)
    assert _mode(path) == 0o666 & ~mask, oct(_mode(path))
    assert fsutil.file_mode() == 0o666 & ~mask and fsutil.dir_mode() == 0o777 & ~mask


@pytest.mark.parametrize("mask", UMASKS, ids=["umask%03o" % m for m in UMASKS])
def test_temporary_output_directories_get_the_umask_mode(mask, umask, tmp_path):
    umask(mask)
    path = fsutil.make_temp_dir(prefix=".out.", dir=str(tmp_path))
    assert os.path.isdir(path) and _mode(path) == 0o777 & ~mask, oct(_mode(path))


def test_the_umask_is_read_without_changing_it(umask):
    umask(0o027)
    assert fsutil.current_umask() == 0o027
    assert os.umask(0o027) == 0o027


BIG = "x" * 8192
LIMITED_WRITERS = [
    ("atomic_write_text", lambda path: fsutil.atomic_write_text(path, BIG)),
    ("atomic_write_json", lambda path: fsutil.atomic_write_json(path, {"x": BIG})),
    ("atomic_write_with", lambda path: fsutil.atomic_write_with(path, lambda f: f.write(BIG.encode()))),
]


@pytest.mark.parametrize("write", [w[1] for w in LIMITED_WRITERS], ids=[w[0] for w in LIMITED_WRITERS])
def test_a_write_beyond_the_file_size_limit_names_the_file_and_leaves_nothing(write, tmp_path):
    """A real `ulimit -f` (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails with EFBIG): the OSError names the
    file being written, so its one line does (errors.describe_os_error), and neither it nor a temporary is left."""
    import errno
    import resource

    path = str(tmp_path / "out.json")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, hard))
    try:
        with pytest.raises(OSError) as refused:
            write(path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert (refused.value.errno, refused.value.filename) == (errno.EFBIG, path)
    assert os.listdir(str(tmp_path)) == []


def _attribute_uses(names, of=None):
    """"module: name" for every attribute or import of ``names`` (``of``: only as an attribute of that name, e.g.
    "os") in a package module other than fsutil.py."""
    import ast

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ipu_packing")
    found = []
    for directory, _, files in os.walk(root):
        for file in files:
            if file.endswith(".py") and file != "fsutil.py":
                path = os.path.join(directory, file)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                found += ["%s: %s" % (os.path.relpath(path, root), node.attr) for node in ast.walk(tree)
                          if isinstance(node, ast.Attribute) and node.attr in names
                          and (of is None or getattr(node.value, "id", None) == of)]
                found += ["%s: %s" % (os.path.relpath(path, root), alias.name) for node in ast.walk(tree)
                          if isinstance(node, ast.ImportFrom) and (of is None or node.module == of)
                          for alias in node.names if alias.name in names]
    return found


def test_one_directory_publish_in_the_package():
    """fsutil.publish_directory is the one way a directory gets its name: no other module renames or makes the
    temporary directory it is built in."""
    assert _attribute_uses(("replace", "rename"), of="os") + _attribute_uses(("make_temp_dir",)) == []


def test_one_lock_in_the_package():
    """fsutil.take_lock is the package's one lock: no other module calls flock or opens a lock file itself."""
    assert _attribute_uses(("flock", "open_lock_file")) == []


def test_a_held_lock_names_its_holder_in_one_format(tmp_path):
    from ipu_packing.fsutil import LockBusy, release_lock, take_lock

    path = str(tmp_path / "x.lock")
    fd = take_lock(path, command="prepare")
    with pytest.raises(LockBusy) as info:
        take_lock(path)  # another open file description: flock meets it as another process's
    assert info.value.holder.startswith("prepare, pid %d on " % os.getpid())
    release_lock(fd)
    fd = take_lock(path)  # free again; no command: the run directory's holder
    with pytest.raises(LockBusy) as info:
        take_lock(path)
    assert info.value.holder.startswith("pid %d on " % os.getpid())
    release_lock(fd, path)
    assert not os.path.exists(path)


def test_a_non_empty_output_is_said_to_hold_others_files_only_where_the_command_can_tell(tmp_path):
    """check_output's refusal of a non-empty directory claims "files this program did not make" only when an ``ours``
    test said so; without one it cannot tell (a command's own earlier output is refused too)."""
    from ipu_packing.errors import InputError
    from ipu_packing.fsutil import check_output

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a").write_text("x")
    for ours, claimed in ((None, False), (lambda path: False, True)):
        with pytest.raises(InputError, match="directory exists and is not empty") as info:
            check_output(str(tmp_path / "out"), "--output", directory=True, ours=ours)
        assert ("did not make" in str(info.value)) is claimed
    check_output(str(tmp_path / "out"), "--output", directory=True, ours=lambda path: True)

