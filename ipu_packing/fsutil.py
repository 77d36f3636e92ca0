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

Files a user names are read only through ``open_regular``: a FIFO would block the reader until someone
writes into it, and a device (``/dev/zero``, ``/dev/urandom``) never ends; both are refused at once in one
line, as is a directory. A lock file is opened only through ``open_lock_file``: never through a symlink
(``O_NOFOLLOW``), and never unless it is a regular file of one link, so writing the holder's name into it
cannot truncate another file.

Every output the program writes (predict's ``--output`` file, a run directory, prepare's and pack's
``--output`` directory, the export inside a run directory, compare's and bench's ``--plot``, the benches'
``--output`` and ``--workdir``) is checked by one rule, ``check_output``, before
any work: an output is absent, or a regular file, or a directory that is empty or that this program made
(the caller's ``ours``: a run directory is recognised by its lock and its layout). Anything else is refused
in one line: a symlink (where it points is not ours to replace), a device, a FIFO, a socket, a file or
directory the same command reads (``reading``: the input itself, the model directory being served or
anything inside it, a directory that holds one of them), and a directory holding other files. A parent that
exists and is not a directory is refused too.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tempfile
from typing import IO, Any, Callable, Dict, Iterator, Optional, Sequence, Type

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


def publish_directory(target: str, build: Callable[[str], Any], prefix: str, replace: bool = False) -> Any:
    """The one way a directory is published (a prepared dataset, a run's export): ``build(temp)`` writes it whole
    into a fresh temporary sibling of ``target`` (``prefix`` + a random part: the umask's mode), every file gets
    the umask's mode (what a library wrote as 0600 included), the tree is fsynced and renamed to ``target``.
    ``replace``: an existing ``target`` is swapped out (through ``target.old``) and removed; else ``target`` must be
    absent or an empty directory. A kill leaves the old directory or the new one; on any failure the temporary is
    removed. Returns what ``build`` returns."""
    import shutil

    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    temp = make_temp_dir(prefix, parent)
    try:
        result = build(temp)
        for directory, _, names in os.walk(temp):
            for name in names:
                os.chmod(os.path.join(directory, name), file_mode())
        fsync_tree(temp)  # the files are on disk before their directory gets its name
        old = None
        if replace and os.path.exists(target):
            old = target + ".old"
            if os.path.exists(old):
                shutil.rmtree(old)
            os.replace(target, old)
        elif os.path.isdir(target):
            os.rmdir(target)  # empty (the caller's check_output)
        replace_durably(temp, target)
        if old:
            shutil.rmtree(old)
        return result
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb", encoding: Optional[str] = None) -> Iterator[IO]:
    """``with atomic_open(path) as f: f.write(...)``: ``path`` holds the old content or all of the
    new, never part of it; on any error the temporary file is removed and ``path`` is untouched. An OSError that
    names no file (a write refused by a full disk or the file-size limit) is raised naming ``path``."""
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
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if not exc.filename:
            raise OSError(exc.errno, exc.strerror or str(exc), path) from None
        raise
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


def file_kind(mode: int) -> str:
    """What a stat mode is, in words: "a regular file", "a FIFO (named pipe)", "a character device", ..."""
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return words
    return "not a regular file"


def _refuse(path: str, mode: int, error: Type[Exception], doing: str) -> Exception:
    return error("%s: is %s, not a regular file (refusing to %s it: a FIFO or a device would block or never "
                 "end)" % (path, file_kind(mode), doing))


def _blocking(fd: int) -> None:
    import fcntl

    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)


