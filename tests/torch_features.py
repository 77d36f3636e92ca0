"""Which optional torch features this torch has, for tests that need them (skip, never fail, without).

The IPU path must run on what the last Poplar SDK ships (Python 3.8, torch 2.0.1, transformers 4.x);
docs/compat.md says how to run the suite there. Features newer than that stay optional:
- torch.compile (TorchDynamo): torch >= 2.0, and torch 2.0.x refuses Python >= 3.11;
- torch.distributed.pipelining: torch >= 2.4 (the runner raises a one-line error without it);
- FlexAttention: torch >= 2.5 (attention="flex" raises a one-line error without it).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Optional

import pytest
import torch


def _torch_compile_missing() -> Optional[str]:
    try:
        import torch._dynamo.eval_frame as eval_frame

        eval_frame.check_if_dynamo_supported()
    except Exception as error:  # ImportError, or RuntimeError("Python 3.11+ not yet supported ...") on 2.0.x
        return "torch.compile unavailable on torch %s, Python %d.%d: %s" % (
            torch.__version__, sys.version_info[0], sys.version_info[1], str(error).splitlines()[0])
    return None


def _module_missing(name: str, since: str) -> Optional[str]:
    try:
        found = importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package torch lacks (before torch.distributed.pipelining, say): torch's, not ours
        found = False
    return None if found else "%s needs torch >= %s, this is torch %s" % (name, since, torch.__version__)


TORCH_COMPILE_MISSING = _torch_compile_missing()
PIPELINING_MISSING = _module_missing("torch.distributed.pipelining", "2.4")

requires_torch_compile = pytest.mark.skipif(TORCH_COMPILE_MISSING is not None, reason=TORCH_COMPILE_MISSING or "")
