"""Durable file replacement: what every writer of results, manifests and checkpoints goes through.

``os.replace`` is atomic, but without fsync a power cut can still leave the new name pointing at an
empty file, or the rename itself unrecorded. The recipe here is the usual one: write a temporary
file in the target's directory, fsync it, rename it over the target, then fsync the directory so
the rename is on disk too. Temporaries are named ``.<name>.<random>.tmp``; ``remove_stale_temporaries``
deletes those a killed writer left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from typing import IO, Iterator, Optional

TMP_SUFFIX = ".tmp"


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
    Call it only while holding the directory (for a run directory: under its RunLock)."""
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
