"""The end of a process that torch.multiprocessing.spawn started for a test.

On torch 2.0.1 (the Poplar SDK's) a rank could block for ever in ``dist.destroy_process_group()`` after its
work was done and saved: py-spy showed a whole-suite run on Python 3.8 waiting there (gloo's default timeout
is 30 minutes), which is the suite's "hang in a spawned child". A rank whose results are on disk needs no
teardown, so it leaves at once: exit status 0 after its work, 1 (with the traceback) if it raised, which
torch.multiprocessing.spawn reports as the rank's failure."""

from __future__ import annotations

import os
import sys
import traceback


def leave_after(work, *args) -> None:
    """Run ``work(*args)`` in a spawned rank, then end the process without tearing torch.distributed down."""
    try:
        work(*args)
    except BaseException:  # noqa: B902  (reported as the rank's failure)
        traceback.print_exc()
        code = 1
    else:
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
