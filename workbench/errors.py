"""The one base class of the mistakes a person running the workbench can make and fix themselves.

A bad experiment file, a wrong flag, a folder that is not a checkpoint, a port already taken: none
is a bug, and a traceback would hide the one line that matters. Each domain raises its own subclass
where it lives (`config.ConfigError`, `model.checkpoint.CheckpointError`, `report.html.ReportError`)
and the CLI catches only this base: it prints the message (what is wrong and how to fix it, in a
line or two) and exits 2; `workbench --debug ...` prints the traceback too. Every other exception
is a bug and keeps its traceback.
"""

from __future__ import annotations


class UsageError(Exception):
    """A mistake in what the user gave (file, flag, path, port); the message says what and how to fix it."""