_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_regular(path: str, mode: str = "rb", encoding: Optional[str] = None,
                 error: Type[Exception] = InputError) -> IO[Any]:
    """``open(path, mode)`` of a file a user named, for reading: refused at once, as ``error`` (one line naming
    the path and what it is), unless it is a regular file (symlinks to one are followed). The file is opened
    without blocking (a FIFO's open would wait for a writer) and checked with fstat, so what is checked is
    what is read. OSError (missing, permission denied) is raised as ``open`` raises it."""
    if any(c in mode for c in "wax+"):
        raise ValueError("open_regular reads; mode %r writes" % (mode,))
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC | _NOCTTY)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, info.st_mode, error, "read")
        if _NONBLOCK:
            _blocking(fd)
        return os.fdopen(fd, mode, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: str, error: Type[Exception] = InputError) -> None:
    """Refuse (as ``error``) a path that exists and is not a regular file, without opening it: for readers
    that open the path themselves (h5py, memory maps)."""
    try:
        info = os.stat(path)
    except OSError:
        return  # the reader reports a missing file in its own words
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, info.st_mode, error, "read")


def open_lock_file(path: str, error: Type[Exception] = InputError) -> int:
    """A file descriptor of the lock file ``path``, read-write, created (``0o666 & ~umask``) if absent: never
    through a symlink (``O_NOFOLLOW``), and refused as ``error`` unless it is a regular file with one link
    (a FIFO, a device, a directory, or a hard link to another file), so writing the holder's name into it
    changes nothing else. The caller takes the lock (flock) and closes the descriptor."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC | _NOCTTY, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):  # EMLINK: the BSDs
            raise error("%s: the lock file is a symlink (to %s): refusing to follow it (remove the link)"
                        % (path, os.readlink(path))) from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            raise _refuse(path, os.stat(path).st_mode, error, "lock") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, info.st_mode, error, "lock")
        if info.st_nlink != 1:
            raise error("%s: the lock file has %d links (a hard link to another file?): refusing to write into it "
                        "(remove it)" % (path, info.st_nlink))
        if _NONBLOCK:
            _blocking(fd)
        return fd
    except BaseException:
        os.close(fd)
        raise


class LockBusy(Exception):
    """take_lock: another live process holds the lock; ``holder`` says who ("prepare, pid 12 on host")."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def take_lock(path: str, error: Type[Exception] = InputError, command: str = "") -> int:
    """The one lock of the package (a run directory's run.lock, an output's .<name>.lock): ``path`` opened as
    open_lock_file opens it, locked exclusively without waiting (flock: the kernel drops it when the process
    dies, so a killed holder's file is taken over), and the holder written into it as one JSON object
    ({command, pid, host}). Returns the descriptor (release_lock lets it go); LockBusy naming the holder while
    another process holds it. A file there that holds anything but a holder's record is not a lock this package
    made: refused as ``error``, untouched."""
    import fcntl
    import json
    import socket

    fd = open_lock_file(path, error)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise LockBusy(lock_holder(fd)) from None
        if _holder_record(fd) is None:
            raise error("%s holds something other than this program's lock record: refusing to overwrite it (move "
                        "it away, or choose another output)" % path)
        record = {"command": command, "pid": os.getpid(), "host": socket.gethostname()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode("utf-8"), 0)
        os.fsync(fd)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _holder_record(fd: int) -> Optional[Dict[str, Any]]:
    """What the lock file ``fd`` holds: take_lock's record ({command, pid, host}), {} when empty (released, or just
    made), None when anything else (not a lock file of this package's)."""
    import json

    raw = os.pread(fd, 4097, 0)
    if not raw:
        return {}
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if (len(raw) > 4096 or not isinstance(data, dict) or not isinstance(data.get("pid"), int)
            or not isinstance(data.get("host"), str) or not isinstance(data.get("command", ""), str)):
        return None
    return data


def lock_holder(fd: int) -> str:
    """Who holds the lock file ``fd`` in words ("prepare, pid 12 on host"; "pid 12 on host" for a holder that
    names no command; "another process" when the file says nothing readable)."""
    data = _holder_record(fd)
    if not data:
        return "another process"
    who = "pid %d on %s" % (data["pid"], data["host"])
    return "%s, %s" % (data["command"], who) if data.get("command") else who


def release_lock(fd: int, path: Optional[str] = None) -> None:
    """Let go of a lock take_lock took: the file emptied (it then reads as nobody) or, with ``path``, removed;
    closing the descriptor drops the flock."""
    try:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        else:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def _identity(path: str) -> Optional[Any]:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _inside(path: str, directory: str) -> bool:
    real, root = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([real, root]) == root


