"""Errors the application turns into a one-line message (the convention: ipu_packing/errors.py).

`UserError` (and its subclasses) means the input is wrong: the command prints one line naming the
cause and exits with status 2, before anything is written. `TrainingError` means the run itself
stopped (for example it diverged): one line naming the last checkpoint that is finite throughout,
exit status 2; nothing non-finite is ever saved.
"""

from __future__ import annotations

from ..errors import ConfigError, UserError


class TrainingError(UserError):
    """The run stopped while training (non-finite loss or weights). Exit status 2."""


__all__ = ["ConfigError", "TrainingError", "UserError"]
