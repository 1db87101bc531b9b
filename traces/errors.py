"""Errors raised by the traces package for bad user input (the CLI front door turns them into exit status 2)."""
from __future__ import annotations


class TraceError(ValueError):
    """Bad trace input: a corrupt, truncated or inconsistent file, an unknown schema version, a bad parameter.

    The message is one line and names the file and the record (or key) at fault.
    """