def check_output(path: str, what: str, directory: bool = False, reading: Sequence[str] = (),
                 ours: Optional[Callable[[str], bool]] = None, error: Type[Exception] = InputError) -> None:
    """Refuse (as ``error``, one line naming ``what`` and ``path``) an output the program must not replace; the
    one rule of every output (module docstring). ``directory``: the output is a directory (else a file);
    ``reading``: the files and directories the same command reads; ``ours(path)``: whether an existing,
    non-empty directory is one this program made (without it, only an empty directory is taken)."""
    where = "%s %s" % (what, path)
    if os.path.islink(path):
        raise error("%s: is a symlink (to %s): name the %s itself (refusing to write through it or replace it)"
                    % (where, os.readlink(path), "directory" if directory else "file"))
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.lexists(parent) and not os.path.isdir(parent):
        raise error("%s: its parent %s is not a directory" % (where, parent))
    for source in reading:
        if not source or not os.path.lexists(source):
            continue
        same = _identity(path) is not None and _identity(path) == _identity(source)
        relation = ("is" if same else "is inside" if os.path.isdir(source) and _inside(path, source)
                    else "holds" if directory and _inside(source, path) else None)
        if relation:
            raise error("%s: %s %s, which this command reads (refusing to overwrite an input): choose another "
                        "output" % (where, relation, source))
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if directory:
        if not stat.S_ISDIR(info.st_mode):
            raise error("%s: exists and is %s, not a directory (refusing to overwrite)"
                        % (where, file_kind(info.st_mode)))
        if os.listdir(path) and not (ours is not None and ours(path)):
            raise error("%s: directory exists and is not empty%s (refusing to overwrite): choose another or an empty "
                        "directory" % (where, "" if ours is None else ", and holds files this program did not make"))
    elif not stat.S_ISREG(info.st_mode):
        raise error("%s: exists and is %s, not a regular file (refusing to replace it)"
                    % (where, file_kind(info.st_mode)))


def atomic_write_json(path: str, value: Any, indent: Optional[int] = 2) -> None:
    """``value`` as JSON (sorted keys, a final newline) through ``atomic_open``: the old file or all of the
    new, with the umask's mode (for exports' and benches' JSON files)."""
    import json

    atomic_write_text(path, json.dumps(value, indent=indent, sort_keys=True) + "\n")


class _Recorded:
    """A binary file whose ``write`` remembers the OSError it raised: a writer that calls it from C++ (``torch.save``)
    may report the failure as its own RuntimeError ("unexpected pos ...") instead."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.error = None  # type: Optional[OSError]

    def write(self, data: Any) -> int:
        try:
            return self._f.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def atomic_write_with(path: str, write: Callable[[IO[bytes]], Any]) -> None:
    """``write(f)`` into ``path`` through ``atomic_open`` (binary): for writers that take a file object, e.g.
    ``atomic_write_with(png, lambda f: figure.savefig(f, format="png"))`` or ``torch.save``. The old file stays whole
    until the new one is complete; a symlink at ``path`` is replaced, never written through. A write the system
    refused (a full disk, the file-size limit) is raised as that OSError naming ``path``, whatever the writer
    made of it, and nothing of the new file is left."""
    recorded = None  # type: Optional[_Recorded]
    try:
        with atomic_open(path, "wb") as f:
            recorded = _Recorded(f)
            write(recorded)  # type: ignore[arg-type]
    except Exception as exc:
        error = recorded.error if recorded is not None else None
        if error is None or exc is error:
            if isinstance(exc, OSError) and not exc.filename:
                raise OSError(exc.errno, exc.strerror or str(exc), path) from None
            raise
        raise OSError(error.errno, error.strerror or str(error), path) from None


def sha256_file(path: str, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read `chunk` bytes at a time (a FIFO or a device is refused:
    ``open_regular``)."""
    digest = hashlib.sha256()
    with open_regular(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return digest.hexdigest()
            digest.update(block)
