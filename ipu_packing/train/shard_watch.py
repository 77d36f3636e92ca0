"""A dataset changed under a running job stops it in one line, not with SIGBUS.

The shards are memory-mapped (data/dataset.py). A shard shrunk in place under a running job makes the next
read of a page past its new end a SIGBUS, which Python cannot catch: the process dies with status 135 and no
word. So the training loop takes every shard's (size, mtime, inode) when it starts (`ShardWatch`) and
checks them again before each batch is fetched (`guarded`): a shard that changed (shrunk, grown, rewritten
in place or replaced) stops the run with one line naming it and the last checkpoint, before anything reads
it. The cost is one ``os.stat`` per shard and host call.

Not covered: a shard changed between that check and the reads of the same step, and reads in DataLoader
worker processes (data.num_workers > 0), which prefetch ahead of the check; a worker's SIGBUS then ends
the run with torch's "DataLoader worker ... killed by signal" instead.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, List, Optional, Tuple

from ..errors import UserError

Stat = Tuple[int, int, int]
"""(size in bytes, mtime in ns, inode)."""


def _stat(path: str) -> Optional[Stat]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (int(st.st_size), int(st.st_mtime_ns), int(st.st_ino))


class ShardWatch:
    """The dataset's shards as the run found them."""

    def __init__(self, data_path: str, shard_files: List[str]) -> None:
        self.data_path = data_path
        self.paths = [os.path.join(data_path, name) for name in shard_files]
        self.seen = [_stat(p) for p in self.paths]

    @classmethod
    def of(cls, data_path: str) -> "ShardWatch":
        """Every shard its manifest names (already validated when the dataset was opened)."""
        from ..data.format import read_manifest

        return cls(data_path, [str(s["file"]) for s in read_manifest(data_path)["shards"]])

    def changed(self) -> Optional[str]:
        """What changed, in words, or None."""
        for path, seen in zip(self.paths, self.seen):
            now = _stat(path)
            if now == seen:
                continue
            if now is None:
                return "shard %s was removed" % (path,)
            if seen is not None and now[0] != seen[0]:
                return "shard %s changed size (%d -> %d bytes)" % (path, seen[0], now[0])
            return "shard %s was rewritten (modification time or inode changed)" % (path,)
        return None

    def check(self, step: int, last_saved: Optional[str]) -> None:
        what = self.changed()
        if what is not None:
            raise UserError("%s while the run was training: it stopped after step %d, before reading it; the "
                            "last checkpoint is %s; restore the dataset (or prepare it again and start a new "
                            "run) and resume" % (what, step, last_saved or "none (none was written yet)"))


def guarded(batches: Iterator[Any], watch: Optional[ShardWatch], stop) -> Iterator[Any]:
    """``batches``, checking the shards before each one is fetched (``stop``: the StopRequests that know the
    step done and the last checkpoint)."""
    while True:
        if watch is not None:
            watch.check(stop.step, stop.last_saved)
        try:
            batch = next(batches)
        except StopIteration:
            return
        yield batch


__all__ = ["ShardWatch", "guarded"]
