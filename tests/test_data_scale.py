"""Data preparation at scale: memory and open files are bounded by a shard, not by the corpus."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ipu_packing.data import open_dataset
from synthetic_corpus import write_bert_corpus, write_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_UNDER_LIMIT = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from ipu_packing.data.text.pipeline import PrepareConfig, prepare
from ipu_packing.data.write.datasets import PackingOptions
corpus, vocab, output, workers, group_tokens = sys.argv[1:6]
packing = PackingOptions(max_sequences_per_pack=3, workers=int(workers), shard_bytes=2048, progress=False)
result = prepare(PrepareConfig(input=corpus, output=output, vocab=vocab, max_seq_length=32, dupe_factor=2,
                               shard_chars=300, group_tokens=int(group_tokens), packing=packing))
print(json.dumps({"shards": result.packed["corpus"]["shards"], "packed": len(result.packed["shards"]),
                  "padded": len(result.padded["shards"])}))
"""


def _prepare_under_64_descriptors(tmp_path, name, workers, group_tokens):
    os.makedirs(str(tmp_path / "inputs"), exist_ok=True)
    corpus = write_bert_corpus(str(tmp_path / "inputs" / "corpus.txt"), documents=300)
    vocab = write_vocab(str(tmp_path / "inputs" / "vocab.txt"))
    output = str(tmp_path / name)
    proc = subprocess.run([sys.executable, "-c", _UNDER_LIMIT, corpus, vocab, output, str(workers), str(group_tokens)],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return output, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.serial
@pytest.mark.slow
def test_many_input_and_output_shards_under_a_64_descriptor_limit(tmp_path):
    # every input shard its own scatter group: far more spill files than descriptors
    output, counts = _prepare_under_64_descriptors(tmp_path, "out", workers=2, group_tokens=1)
    # far more input shards than descriptors, and more output shards than descriptors too
    assert counts["shards"] > 64 and counts["packed"] > 64 and counts["padded"] > 64, counts
    packed, padded = open_dataset(os.path.join(output, "packed")), open_dataset(os.path.join(output, "padded"))
    assert packed.manifest["num_sequences"] == padded.num_packs
    assert sum(int((packed[i]["sequence_ids"] > 0).sum()) for i in range(len(packed))) == packed.manifest["num_tokens"]
    # same bytes with one worker (this process alone) and all input shards in one scatter group
    again, _ = _prepare_under_64_descriptors(tmp_path, "again", workers=1, group_tokens=10 ** 9)
    for kind in ("packed", "padded"):
        for name in sorted(os.listdir(os.path.join(output, kind))):
            with open(os.path.join(output, kind, name), "rb") as a, open(os.path.join(again, kind, name), "rb") as b:
                assert a.read() == b.read(), (kind, name)


@pytest.mark.slow
def test_nsp_label_does_not_follow_from_length_on_the_default_corpus(tmp_path):
    from ipu_packing.data.text.pipeline import PrepareConfig, prepare
    from ipu_packing.data.write.datasets import PackingOptions

    output = str(tmp_path / "default")
    prepare(PrepareConfig(input="default", output=output,
                          packing=PackingOptions(workers=1, progress=False)))  # S=128, dupe 10
    padded = open_dataset(os.path.join(output, "padded"))
    lengths, is_next = [], []
    for shard in padded.manifest["shards"]:
        packs = np.load(os.path.join(output, "padded", shard["file"]), mmap_mode="r")
        lengths.append((np.asarray(packs["sequence_ids"]) > 0).sum(axis=1))
        is_next.append(np.asarray(packs["nsp_labels"])[:, 0] == 0)
    lengths, is_next = np.concatenate(lengths), np.concatenate(is_next)
    short = lengths < 16
    overall, among_short = is_next.mean(), is_next[short].mean()
    assert short.sum() > 300, short.sum()  # enough short sequences for the share to mean something
    assert abs(overall - 0.5) <= 0.02, overall
    assert abs(among_short - overall) <= 0.10, (among_short, overall)
