"""Fixtures shared across test modules (pytest finds them here; no test module imports another's)."""

from __future__ import annotations

import os

import pytest

from default_data import prepare_default


@pytest.fixture(scope="session")
def default_data_128(tmp_path_factory):
    """The default corpus prepared at S=128, K=3 (tests/default_data.py): its packed directory."""
    return prepare_default(str(tmp_path_factory.mktemp("default") / "s128"), 128)


@pytest.fixture(scope="session")
def default_data_512(tmp_path_factory):
    """The same at S=512."""
    return prepare_default(str(tmp_path_factory.mktemp("default") / "s512"), 512)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """The tiny prepared dataset, app_fixtures.write_prepared's defaults (S=32, K=3, V=64, 96 sequences, seed 0): its
    root, holding packed/ and padded/. Shared by every test of the session (of the xdist worker): never written
    to; a test that changes it copies it to its tmp_path first (checked when the session ends)."""
    import app_fixtures as fx

    root = fx.write_prepared(str(tmp_path_factory.mktemp("tiny_data")))
    before = fx.snapshot(root)
    yield root
    assert fx.snapshot(root) == before, "a test wrote into the session's tiny_data: copy it first"


@pytest.fixture(scope="session")
def demo_task(tmp_path_factory):
    """The embedded demo classification task prepared with the default vocabulary at S=64, K=6 (train, validation
    and test splits, each packed and padded): its root. Never written to (checked when the session ends)."""
    import app_fixtures as fx

    root = fx.prepare_demo_task(str(tmp_path_factory.mktemp("task") / "demo"))
    before = fx.snapshot(root)
    yield root
    assert fx.snapshot(root) == before, "a test wrote into the session's demo_task: copy it first"


@pytest.fixture(scope="session")
def qa_demo_task(tmp_path_factory):
    """The embedded demo question-answering task prepared with the default vocabulary at S=64, doc stride 16, max
    query length 32, K=4 (train and validation, each packed and padded): its root. Never written to (checked when
    the session ends)."""
    import app_fixtures as fx

    root = fx.prepare_qa_demo_task(str(tmp_path_factory.mktemp("qa") / "demo"))
    before = fx.snapshot(root)
    yield root
    assert fx.snapshot(root) == before, "a test wrote into the session's qa_demo_task: copy it first"


@pytest.fixture(scope="session")
def data_dir(tiny_data):
    """tiny_data, by the name the training tests give the dataset they train on (data.dir=...)."""
    return tiny_data


@pytest.fixture(scope="session")
def poprun_data(tmp_path_factory):
    """A larger tiny dataset for the PopRun tests (240 sequences, else write_prepared's defaults): an epoch of
    several steps of every instance's share. Never written to."""
    import app_fixtures as fx

    root = fx.write_prepared(str(tmp_path_factory.mktemp("poprun_data")), num_sequences=240)
    before = fx.snapshot(root)
    yield root
    assert fx.snapshot(root) == before, "a test wrote into the session's poprun_data: copy it first"


@pytest.fixture(scope="session")
def tiny_run(tiny_data, tmp_path_factory):
    """One finished tiny training run on tiny_data, trained once per session: the demo config with
    app_fixtures.TINY, training.steps=4 and checkpoint.every_steps=2 (app_fixtures.TINY_RUN), on one torch thread.
    It holds checkpoints/step_0000002.pt and step_0000004.pt, metrics.jsonl, config.json, summary.json and the
    export final/. Never written to: a test that changes it (resumes it, removes a file) copies it to its
    tmp_path first (checked when the session ends)."""
    import torch

    import app_fixtures as fx
    from ipu_packing.train.cli import main

    run = str(tmp_path_factory.mktemp("tiny_run") / "run")
    threads = torch.get_num_threads()
    try:
        code, out, err = fx.captured(main, fx.tiny_run_args(tiny_data, run))
    finally:
        torch.set_num_threads(threads)
    assert code == 0, err
    before = fx.snapshot(run)
    yield run
    assert fx.snapshot(run) == before, "a test wrote into the session's tiny_run: copy it first"


