"""The errors a lineage question can end in, which every part of the query tier raises and every caller (the CLI,
the HTTP API, ``LineageClient``) turns into its own answer: ``LineageError`` for a question that cannot be answered
as asked, ``UnknownRow`` for a row the store does not hold."""

from __future__ import annotations


class LineageError(ValueError):
    """A lineage question that cannot be answered as asked (unknown rid, bad bound…)."""


class UnknownRow(LineageError):
    """The row asked about is not in the store: not captured, or not indexed yet."""
