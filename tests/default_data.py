"""The embedded default corpus as the golden tests use it: prepared by the project's own command, and
the fingerprint of what the result depends on (tests/conftest.py makes the fixtures)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform

import pytest

REQUIREMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "requirements.txt")


def prepare_default(output: str, max_seq_length: int) -> str:
    """`prepare --input default --max-seq-length S --max-sequences-per-pack 3 --no-padded --workers 1
    --quiet` (the packed layout, which is what the demo reads): returns output/packed."""
    from ipu_packing.data.cli import main as data_main

    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        code = data_main(["prepare", "--input", "default", "--output", output, "--max-seq-length", str(max_seq_length),
                          "--max-sequences-per-pack", "3", "--no-padded", "--workers", "1", "--quiet"])
    assert code == 0, quiet.getvalue()[-2000:]
    return os.path.join(output, "packed")


def pinned(package: str):
    """The version requirements.txt pins for `package`."""
    with open(REQUIREMENTS) as f:
        for line in f:
            if line.startswith(package + "=="):
                return line.split("==", 1)[1].strip()
    return None


def fingerprint(packed: str) -> dict:
    """What a prepared default dataset depends on and what it is: the corpus (built from this Python's
    standard library), the vocabulary (trained by the tokenizers library), the plan and the shards' bytes."""
    from ipu_packing.packing import plan_packing

    with open(os.path.join(packed, "manifest.json")) as f:
        manifest = json.load(f)
    plan = plan_packing(manifest["sequence_length_histogram"], manifest["max_seq_length"],
                        manifest["max_sequences_per_pack"])
    shards = hashlib.sha256("".join(entry["sha256"] for entry in manifest["shards"]).encode()).hexdigest()
    return {"python": platform.python_version(), "corpus_sha256": manifest["corpus"]["sha256"],
            "vocab_checksum": manifest["vocab_checksum"], "plan_sha256": plan.sha256(),
            "num_packs": manifest["num_packs"], "shards_sha256": shards}


def check_inputs(got: dict, want: dict, what: str) -> None:
    """Skips, naming the difference, where the machine's stack (not the code) makes other data: another
    Python's standard library (another corpus), another tokenizers (another vocabulary). Fails where
    the pinned stack gives another vocabulary, plan or shards: that is the code."""
    import tokenizers

    if got["corpus_sha256"] != want["corpus_sha256"]:
        pytest.skip("the default corpus is built from Python %s's standard library here (sha256 %s); %s was taken "
                    "on Python %s's (sha256 %s)" % (got["python"], got["corpus_sha256"][:12], what, want["python"],
                                                    want["corpus_sha256"][:12]))
    if got["vocab_checksum"] != want["vocab_checksum"] and tokenizers.__version__ != pinned("tokenizers"):
        pytest.skip("tokenizers %s trains another default vocabulary than the pinned %s; %s is for that one"
                    % (tokenizers.__version__, pinned("tokenizers"), what))
    for key, why in (("vocab_checksum", "the default vocabulary changed on the pinned stack"),
                     ("plan_sha256", "the plan of the default corpus changed: the planner's determinism contract "
                                     "(docs/packing.md) is broken, or the planner changed"),
                     ("num_packs", "the number of packs changed"),
                     ("shards_sha256", "the packed shards' bytes changed (data recipe, assignment or format)")):
        assert got[key] == want[key], "%s: %s (%r, pinned %r)" % (what, why, got[key], want[key])
