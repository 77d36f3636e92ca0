"""The PopTorch stand-in's DataLoader against what graphcore/poptorch's python/__init__.py (DataLoader,
AsynchronousDataAccessor) and python/_dataloader.py (the worker process) do: Sync reads in this process;
Async and AsyncRebatched read in a worker process started with the sharing strategy's start method
(forkserver by default), which gets the loader and its dataset pickled; the item is the combined batch
(micro x device iterations x replicas x accumulation), rebatched by the worker for AsyncRebatched; an element
is valid until the next is asked for; a worker that dies gives PopTorch's errors.

The datasets come from tests/stand_in_datasets.py, which a worker imports cheaply."""

from __future__ import annotations

import inspect
import os
import time

import pytest
import torch

import poptorch_stand_in as si
import stand_in_datasets as sd


@pytest.fixture
def poptorch(monkeypatch):
    pt = si.install(monkeypatch)
    yield pt
    si.end_workers(pt)


def _options(poptorch, replicas=2, accumulation=3, iterations=2):
    opts = poptorch.Options()
    opts.replicationFactor(replicas)
    opts.Training.gradientAccumulation(accumulation)
    opts.deviceIterations(iterations)
    return opts


def _rows(batches):
    return [b[:, 0].tolist() if b.dim() > 1 else b.tolist() for b in batches]


def test_the_names_are_poptorch_s(poptorch):
    params = {n.split(".", 1)[1] for n in poptorch.API["param"] if n.startswith("AsynchronousDataAccessor.")}
    assert set(inspect.signature(poptorch.AsynchronousDataAccessor).parameters) == params
    params = {n.split(".", 1)[1] for n in poptorch.API["param"] if n.startswith("DataLoader.")}
    # __init__'s: on Python 3.8 the signature of a typing.Generic subclass is Generic.__new__'s (*args, **kwds)
    assert set(inspect.signature(poptorch.DataLoader.__init__).parameters) - {"self", "kwargs"} == params
    assert list(poptorch.SharingStrategy.__members__) == ["SharedMemory", "FileSystem", "Fork", "ForkServer"]
    default = inspect.signature(poptorch.AsynchronousDataAccessor).parameters["sharing_strategy"].default
    assert default is poptorch.SharingStrategy.ForkServer  # python/__init__.py:551-552


@pytest.mark.serial
@pytest.mark.slow
def test_sync_reads_here_async_reads_in_a_worker_started_by_the_sharing_strategy(poptorch, monkeypatch):
    monkeypatch.setattr(sd, "MARK", 7)  # what a forked worker inherits and a fresh interpreter does not
    opts = _options(poptorch)
    combined = 2 * 2 * 3 * 2
    data = sd.Where(2 * combined)
    (first, second) = list(poptorch.DataLoader(opts, data, batch_size=2))
    assert first.shape == (combined, 4) and set(first[:, 1].tolist()) == {os.getpid()}  # read here
    assert first[:, 3].tolist() == [7] * combined
    cases = {  # strategy: (the worker's parent is this process, the worker has this process's memory)
        None: (False, False),  # the default, ForkServer: the forkserver's child, a fresh interpreter
        poptorch.SharingStrategy.Fork: (True, True),
        poptorch.SharingStrategy.SharedMemory: (True, False),  # spawn
    }
    for strategy, (our_child, forked) in cases.items():
        async_options = {} if strategy is None else {"sharing_strategy": strategy}
        loader = poptorch.DataLoader(opts, data, batch_size=2, mode=poptorch.DataLoaderMode.Async,
                                     async_options=async_options)
        worker = loader._accessor.worker_pid
        got = [b.clone() for b in loader]
        assert _rows(got) == _rows([first, second]), strategy
        assert {int(p) for b in got for p in b[:, 1]} == {worker} and worker != os.getpid()
        (parent,) = {int(p) for b in got for p in b[:, 2]}
        assert (parent == os.getpid()) is our_child, strategy
        assert int(got[0][0, 3]) == (7 if forked else 0), strategy
        loader.terminate()
    # with torch workers of its own: they read, in the worker's child processes (started by the worker's
    # own start method, forkserver), and the worker puts their batches together in order
    loader = poptorch.DataLoader(opts, data, batch_size=2, num_workers=2,
                                 mode=poptorch.DataLoaderMode.AsyncRebatched)
    worker = loader._accessor.worker_pid
    got = [b.clone() for b in loader]
    assert _rows(got) == _rows([first, second])
    readers = {int(p) for b in got for p in b[:, 1]}
    assert len(readers) == 2 and worker not in readers and os.getpid() not in readers


