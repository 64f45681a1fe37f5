"""Errors of the fabric package."""


class FabricError(RuntimeError):
    """The fabric cannot be built on this host; the message says what is missing."""
