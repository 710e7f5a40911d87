"""Trident: a reinforcement-learning trainer with a gRPC service around it."""

from importlib.metadata import PackageNotFoundError, version


def trident_version() -> str:
    """The installed distribution's version; "unknown" when run from a tree never installed."""
    try:
        return version("trident")
    except PackageNotFoundError:
        return "unknown"
