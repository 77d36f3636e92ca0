"""Durable file replacement: what every writer of results, manifests and checkpoints goes through.

``os.replace`` is atomic, but without fsync a power cut can still leave the new name pointing at an
empty file, or the rename itself unrecorded. The recipe here is the usual one: write a temporary
file in the target's directory, fsync it, rename it over the target, then fsync the directory so
the rename is on disk too. Temporaries are named ``.<name>.<random>.tmp``; ``remove_stale_temporaries``
deletes those a killed writer left behind.

Modes: ``mkstemp`` and ``mkdtemp`` create 0600 files and 0700 directories whatever the umask, so a
dataset or an export written through them could not be shared. Every file ``atomic_open`` writes gets
``0o666 & ~umask`` and every directory ``make_temp_dir`` makes gets ``0o777 & ~umask``, as ``open`` and
``mkdir`` would give them (``file_mode``, ``dir_mode``).

Paths named inside files (a Hugging Face index's shard names, a manifest's shard entries) are joined to
their directory only through ``contained_path``, which refuses any that leaves it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from typing import IO, Iterator, Optional

from .errors import InputError

TMP_SUFFIX = ".tmp"


def current_umask() -> int:
    """The process's umask, read without changing it where Linux reports it (/proc/self/status); elsewhere
    by setting and restoring it (not atomic against another thread doing the same)."""
    try:
        with open("/proc/self/status", "r", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0o666 less the umask."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """The mode ``os.mkdir`` gives a new directory: 0o777 less the umask."""
    return 0o777 & ~current_umask()


def make_temp_dir(prefix: str, dir: str) -> str:
    """``tempfile.mkdtemp`` whose directory gets ``dir_mode()`` instead of 0700: for a directory that is
    renamed into place as an output (a dataset, an export)."""
    path = tempfile.mkdtemp(prefix=prefix, dir=dir)
    os.chmod(path, dir_mode())
    return path


def contained_path(root: str, relative: str, what: str = "a path") -> str:
    """``root/relative``, refused unless it stays inside ``root``: ``relative`` must be a non-empty
    relative path (no NUL, no absolute path, no ``..`` that climbs out), and where it exists, its real
    path (symlinks resolved) must be inside ``root``'s real path. The one place a name read from a file
    becomes a path. ``what`` names the name in the error, e.g. "shard 'x' in /d/model.safetensors.index.json".

    A symlink that leaves the directory is refused like any other escape; a Hugging Face hub cache snapshot
    (shards linked into ../../blobs) is read after copying it with ``cp -rL``."""
    if not isinstance(relative, str) or not relative or "\0" in relative:
        raise InputError("%s is not a file name: %r" % (what, relative))
    if os.path.isabs(relative) or os.path.splitdrive(relative)[0]:
        raise InputError("%s is an absolute path (%s): only names inside %s are read" % (what, relative, root))
    joined = os.path.normpath(os.path.join(root, relative))
    base = os.path.normpath(root)
    if os.path.commonpath([os.path.abspath(joined), os.path.abspath(base)]) != os.path.abspath(base):
        raise InputError("%s leaves its directory %s (%s)" % (what, root, relative))
    real_root = os.path.realpath(root)
    real = os.path.realpath(joined)
    if os.path.commonpath([real, real_root]) != real_root:
        raise InputError("%s leaves its directory %s through a symlink (%s -> %s; copy the directory with "
                         "`cp -rL` to read it)" % (what, root, relative, real))
    return joined


def fsync_directory(path: str) -> None:
    """Make a rename or unlink inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories; the rename is still atomic
        pass
    finally:
        os.close(fd)


def replace_durably(source: str, target: str) -> None:
    """Rename ``source`` over ``target`` (same file system) and fsync the target's directory."""
    os.replace(source, target)
    fsync_directory(os.path.dirname(os.path.abspath(target)) or ".")


def fsync_tree(root: str) -> None:
    """fsync every file and directory under ``root`` (before a directory is renamed into place)."""
    for directory, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_directory(directory)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb", encoding: Optional[str] = None) -> Iterator[IO]:
    """``with atomic_open(path) as f: f.write(...)``: ``path`` holds the old content or all of the
    new, never part of it; on any error the temporary file is removed and ``path`` is untouched."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=TMP_SUFFIX, dir=directory)
    try:
        os.fchmod(fd, file_mode())  # mkstemp's 0600 would keep the output from the group the umask allows
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        replace_durably(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def remove_stale_temporaries(directory: str) -> int:
    """Delete ``.<name>.*.tmp`` files that a killed writer left in ``directory``; returns how many.
    Call it only while holding the directory (for a run directory: under its lock, train/run_dir.py)."""
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if name.startswith(".") and name.endswith(TMP_SUFFIX):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
                removed += 1
    if removed:
        fsync_directory(directory)
    return removed


def sha256_file(path: str, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read `chunk` bytes at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return digest.hexdigest()
            digest.update(block)
