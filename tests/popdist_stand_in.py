"""Loading the PopDist stand-in (tests/fake_popdist/popdist) and simulating poprun's instances.

Like the PopTorch stand-in it is on sys.path only during the test that installs it: ``install`` loads it from
its files as the package ``popdist`` (with ``popdist.poptorch``, built on the ``poptorch`` already in
sys.modules) for one test, and ``as_instance`` sets the environment poprun gives one instance. A subprocess
gets it with ``PYTHONPATH=STAND_IN_DIR``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

STAND_IN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_popdist")


def install(monkeypatch):
    """Load the stand-in as ``popdist`` + ``popdist.poptorch`` into sys.modules, and put STAND_IN_DIR on sys.path
    (for the worker processes of an asynchronous DataLoader, which unpickle the popdist Options), both undone
    after the test."""
    package_dir = os.path.join(STAND_IN_DIR, "popdist")
    spec = importlib.util.spec_from_file_location("popdist", os.path.join(package_dir, "__init__.py"),
                                                  submodule_search_locations=[package_dir])
    popdist = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "popdist", popdist)
    monkeypatch.syspath_prepend(STAND_IN_DIR)
    spec.loader.exec_module(popdist)
    sub = importlib.util.spec_from_file_location("popdist.poptorch", os.path.join(package_dir, "poptorch.py"))
    module = importlib.util.module_from_spec(sub)
    monkeypatch.setitem(sys.modules, "popdist.poptorch", module)
    sub.loader.exec_module(module)
    popdist.poptorch = module
    return popdist


@contextlib.contextmanager
def as_instance(popdist, num_instances: int, num_replicas: int, ipus_per_replica: int, instance: int):
    """The environment of instance ``instance`` of ``poprun --num-instances N --num-replicas R
    --ipus-per-replica I``, inside the block; the previous environment after it."""
    env = popdist.poprun_env(num_instances, num_replicas, ipus_per_replica, instance)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
