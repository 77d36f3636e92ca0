"""One error convention for every command, and the one wrapper that applies it.

Every entry point (run_pretraining.py, ``python -m ipu_packing.data``, ``ipu_packing.packing``,
``ipu_packing.bench.planner``, ``ipu_packing.bench``, ``ipu_packing.execution``) runs its ``main``
through :func:`run_command`, which decides by exception *type*, never by message text:

- :class:`UserError` (bad config, dataset, checkpoint, option; its kinds are the classes below) and the
  environment refusing a file (:class:`OSError`: missing, read-only, full disk): one line
  ``error: <cause>`` on stderr, exit status 2, no traceback.
- Ctrl-C: one line ``error: interrupted``, exit status 130 (128 + SIGINT), as a shell reports it; SIGTERM
  the same way (signals.py): ``error: terminated (SIGTERM)``, exit status 143 (128 + SIGTERM). A training
  run stopped by either writes a checkpoint first, and its line says so (train/guard.py).
- A reader that closed the pipe (``inspect ... | head``): no message, exit status 141
  (128 + SIGPIPE), as ``git log | head`` and other Unix tools end.
- An exception a dependency raises on bad bytes (``describe_dependency_fault``: gzip, zlib, zip, JSON,
  UTF-8, YAML, pickle, safetensors, a truncated file, input nested past the recursion limit) and memory
  running out (Python's MemoryError, torch's CPU allocator, CUDA out of memory): one line naming the cause,
  exit status 2.
- An optional dependency that is not installed (``require_extra``): one line naming the extra that installs
  it, e.g. ``pip install 'ipu-packing[plots]'``, exit status 2.
- Anything else is a bug and keeps its traceback.

Commands validate their input before writing anything, so an error leaves no partial output.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import re
import sys
from typing import Any, Callable, Iterator, List, Optional

from .signals import stop_of, terminate_as_interrupt

USER_ERROR_EXIT = 2
INTERRUPTED_EXIT = 130
TERMINATED_EXIT = 143
BROKEN_PIPE_EXIT = 141


class UserError(Exception):
    """Bad user input: the message is one line naming the cause; the command exits with status 2."""

    exit_code = USER_ERROR_EXIT


class InputError(UserError, ValueError):
    """An argument, option or input file is wrong. Also a ValueError: library callers may catch either."""


class ConfigError(InputError):
    """A config value is wrong (a YAML key, an override, a dataclass field); the message names the key."""


class DataError(UserError):
    """A data problem (a missing corpus, bad UTF-8, a broken vocabulary, a corrupt shard or manifest, an output
    directory that already holds something): str(error) is one line naming the file, the shard or the field."""


class LaunchError(UserError):
    """The process was started in a way the config cannot run in (no CUDA, no torchrun, not under poprun)."""


class BackendUnavailable(UserError, RuntimeError):
    """The chosen backend cannot be imported here (poptorch or popdist without the Poplar SDK)."""


class TrainingError(UserError):
    """The run stopped while training (a loss or a weight that is not finite): one line naming the last
    checkpoint that is finite throughout."""


class MissingExtra(UserError):
    """An optional dependency is not installed: the message names the extra that installs it."""


EXTRAS = {"matplotlib": "plots", "h5py": "data", "crc32c": "data", "tensorboard": "tensorboard", "datasets": "datasets",
          "pyarrow": "datasets"}
"""Optional dependency (top-level module) -> the extra of pyproject.toml that installs it."""


def require_extra(module: str, purpose: str) -> Any:
    """``importlib.import_module(module)``, or MissingExtra, one line naming what needed it and the extra:
    "compare --plot needs matplotlib, which is not installed: pip install 'ipu-packing[plots]'"; an import that fails
    without naming a missing module (a package too old for its user) is said as that failure, with the same command.
    The one way every optional import (matplotlib, h5py, crc32c, tensorboard, datasets, pyarrow) is made."""
    top = module.split(".")[0]
    extra = EXTRAS.get(top) or EXTRAS.get(module.split(".")[-1])
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        how = "pip install 'ipu-packing[%s]'" % extra if extra else "pip install %s" % top
        missing = getattr(exc, "name", None)
        if missing is None:  # found, but its import refused (torch.utils.tensorboard with a tensorboard below 1.15)
            raise MissingExtra("%s: importing %s failed (%s): %s" % (purpose, module, one_line(exc), how)) from None
        raise MissingExtra("%s needs %s, which is not installed%s: %s"
                           % (purpose, missing, "" if missing == module or missing == top else
                              " (importing %s)" % module, how)) from None


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises InputError (one line) instead of printing usage and exiting, and takes options and
    positionals in any order (``--config demo training.steps=3 --dry-run logging.tensorboard=false``: argparse's
    intermixed parsing) where it can, i.e. in a parser without sub-commands."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError("%s (see %s --help)" % (message, self.prog))

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        if any(isinstance(action, argparse._SubParsersAction) for action in self._actions):
            return super().parse_args(args, namespace)
        return self.parse_intermixed_args(args, namespace)


_OS_CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EFBIG: "file too large (the file-size limit, `ulimit -f`, or the file system's)",
    errno.EACCES: "permission denied",
    errno.EMFILE: "too many open files (raise `ulimit -n`)",
}


def one_line(text: str) -> str:
    """``text`` with every run of white space (newlines included) folded to one space."""
    return " ".join(str(text).split())


def describe_os_error(error: OSError) -> str:
    """``<cause>: <path>`` for an OSError, naming the file where the error knows it."""
    cause = (_OS_CAUSES.get(error.errno or 0) or error.strerror
             or (one_line("%s: %s" % (type(error).__name__, error))[:300] if str(error) else type(error).__name__))
    names = [n for n in (error.filename, getattr(error, "filename2", None)) if n]
    return "%s: %s" % (cause, " -> ".join(str(n) for n in names)) if names else cause


# Exception classes that a dependency raises only when the bytes it was given are bad (a file of the
# user's), found by module and class name so that this module imports none of them; each with the words
# of its line. Mapping by class, not by "anything raised while reading", keeps the rule that a bug
# shows its traceback: these classes come from decoders and parsers, not from a logic error of ours
# (KeyError, TypeError, AttributeError, IndexError, ValueError in general still show their traceback).
_DEPENDENCY_FAULTS = (
    ("json", "JSONDecodeError", "not valid JSON"),
    ("builtins", "UnicodeDecodeError", "not valid UTF-8 text"),
    ("gzip", "BadGzipFile", "not a valid gzip file"),
    ("zlib", "error", "corrupt compressed data (zlib)"),
    ("zipfile", "BadZipFile", "not a valid zip/.npz file"),
    ("pickle", "UnpicklingError", "not a readable pickle or torch file"),
    ("yaml", "YAMLError", "not valid YAML"),
    ("builtins", "EOFError", "a file ended early"),
)
_STORAGE_CODE = re.compile(r"\bcode: (\d+)")
_TORCH_OUT_OF_MEMORY = re.compile(r"DefaultCPUAllocator: can't allocate memory|CUDA out of memory|"
                                  r"CUDA error: out of memory|MPS backend out of memory")
"""What torch's allocators say when memory runs out: a plain RuntimeError (the CPU allocator) or
torch.cuda.OutOfMemoryError, a RuntimeError too; the text is all that tells it from a bug's RuntimeError."""


