"""Pinned bytes: `prepare` of the embedded default corpus gives the same packed shards on every machine.

The shards depend on the corpus (built from the running Python's standard library), the vocabulary
(trained by the tokenizers library), the plan (pinned on its own in tests/test_packing_hashes.py), the
instance recipe and the assignment. tests/default_data.py skips, naming it, where the stack differs from the
one these were taken on (another Python, another tokenizers), and fails where the pinned stack gives other
bytes. `--workers` does not change the bytes (tests/test_data_scale.py), nor does `--no-padded` the packed ones.

Regenerate only after an intended change to the data (and say why in the commit message):

    python -m pytest -q -s tests/test_data_hashes.py      # prints each fingerprint as JSON; paste into PINNED
"""

from __future__ import annotations

import json

import pytest

from default_data import check_inputs, fingerprint

PINNED = {
    128: {"python": "3.11.7", "corpus_sha256": "a89c8aada67987762fdb77d7b482f0e49166f94dba7730e94abf700a20992b93",
          "vocab_checksum": "a97e1821af9912aa375fc8ae26c854b0411a18e01a4613d25e6f5ecd52de3c22",
          "plan_sha256": "1fd634209ae052392ce35ef83d974d534d2f2c0444651805a4c0bb34c1bd2020", "num_packs": 36803,
          "shards_sha256": "77628d6db102cbaf90b1ebb367ed29e2e72978bfb6888d58d03c249d5cfb0b8f"},
    512: {"python": "3.11.7", "corpus_sha256": "a89c8aada67987762fdb77d7b482f0e49166f94dba7730e94abf700a20992b93",
          "vocab_checksum": "a97e1821af9912aa375fc8ae26c854b0411a18e01a4613d25e6f5ecd52de3c22",
          "plan_sha256": "75503bf31ba5db9e12492b0f58c6cd755459ae6b6c85afa8a766fd74993ef5e1", "num_packs": 9895,
          "shards_sha256": "a0dd37c4c398df40e0da9e254b45a27dc40e3ad0d6e008df1ce92522fe806b81"},
}


@pytest.mark.parametrize("size", [128, pytest.param(512, marks=pytest.mark.slow)])
def test_default_shards_are_pinned(size, request):
    got = fingerprint(request.getfixturevalue("default_data_%d" % size))
    print(json.dumps({size: got}))
    check_inputs(got, PINNED[size], "the pinned shards at S=%d" % size)
