"""Errors the application turns into a one-line message (the convention: ipu_packing/errors.py).

`UserError` (and its subclasses) means the input is wrong: the command prints one line naming the
cause and exits with status 2, before anything is written. `TrainingError` means the run itself
failed (for example a non-finite loss): one line, exit status 1, the last good checkpoint kept.
"""

from __future__ import annotations

from ..errors import UserError


class ConfigError(UserError):
    """A config file or override is wrong; the message names the key."""


class TrainingError(UserError):
    """The run failed while training (non-finite loss). Exit status 1."""

    exit_code = 1


__all__ = ["ConfigError", "TrainingError", "UserError"]
