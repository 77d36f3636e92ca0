"""Fixtures shared across test modules (pytest finds them here; no test module imports another's)."""

from __future__ import annotations

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
