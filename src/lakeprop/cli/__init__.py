"""The ``lakeprop`` command: :func:`main` with the verbs of :mod:`.jobs`, :mod:`.search`,
:mod:`.bulk` and :mod:`.ops`."""

from __future__ import annotations

from lakeprop.cli.main import main, parser

__all__ = ["main", "parser"]
