"""Fixtures shared across test modules (pytest finds them here; no test module imports another's)."""

from __future__ import annotations

import os
import sys

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
    """The PopTorch stand-in (tests/fake_poptorch), fresh, as ``poptorch`` in sys.modules for one test."""
    import poptorch_stand_in as si  # here, not at the top: it imports transformers, which most tests do not need

    pt = si.load_stand_in()
    monkeypatch.setitem(sys.modules, "poptorch", pt)
    return pt


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