def describe_dependency_fault(error: BaseException) -> Optional[str]:
    """One line for an exception a reader or writer of a user's file raised on bad input (the classes in
    _DEPENDENCY_FAULTS, safetensors' SafetensorError, MemoryError, and a RecursionError raised inside a
    dependency's parser), or None: then it is a bug, and its traceback is kept.

    RecursionError and MemoryError are decided by where they happened, since our own code can also
    recurse or allocate without end: a RecursionError counts only when the innermost frame is not
    ipu_packing's own (json's or yaml's decoder on input nested too deeply); a MemoryError always counts
    (the environment refused, as for a full disk) and its line names the place that asked for the memory,
    so a bug that allocates without bound is still found."""
    detail = one_line(error)[:300]
    if isinstance(error, MemoryError):
        return "out of memory (a size read from a file may be absurd)%s" % _where(error)
    if isinstance(error, RuntimeError) and _torch_out_of_memory(error):
        said = _TORCH_OUT_OF_MEMORY.search(str(error))
        return ("out of memory: %s%s; choose a smaller model (model.hidden_size, model.num_hidden_layers) or "
                "batch (execution.micro_batch_size)" % (said.group(0) if said else "torch %s" % type(error).__name__,
                                                         _allocation(error)))
    if isinstance(error, RecursionError):
        frame = _innermost(error)
        if frame is None or _ours(frame):
            return None
        return "input nested too deeply to read (%s, in %s)" % (detail or "RecursionError", _short(frame))
    for module, name, words in _DEPENDENCY_FAULTS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(error, cls):
            return "%s: %s" % (words, detail) if detail else words
    kind = type(error)
    # safetensors_rust.SafetensorError in the safetensors of requirements-sdk.txt, safetensors._safetensors_rust
    # in later ones
    if kind.__name__ == "SafetensorError" and kind.__module__.split(".")[0] in ("safetensors", "safetensors_rust"):
        code = _STORAGE_CODE.search(str(error))
        if code and int(code.group(1)) in _OS_CAUSES:
            return _OS_CAUSES[int(code.group(1))]
        return "not a readable safetensors file: %s" % (detail,)
    return None


def _torch_out_of_memory(error: BaseException) -> bool:
    """A RuntimeError of torch's allocators running out of memory (by its class where torch has one for it,
    else by its words): never a RuntimeError of our own."""
    kind = type(error)
    if kind.__name__ == "OutOfMemoryError" and kind.__module__.split(".")[0] == "torch":
        return True
    return kind is RuntimeError and _TORCH_OUT_OF_MEMORY.search(str(error)) is not None


