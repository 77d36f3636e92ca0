"""Errors the application turns into a one-line message.

`UserError` (and its subclasses) means the input is wrong: the command prints one line naming the
cause and exits with status 2, before anything is written. `TrainingError` means the run itself
failed (for example a non-finite loss): one line, exit status 1, the last good checkpoint kept.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad user input: a config, a dataset, a checkpoint. Exit status 2."""

    exit_code = 2


class ConfigError(UserError):
    """A config file or override is wrong; the message names the key."""


class TrainingError(Exception):
    """The run failed while training (non-finite loss). Exit status 1."""

    exit_code = 1