def test_the_item_is_the_combined_batch_rebatched_by_the_worker(poptorch):
    opts = _options(poptorch)  # combined batch: 2 micro x 2 iterations x 2 replicas x 3 accumulation = 24
    data = sd.Where(3 * 24 + 5)
    Mode = poptorch.DataLoaderMode
    sync = poptorch.DataLoader(opts, data, batch_size=2)
    assert sync.combinedBatchSize == 24 and len(sync) == 3
    expected = _rows(sync)
    assert expected == [list(range(24)), list(range(24, 48)), list(range(48, 72))]  # the short rest dropped
    for mode, kwargs in ((Mode.Async, {}), (Mode.AsyncRebatched, {}),
                         (Mode.AsyncRebatched, {"rebatched_worker_size": 5})):
        loader = poptorch.DataLoader(opts, data, batch_size=2, mode=mode, **kwargs)
        assert len(loader) == 3 and _rows(b.clone() for b in loader) == expected, (mode, kwargs)
    # without drop_last the worker hands out the short rest as a last, smaller element
    loader = poptorch.DataLoader(opts, data, batch_size=2, mode=Mode.AsyncRebatched, drop_last=False,
                                 rebatched_worker_size=5)
    assert loader.batch_size == 5 and loader.rebatched_drop_last is False
    assert len(loader) == 4 and _rows(b.clone() for b in loader) == expected + [list(range(72, 77))]
    # an iterable dataset: the torch side batches 24, the worker cuts the stream into combined batches
    loader = poptorch.DataLoader(opts, sd.Counting(60), batch_size=2, mode=Mode.AsyncRebatched,
                                 rebatched_worker_size=7)
    assert _rows(b.clone() for b in loader) == [list(range(24)), list(range(24, 48))]


def test_an_element_is_valid_until_the_next_one_is_asked_for(poptorch):
    opts = _options(poptorch, replicas=1, accumulation=1, iterations=1)
    loader = poptorch.DataLoader(opts, sd.Fields(12), batch_size=4, mode=poptorch.DataLoaderMode.AsyncRebatched)
    batches = iter(loader)
    kept = next(batches)
    assert kept["ids"][:, 0].tolist() == [0, 1, 2, 3] and kept["weight"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
    following = next(batches)
    # released: PopTorch's worker may overwrite that memory from now on (the stand-in does at once)
    assert kept["ids"].eq(torch.iinfo(torch.int32).min).all() and kept["weight"].isnan().all()
    assert following["ids"][:, 0].tolist() == [4, 5, 6, 7]
    last = next(batches)
    with pytest.raises(StopIteration):
        next(batches)
    assert last["ids"].eq(torch.iinfo(torch.int32).min).all()


def test_each_iteration_starts_the_dataset_again(poptorch):
    opts = _options(poptorch, replicas=1, accumulation=1, iterations=1)
    loader = poptorch.DataLoader(opts, sd.Where(12), batch_size=3, mode=poptorch.DataLoaderMode.AsyncRebatched)
    whole = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert _rows(b.clone() for b in loader) == whole
    assert _rows(b.clone() for b in loader) == whole  # after the end of the dataset
    batches = iter(loader)
    assert next(batches)[:, 0].tolist() == [0, 1, 2]
    assert next(batches)[:, 0].tolist() == [3, 4, 5]
    assert _rows(b.clone() for b in loader) == whole  # stopped early: the worker is reset


def _wait_gone(pid: int) -> None:
    """Until the process is gone (its parent, the forkserver, reaps it)."""
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError("worker %d still there after 120 s" % pid)


def test_a_worker_that_dies_gives_poptorch_s_errors(poptorch):
    opts = _options(poptorch, replicas=1, accumulation=1, iterations=1)
    Mode = poptorch.DataLoaderMode
    for data in (sd.Broken(8, raise_at=0), sd.Broken(8, exit_at=1), sd.Where(0)):  # before its first element
        with pytest.raises(poptorch.Error, match="AsynchronousDataAccessor worker thread failed to start"):
            poptorch.DataLoader(opts, data, batch_size=2, mode=Mode.Async)
    loader = poptorch.DataLoader(opts, sd.Broken(8, exit_at=5), batch_size=2, mode=Mode.Async)
    batches = iter(loader)
    assert next(batches).tolist() == [[0], [1]]
    with pytest.raises(AssertionError, match="An error occurred in the data fetcher"):
        for _ in batches:
            pass
    # the same when the worker is gone before the host asks for the rest: the command finds its pipe closed
    loader = poptorch.DataLoader(opts, sd.Broken(8, exit_at=5), batch_size=2, mode=Mode.Async)
    batches = iter(loader)
    assert next(batches).tolist() == [[0], [1]]
    _wait_gone(loader._accessor.worker_pid)
    with pytest.raises(AssertionError, match="An error occurred in the data fetcher"):
        for _ in batches:
            pass
    with pytest.raises(AssertionError, match="rebatched_size must be None or greater than 1"):
        poptorch.DataLoader(opts, sd.Where(4), batch_size=1, mode=Mode.AsyncRebatched)  # a combined batch of 1
