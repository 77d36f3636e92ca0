"""Small datasets for the PopTorch stand-in's DataLoader tests (tests/test_poptorch_dataloader.py).

They live in a module of their own, importing only torch, because an asynchronous DataLoader's worker process
imports the module of the dataset it unpickles: a test module would bring pytest and the model with it.
"""

from __future__ import annotations

import os

import torch

MARK = 0
"""Set by a test in its own process: a forked worker sees the test's value, a spawned one the module's 0."""


class Where(torch.utils.data.Dataset):
    """Item i: [i, pid, parent pid, MARK] of the process that reads it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, os.getpid(), os.getppid(), MARK])


class Fields(torch.utils.data.Dataset):
    """Item i: a dict of an int32 and a float32 field, as the pack datasets serve them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"ids": torch.full((3,), i, dtype=torch.int32), "weight": torch.tensor([float(i)])}


class Broken(torch.utils.data.Dataset):
    """Item i raises at ``raise_at``; the reading process exits (no exception, as a crash) at ``exit_at``."""

    def __init__(self, n: int, raise_at: int = -1, exit_at: int = -1) -> None:
        self.n, self.raise_at, self.exit_at = n, raise_at, exit_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.raise_at:
            raise ValueError("item %d is broken" % i)
        if i == self.exit_at:
            os._exit(1)
        return torch.tensor([i])


class Counting(torch.utils.data.IterableDataset):
    """0, 1, ..., n - 1 as one-element tensors, batched by the torch loader: rebatched by the accessor."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return (torch.tensor([i]) for i in range(self.n))