def _allocation(error: BaseException) -> str:
    """" (it asked for 12.0 GiB)" from torch's message, where it says."""
    match = re.search(r"allocate (\d+) bytes", str(error))
    if match:
        return " (it asked for %.1f GiB)" % (int(match.group(1)) / 2.0 ** 30)
    match = re.search(r"allocate ([0-9.]+ [KMGT]i?B)", str(error))
    return " (it asked for %s)" % match.group(1) if match else ""


def _innermost(error: BaseException) -> Optional[str]:
    tb = error.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename


def _ours(filename: str) -> bool:
    return os.path.dirname(os.path.abspath(filename)).startswith(_PACKAGE_DIR)


def _short(filename: str) -> str:
    return os.path.relpath(filename, os.path.dirname(_PACKAGE_DIR)) if _ours(filename) else os.path.basename(filename)


def _where(error: BaseException) -> str:
    """" in <file>:<line>" of the innermost frame of ipu_packing's own that the exception went through."""
    tb, last = error.__traceback__, None
    while tb is not None:
        if _ours(tb.tb_frame.f_code.co_filename):
            last = tb
        tb = tb.tb_next
    return "" if last is None else " in %s:%d" % (_short(last.tb_frame.f_code.co_filename), last.tb_lineno)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class _QuietFinalisers:
    """While a failure is reported: discard the noise of the failed work's half-built objects.

    After a full disk or a Ctrl-C, objects the failure left half-done (numpy's zip writer of a file the
    disk refused, a process pool's queue thread on Python 3.8) are finalised when the traceback that
    holds them goes away, and print "Exception ignored in ..." before the one error line. The failure
    is already being reported, so from the moment it is caught until everything it held is collected,
    such unraisable exceptions are dropped."""

    def __init__(self) -> None:
        self.saved = None

    def start(self) -> None:
        import threading

        if self.saved is None and hasattr(sys, "unraisablehook") and hasattr(threading, "excepthook"):
            self.saved = (sys.unraisablehook, threading.excepthook)
            sys.unraisablehook = lambda unraisable: None
            threading.excepthook = lambda args: None  # a pool's helper thread dying with its pool

    def finish(self) -> None:
        import gc
        import threading

        gc.collect()
        if self.saved is not None:
            (sys.unraisablehook, threading.excepthook), self.saved = self.saved, None


@contextlib.contextmanager
def quiet_teardown() -> Iterator[None]:
    """The failure handling of `run_command`, for code that tears down after a failure itself (a
    process pool killed on Ctrl-C)."""
    quiet = _QuietFinalisers()
    quiet.start()
    try:
        yield
    finally:
        quiet.finish()


def run_command(main: Callable[[Optional[List[str]]], int], argv: Optional[List[str]] = None) -> int:
    """Run ``main(argv)`` under the convention above and return its exit status."""
    quiet = _QuietFinalisers()
    try:
        with terminate_as_interrupt():
            code = int(main(argv) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
        return code
    except UserError as error:
        quiet.start()
        message, code = one_line(error) or type(error).__name__, error.exit_code
        stopped = stop_of(error)  # a read that failed because a signal stopped the command: report the stop
        if stopped is not None:
            message, code = stopped.line, stopped.exit_code
    except KeyboardInterrupt as error:  # Ctrl-C, or stopping.Stopped: SIGTERM, a training run stopped by either
        quiet.start()
        message = getattr(error, "line", None) or "interrupted"
        code = getattr(error, "exit_code", INTERRUPTED_EXIT)
    except BrokenPipeError:
        _quiet_stdout()
        return BROKEN_PIPE_EXIT
    except Exception as error:  # re-raised, traceback and all, unless it is an OSError or a dependency's fault
        cause = describe_dependency_fault(error)
        if cause is None and not isinstance(error, OSError):
            raise
        quiet.start()
        message, code = cause or describe_os_error(error), USER_ERROR_EXIT  # type: ignore[arg-type]
        stopped = stop_of(error)
        if stopped is not None:
            message, code = stopped.line, stopped.exit_code
    quiet.finish()  # the exception and its traceback are gone: collect what they held, quietly
    try:
        sys.stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        _quiet_stdout()
    sys.stderr.write("error: %s\n" % message)
    sys.stderr.flush()
    return code


__all__ = [
    "ArgumentParser",
    "BROKEN_PIPE_EXIT",
    "ConfigError",
    "INTERRUPTED_EXIT",
    "TERMINATED_EXIT",
    "USER_ERROR_EXIT",
    "InputError",
    "MissingExtra",
    "UserError",
    "describe_dependency_fault",
    "describe_os_error",
    "one_line",
    "require_extra",
    "run_command",
]
