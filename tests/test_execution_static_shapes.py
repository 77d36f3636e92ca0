"""torch.compile(fullgraph=True, dynamic=False) compiles the packed training step once and
never again over an epoch of packs; the padded, variable-length alternative recompiles per new length.

Counts come from torch._dynamo's statistics with the "eager" backend: graph capture (which decides
recompilation) is the same for every backend, and eager skips code generation, keeping the test fast.
"""

from __future__ import annotations

import pytest
import torch

from ipu_packing.execution import ExecutionConfig
from ipu_packing.execution.static_shapes import count_compiled_graphs
from synthetic_packs import collate, trim_to_longest

from execution_fixtures import build_model, make_packs
from torch_features import requires_torch_compile

pytestmark = requires_torch_compile

MICRO, ACCUMULATION = 4, 2
CONFIG = ExecutionConfig(micro_batch_size=MICRO, gradient_accumulation=ACCUMULATION, torch_compile=True,
                         torch_compile_backend="eager")


def _epoch(packs, trim):
    step = MICRO * ACCUMULATION
    batches = [collate(packs[i : i + step]) for i in range(0, len(packs) - step + 1, step)]
    if trim:
        batches = [trim_to_longest(b) for b in batches]
    return [{k: torch.as_tensor(v) for k, v in b.items()} for b in batches]


def _count(batches):
    model = build_model()
    return count_compiled_graphs(model, torch.optim.SGD(model.parameters(), lr=0.01), batches, CONFIG)


def test_packed_epoch_compiles_once():
    batches = _epoch(make_packs(64, seed=3), trim=False)  # an epoch: 8 optimizer steps, 16 micro batches
    assert len(batches) == 8
    assert len({b["input_ids"].shape for b in batches}) == 1
    compiles = _count(batches)
    print("packed: %d optimizer steps, %d compiled graph(s)" % (len(batches), compiles))
    assert compiles == 1


@pytest.mark.slow
def test_padded_variable_length_recompiles():
    # The same kind of data unpacked (one sequence per row), each batch padded to its longest sequence.
    batches = _epoch(make_packs(32, seed=3, max_sequences_per_pack=1), trim=True)
    lengths = [b["input_ids"].shape[1] for b in batches]
    compiles = _count(batches)
    print("padded: %d optimizer steps, lengths %s, %d compiled graphs" % (len(batches), lengths, compiles))
    assert len(set(lengths)) > 1
    assert compiles == len(set(lengths))  # one graph per distinct padded length, reused on repeats