@pytest.fixture
def pack_inputs(tmp_path):
    """`pack`'s inputs in tmp_path (tests/existing_datasets.py): {"vocab": vocab.txt, "hdf5": an NVIDIA HDF5 file of
    40 instances, "root": tmp_path}."""
    from existing_datasets import make_instances, write_hdf5, write_vocab

    vocab = write_vocab(str(tmp_path / "vocab.txt"))
    hdf5 = write_hdf5(str(tmp_path / "data.hdf5"), make_instances(40, seed=3))
    return {"vocab": vocab, "hdf5": hdf5, "root": tmp_path}


@pytest.fixture
def one_thread():
    """torch on one thread for the test (the killed subprocesses of the loop tests run with OMP_NUM_THREADS=1:
    the same reductions). Not autouse here: the modules that want it name it in ``pytestmark``."""
    import torch  # here, not at the top: the conftest stays as light as the tests that need none of this

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def poptorch(monkeypatch):
    """The PopTorch stand-in (tests/fake_poptorch), fresh, as ``poptorch`` in sys.modules for one test; the
    workers its asynchronous DataLoaders started are ended after it."""
    import poptorch_stand_in as si  # here, not at the top: it imports transformers, which most tests do not need

    pt = si.install(monkeypatch)  # with its directory on sys.path: an asynchronous loader's worker imports it
    yield pt
    si.end_workers(pt)


@pytest.fixture
def popdist(poptorch, monkeypatch):
    """The PopDist stand-in (tests/fake_popdist) on the PopTorch stand-in, no PopRun environment inherited."""
    import popdist_stand_in as pds

    for name in list(os.environ):
        if name.startswith("POPDIST_") or name.startswith("OMPI_COMM_WORLD"):
            monkeypatch.delenv(name)
    return pds.install(monkeypatch)


@pytest.fixture
def horovod(popdist, monkeypatch, tmp_path):
    """The Horovod stand-in, its collectives through tmp_path/network (no run directory)."""
    import popdist_stand_in as pds

    return pds.install_horovod(monkeypatch, str(tmp_path / "network"))


def pytest_collection_modifyitems(config, items):
    """The modules that hold a test marked slow run first, each module's tests together and in their order (its
    module fixtures are built once): xdist's two workers take the long tests early and finish together, neither
    left alone at the end with a long last test (docs/walkthrough.md's run is the last module by name)."""
    modules = {}
    for item in items:
        module = modules.setdefault(item.nodeid.split("::")[0], [len(modules), False])
        module[1] = module[1] or item.get_closest_marker("slow") is not None
    serial_modules = set()
    for item in items:  # make test's serial pass collects only the modules whose text marks a test serial
        if item.get_closest_marker("serial") is not None and str(item.path) not in serial_modules:
            if "pytest.mark.serial" not in item.path.read_text(encoding="utf-8"):
                raise pytest.UsageError("%s is marked serial without 'pytest.mark.serial' in its module: make test's "
                                        "serial pass would not collect it" % item.nodeid)
            serial_modules.add(str(item.path))
    order = {item.nodeid: i for i, item in enumerate(items)}
    items.sort(key=lambda item: (not modules[item.nodeid.split("::")[0]][1],
                                 modules[item.nodeid.split("::")[0]][0], order[item.nodeid]))


@pytest.fixture(scope="module", autouse=True)
def frozen_heap():
    """At each module's start, what is alive (torch, transformers, the session's fixtures) moves to the collector's
    permanent generation (after a collection, so no garbage goes with it): later collections scan only what the
    module made. Every command run in-process here that fails ends with a full gc.collect() (errors.run_command:
    the failed work's finalisers run while their noise is silenced); on a test process's heap that cost 0.2 to
    0.6 s a failure, in a one-command process it costs milliseconds. Nothing a test checks depends on it."""
    import gc

    gc.collect()
    gc.freeze()
    yield
