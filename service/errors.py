"""Domain errors shared by the trainer, checkpoints and (later) the server's status mapping."""

from __future__ import annotations


class TridentError(Exception):
    """Base of every error Trident raises on purpose."""


class InvalidInput(TridentError):
    """A caller's input has the wrong shape, dtype, range or content; nothing was changed."""

    def __init__(self, field: str, expected: str, got: object) -> None:
        super().__init__(f"{field}: expected {expected}, got {got}")
        self.field = field
        self.expected = expected
        self.got = got


class BackendUnavailable(TridentError):
    """The requested compute backend cannot run here."""


class CheckpointNotFound(TridentError):
    """No committed checkpoint has that name."""


class CheckpointCorrupt(TridentError):
    """A checkpoint's files do not match its manifest, or the manifest is unreadable."""


class CheckpointIncompatible(TridentError):
    """A checkpoint was written for a different model shape or format version."""
