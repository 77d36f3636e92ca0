"""``DataLoader`` and ``AsynchronousDataAccessor`` (python/__init__.py, python/_dataloader.py): the loader's
worker process, started by the sharing strategy's multiprocessing context."""

from __future__ import annotations

import atexit
import enum
import itertools
import os
import pickle
import signal
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.multiprocessing

from ._enums import DataLoaderMode, SharingStrategy
from ._names import Error
from ._options import Options


# ---- the data loader (python/__init__.py: DataLoader, AsynchronousDataAccessor; python/_dataloader.py) ---------


WORKER_LOG = "POPTORCH_STAND_IN_WORKER_LOG"
"""Test helper: with this variable naming a file, each AsynchronousDataAccessor worker appends a JSON line
about itself once it has its first element: pid, parent pid, sharing strategy, and the __main__ module it
imported (name and file)."""


def _log_worker(strategy: "SharingStrategy") -> None:
    import json
    import sys

    main = sys.modules.get("__main__")
    line = {"pid": os.getpid(), "ppid": os.getppid(), "sharing_strategy": strategy.name,
            "main_name": getattr(main, "__name__", None), "main_file": getattr(main, "__file__", None)}
    with open(os.environ[WORKER_LOG], "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def _py_error(message: str) -> Error:
    """python/_impl.py createPoptorchError: a poptorch.Error whose text is "'poptorch_py_error': MESSAGE"."""
    error = Error("'poptorch_py_error': %s" % (message,))
    error.type, error.message, error.location = "poptorch_py_error", message, ""
    return error


class DataLoader(torch.utils.data.DataLoader):
    """poptorch.DataLoader (python/__init__.py:229-523): a torch DataLoader whose item is the combined batch of
    one host call, ``batch_size`` (the micro batch) x device iterations x replicas x gradient accumulation
    (:324-330).

    - A distributed run (more than one process) cuts a map-style dataset, unless
      ``auto_distributed_partitioning=False``, into one contiguous block per process of a whole number of
      combined batches, the same count for every process (_SubDataset, :126-158, with drop_last).
    - ``mode``: ``Sync`` iterates in this process. ``AsyncRebatched`` (and ``Async`` with drop_last=False)
      becomes ``Async`` with ``rebatched_size`` = the combined batch: the torch side batches
      ``rebatched_worker_size`` (default the combined batch) with drop_last=False, and the accessor's worker
      cuts the rows into combined batches, dropping a short last one when drop_last (:424-457). ``Async``
      starts an AsynchronousDataAccessor on ``self`` here, in ``__init__`` (:459-466): the worker process
      gets this loader, its dataset included, pickled, and iterating the loader iterates the accessor.
    - ``poptorch_mode`` (the mode as asked) and ``micro_batch_size`` are test helpers, not PopTorch API.
    """

    def __init__(self, options: Options, dataset, batch_size: int = 1, shuffle: Optional[bool] = None,
                 num_workers: int = 0, drop_last: bool = True, persistent_workers: Optional[bool] = None,
                 auto_distributed_partitioning: bool = True, mode: DataLoaderMode = DataLoaderMode.Sync,
                 async_options: Optional[Dict[str, Any]] = None, rebatched_worker_size: Optional[int] = None,
                 batch_sampler=None, **kwargs) -> None:
        if batch_sampler is not None:
            raise Error("the stand-in does not model batch_sampler")
        if shuffle is None:
            shuffle = False
        assert isinstance(options, Options)
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        self.poptorch_mode = mode
        self.micro_batch_size = batch_size
        if batch_size is None:
            self._combined_batch_size = None  # type: Optional[int]
        else:
            self._combined_batch_size = batch_size * options._int("deviceIterations") * options._int(
                "replicationFactor") * options._int("Training.gradientAccumulation")
        self._options = options
        self._accessor = None  # type: Optional[AsynchronousDataAccessor]
        processes = options.Distributed.numProcesses
        if (processes > 1 and auto_distributed_partitioning
                and not isinstance(dataset, torch.utils.data.IterableDataset)):
            assert drop_last, "the stand-in models _SubDataset with drop_last only"
            assert self._combined_batch_size is not None, (
                "batch_size=None not allowed when using auto_distributed_partitioning.")
            per_process = self._combined_batch_size * (len(dataset) // (self._combined_batch_size * processes))
            offset = options.Distributed.processId * per_process
            dataset = torch.utils.data.Subset(dataset, range(offset, offset + per_process))
        rebatched_size = None
        dataset_batch_size = self._combined_batch_size
        remainder = (mode == DataLoaderMode.Async and not drop_last and self._combined_batch_size is not None
                     and self._combined_batch_size > 1)
        if mode == DataLoaderMode.AsyncRebatched or remainder:
            mode = DataLoaderMode.Async
            rebatched_size = self._combined_batch_size
            self.rebatched_drop_last = drop_last  # read by the worker (python/_dataloader.py:305)
            drop_last = False
            if rebatched_worker_size is not None:
                assert rebatched_worker_size <= self._combined_batch_size, (
                    "The rebatched_worker_size (%d) must be <= to the combined batch size (%d)"
                    % (rebatched_worker_size, self._combined_batch_size))
                dataset_batch_size = rebatched_worker_size
        super().__init__(dataset, batch_size=dataset_batch_size, shuffle=shuffle, num_workers=num_workers,
                         drop_last=drop_last, persistent_workers=persistent_workers, **kwargs)
        if mode == DataLoaderMode.Async:
            async_options = dict(async_options or {})
            assert "rebatched_size" not in async_options, (
                "You cannot use DataLoaderMode.AsyncRebatched and manually specify the rebatched_size in "
                "async_options")
            self._accessor = AsynchronousDataAccessor(self, rebatched_size=rebatched_size, **async_options)

    def __len__(self) -> int:
        if self._accessor is not None and self._accessor.rebatched_size:
            elements = len(self.dataset)
            length = elements // self._accessor.rebatched_size
            if not self.rebatched_drop_last and elements % self._accessor.rebatched_size:
                length += 1
            return length
        return super().__len__()

    @property
    def combinedBatchSize(self) -> Optional[int]:
        return self._combined_batch_size

    @property
    def options(self) -> Options:
        return self._options

    def terminate(self) -> None:
        if getattr(self, "_accessor", None) is not None:
            self._accessor.terminate()

    def __del__(self) -> None:
        self.terminate()

    def __iter__(self):
        if self._accessor is not None:
            return self._accessor.__iter__()
        return super().__iter__()


accessors = []  # type: List[AsynchronousDataAccessor]
"""Every AsynchronousDataAccessor made (test helper: a fixture ends their workers after its test)."""


class AsynchronousDataAccessor:
    """python/__init__.py:526-662. Its worker process (python/_dataloader.py) starts here, in ``__init__``,
    with the multiprocessing start method of ``sharing_strategy``: ``Fork`` forks; ``ForkServer`` (the
    default) has the forkserver fork it; ``SharedMemory`` and ``FileSystem`` spawn it (FileSystem passes the
    dataset through a pickle file). Under forkserver and spawn the child re-imports the parent's ``__main__``
    (as ``__mp_main__``) before it unpickles the dataset, so a script without an
    ``if __name__ == "__main__":`` guard runs again there; a worker that dies before it has sent its first
    element gives PopTorch's "AsynchronousDataAccessor worker thread failed to start", one that dies later
    "An error occurred in the data fetcher".

    The worker iterates the dataset (the loader: a torch DataLoader of its own, with its own workers if
    ``num_workers``), rebatches when ``rebatched_size`` is set, and fills at most ``buffer_size`` slots the
    host has not released. PopTorch hands out the slot's shared memory itself, so an element is valid only
    until the next ``__next__`` (or a new iterator): the worker may refill the slot as soon as it is released.
    The stand-in sends each element through a pipe and, when the host releases it, fills the tensors it
    returned with NaN / the integer minimum, the earliest moment PopTorch's worker may overwrite them.
    Iterating again starts the dataset from its beginning (a reset when the last iteration stopped early);
    ``load_indefinitely`` is PopTorch's default. ``miss_sleep_time_in_ms`` and ``early_preload`` are
    accepted and not modelled (the stand-in's worker waits for the host's start, and blocks instead of
    polling)."""

    def __init__(self, dataset, buffer_size: int = 3, miss_sleep_time_in_ms: float = 0.1,
                 load_indefinitely: bool = True, early_preload: bool = False,
                 sharing_strategy: SharingStrategy = SharingStrategy.ForkServer,
                 rebatched_size: Optional[int] = None) -> None:
        self._worker = None  # type: Optional[_AsynchronousWorker]
        if isinstance(dataset, DataLoader) and dataset._accessor is not None:
            raise _py_error("The DataLoader already uses an AsynchronousDataAccessor internally. Either use the "
                            "existing one or set mode='poptorch.DataLoaderMode.Sync' in the DataLoader.")
        if isinstance(dataset, DataLoader) and not dataset.drop_last and rebatched_size is None:
            assert dataset.combinedBatchSize is None or dataset.combinedBatchSize == 1, (
                "The 'drop_last=False' option from the DataLoader only works if 'rebatched_size' is specified too.")
        if rebatched_size is not None:
            assert rebatched_size > 1, "rebatched_size must be None or greater than 1"
        self._dataset = dataset
        atexit.register(self.terminate)
        accessors.append(self)
        self.rebatched_size = rebatched_size
        self._worker = _AsynchronousWorker(buffer_size, dataset, load_indefinitely, SharingStrategy(sharing_strategy),
                                           rebatched_size)

    def terminate(self) -> None:
        if self._worker is not None:
            self._worker.terminate()
            self._worker = None

    def __del__(self) -> None:
        if getattr(self, "_worker", None) is not None:
            self.terminate()

    def __len__(self) -> int:
        length = len(self._dataset)
        if self.rebatched_size and getattr(self._dataset, "_accessor", None) is not self:
            length = length * self._dataset.batch_size // self.rebatched_size
        return length

    def __iter__(self) -> "AsynchronousDataAccessor":
        assert self._worker is not None
        self._worker.resetIterator()
        return self

    def __next__(self):
        assert self._worker is not None
        self._worker.releaseElement()
        data = self._worker.acquireElement()
        if data is None:
            raise StopIteration
        return data

    @property
    def worker_pid(self) -> Optional[int]:
        """The worker process's pid (test helper)."""
        return self._worker.pid if self._worker is not None else None


class _HostCommand(enum.IntEnum):
    """python/_dataloader.py:556-560, and Release: the stand-in's message for a slot the host released
    (PopTorch flips the slot's flag in shared memory)."""
    SetupComplete = 0
    Shutdown = 1
    ResetIterator = 2
    StartIterating = 3
    Release = 4


def _flat(data, keys: List[str]) -> Tuple[torch.Tensor, ...]:
    """One element as the worker sends it: a tuple of tensors (python/_dataloader.py:282-299, 343-356)."""
    if isinstance(data, torch.Tensor):
        data = (data,)
    elif isinstance(data, dict):
        assert len(data) == len(keys)
        data = tuple(data[k] for k in keys)
    elif not isinstance(data, (list, tuple)):
        raise Error("the stand-in models elements that are tensors, dicts or lists of tensors, not %s" % type(data))
    for index, tensor in enumerate(data):
        assert isinstance(tensor, torch.Tensor), (
            "Tensor at index %d is not a torch tensor (%s). AsynchronousDataAccessor expects data to be organised "
            "as a flat 1D container of tensors." % (index, type(tensor)))
    return tuple(data)


def _rebatched(elements, size: Optional[int], drop_last: bool):
    """The rows of ``elements`` cut into elements of ``size`` rows (python/_dataloader.py:513-541, 478-489): a
    short last one is dropped when ``drop_last``."""
    if not size:
        for fields in elements:
            yield fields
        return
    parts, rows = [], 0  # type: List[Tuple[torch.Tensor, ...]], int
    for fields in elements:
        parts.append(fields)
        rows += int(fields[0].shape[0])
        while rows >= size:
            whole = [torch.cat([p[i] for p in parts]) for i in range(len(fields))]
            yield tuple(w[:size] for w in whole)
            rows -= size
            parts = [tuple(w[size:] for w in whole)] if rows else []
    if rows and not drop_last:
        yield tuple(torch.cat([p[i] for p in parts]) for i in range(len(parts[0])))


def _poison(tensor: torch.Tensor) -> None:
    if tensor.dtype == torch.bool:
        tensor.fill_(True)
    elif tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(float("nan"))
    else:
        info = torch.iinfo(tensor.dtype)
        tensor.fill_(info.min if info.min < 0 else info.max)


class _AsynchronousWorker:
    """The host's side (python/_dataloader.py AsynchronousWorker)."""

    def __init__(self, buffer_size: int, dataset, load_indefinitely: bool, sharing_strategy: SharingStrategy,
                 rebatched_size: Optional[int]) -> None:
        self._process = _AsynchronousWorkerProcess(buffer_size, dataset, load_indefinitely, sharing_strategy,
                                                   rebatched_size)
        self._load_indefinitely = load_indefinitely
        self._was_used = False
        self._worker_started = False
        self._eof = False
        self._locked = None  # type: Optional[Tuple[torch.Tensor, ...]]
        self._command_pipe, self._data_pipe, (self._is_single_tensor, self._dict_keys) = self._process.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def terminate(self) -> None:
        if self._process.isAlive():
            try:
                self._command_pipe.send(_HostCommand.Shutdown)
            except (BrokenPipeError, OSError):
                pass
        # PopTorch's worker writes to shared memory and polls its commands; the stand-in's may be blocked
        # sending an element through a full pipe: closing the host's end ends that send
        self._data_pipe.close()
        self._process.join()
        self._command_pipe.close()

    def _send(self, command: "_HostCommand") -> None:
        """A command to the worker; a worker that has died already is the same fetcher error as one that dies
        while the host waits for its element (whether the pipe is still open then is a race)."""
        try:
            self._command_pipe.send(command)
        except (BrokenPipeError, OSError):
            self._process.join()
            raise AssertionError("An error occurred in the data fetcher")

    def _receive(self):
        try:
            return pickle.loads(self._data_pipe.recv_bytes())
        except (EOFError, OSError):
            self._process.join()
            raise AssertionError("An error occurred in the data fetcher")

    def resetIterator(self) -> None:
        if self._worker_started and not self._was_used:
            return
        if self._was_used and (not self._eof or not self._load_indefinitely):
            self._send(_HostCommand.ResetIterator)
            self.releaseElement()
            while self._receive()[0] != "reset":  # elements and an end of file sent before the reset
                pass
        self._eof = False
        self._send(_HostCommand.StartIterating)
        self._was_used = False
        self._worker_started = True

    def acquireElement(self):
        """The next element, or None at the end of the dataset (blocks while the worker loads it)."""
        if self._eof:
            return None
        message = self._receive()
        if message[0] == "eof":
            self._eof = True
            return None
        data = message[1]
        self._was_used = True
        self._locked = data
        if self._is_single_tensor:
            return data[0]
        if self._dict_keys:
            return dict(zip(self._dict_keys, data))
        return list(data)

    def releaseElement(self) -> None:
        if self._locked is None:
            return
        for tensor in self._locked:
            _poison(tensor)
        self._locked = None
        try:
            self._command_pipe.send(_HostCommand.Release)
        except (BrokenPipeError, OSError):
            pass


class _AsynchronousWorkerProcess:
    """The worker process (python/_dataloader.py _AsynchronousWorkerProcess): started by ``start`` with the
    sharing strategy's multiprocessing context; ``_mainLoop`` runs in the child."""

    _METHODS = {SharingStrategy.Fork: "fork", SharingStrategy.ForkServer: "forkserver"}  # else spawn

    def __init__(self, buffer_size: int, dataset, load_indefinitely: bool, sharing_strategy: SharingStrategy,
                 rebatched_size: Optional[int]) -> None:
        self._buffer_size = buffer_size
        self._dataset = dataset
        self.load_indefinitely = load_indefinitely
        self._sharing_strategy = sharing_strategy
        self._rebatched_size = rebatched_size
        self._process = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_process"] = None  # the child gets the dataset, not its own Process object
        return state

    @property
    def pid(self) -> int:
        return self._process.pid

    def isAlive(self) -> bool:
        return self._process.exitcode is None

    def join(self) -> None:
        self._process.join(timeout=10)
        if self.isAlive():
            os.kill(self._process.pid, signal.SIGINT)
            self._process.join(timeout=10)
        if self.isAlive():
            self._process.terminate()
            self._process.join()

    def start(self):
        if self._sharing_strategy != SharingStrategy.FileSystem:
            return self._start()
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "dataset.pkl")
            dataset = self._dataset
            with open(path, "wb") as f:
                pickle.dump(dataset, f, protocol=4)
            self._dataset = path
            try:
                return self._start()
            finally:
                self._dataset = dataset

    def _start(self):
        assert self._process is None, "Worker already started"
        ctx = torch.multiprocessing.get_context(self._METHODS.get(self._sharing_strategy, "spawn"))
        read_data_pipe, write_data_pipe = ctx.Pipe(duplex=False)
        read_command_pipe, write_command_pipe = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=self._mainLoop, args=(write_data_pipe, read_command_pipe))
        self._process.start()
        write_data_pipe.close()
        read_command_pipe.close()
        try:
            setup = pickle.loads(read_data_pipe.recv_bytes())
        except EOFError:
            pass
        else:
            write_command_pipe.send(_HostCommand.SetupComplete)
            return write_command_pipe, read_data_pipe, setup
        self._process.join()
        raise _py_error("AsynchronousDataAccessor worker thread failed to start (Check above for details)")

    # -- in the worker process ---------------------------------------------------------------------------

    def _mainLoop(self, conn, command_pipe) -> None:
        try:
            self._mainLoopNoInterrupt(conn, command_pipe)
        except KeyboardInterrupt:
            pass
        except (EOFError, BrokenPipeError, ConnectionResetError):  # the host is gone, or shut the worker down
            pass

    def _mainLoopNoInterrupt(self, conn, command_pipe) -> None:
        if isinstance(self._dataset, str):
            with open(self._dataset, "rb") as f:
                self._dataset = pickle.load(f)
        iterator = iter(self._dataset)
        drop_last = getattr(self._dataset, "rebatched_drop_last", True)
        try:
            first = next(iterator)
        except StopIteration:
            first = None
        if first is None:
            raise _py_error("The Dataset is empty")
        keys = list(first) if isinstance(first, dict) else []
        if os.environ.get(WORKER_LOG):
            _log_worker(self._sharing_strategy)
        pending = [_flat(first, keys)]  # the first element is the first iteration's
        conn.send_bytes(pickle.dumps((isinstance(first, torch.Tensor), keys), protocol=4))
        while True:  # stopped: wait for the host
            command = command_pipe.recv()
            if command == _HostCommand.Shutdown:
                return
            if command == _HostCommand.ResetIterator:
                iterator, pending = iter(self._dataset), []
                conn.send_bytes(pickle.dumps(("reset",), protocol=4))
            elif command == _HostCommand.StartIterating:
                elements = _rebatched(itertools.chain(pending, (_flat(d, keys) for d in iterator)),
                                      self._rebatched_size, drop_last)
                outcome = self._load(conn, command_pipe, elements)
                if outcome == _HostCommand.Shutdown:
                    return
                iterator, pending = iter(self._dataset), []  # a new iterator after the end of file, or a reset
                if outcome == _HostCommand.ResetIterator:
                    conn.send_bytes(pickle.dumps(("reset",), protocol=4))
                elif not self.load_indefinitely:
                    iterator = None  # created again when the host asks for a reset
            # SetupComplete and Release while stopped: nothing to do

    def _load(self, conn, command_pipe, elements) -> Optional[_HostCommand]:
        """Send elements while the host has free slots; the end of file, or the command that stopped it."""
        free = self._buffer_size
        for fields in elements:
            while free == 0 or command_pipe.poll():
                command = command_pipe.recv()
                if command == _HostCommand.Release:
                    free += 1
                elif command in (_HostCommand.Shutdown, _HostCommand.ResetIterator):
                    return command
            conn.send_bytes(pickle.dumps(("element", fields), protocol=4))
            free -= 1
        conn.send_bytes(pickle.dumps(("eof",), protocol=4))
        return None
