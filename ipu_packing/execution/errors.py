"""The execution package's user errors, in a leaf module: every backend raises them and none of the backends
imports another for them."""

from __future__ import annotations

from ..errors import UserError


class LaunchError(UserError):
    """The process was started in a way the config cannot run in (no CUDA, no torchrun, not under poprun)."""


class BackendUnavailable(UserError, RuntimeError):
    """The chosen backend cannot be imported here (poptorch or popdist without the Poplar SDK)."""


__all__ = ["BackendUnavailable", "LaunchError"]
