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


class CheckpointDiskFull(TridentError):
    """A checkpoint could not be written: its volume has no space (ENOSPC) or quota (EDQUOT)
    left. Nothing was committed."""


class NoValidCheckpoint(TridentError):
    """A resume found checkpoints, none of which validates: starting fresh would abandon the
    line they hold."""


class QueueFull(TridentError):
    """The Step queue is full; the caller should back off and retry."""


class OverLimit(TridentError):
    """A request asks for more than a configured server limit allows (the message names the
    setting); nothing was allocated or changed."""


class StalePolicy(TridentError):
    """A rollout was collected too many policy versions ago to train on."""


class Unavailable(TridentError):
    """The server is starting up or draining and takes no new work."""


class InferenceOnly(TridentError):
    """The server holds no optimizer state: it answers Act, not training calls."""

    @classmethod
    def refusing(cls, what: str) -> InferenceOnly:
        """The refusal of call `what`."""
        return cls(f"{what}: this server is inference-only and answers Act alone")


class ForgottenStepKey(TridentError):
    """A Step's idempotency key is older than the server remembers: it cannot tell whether
    that Step was applied, so it applies nothing."""


class KeyReused(TridentError):
    """A Step came with an idempotency key the server holds for a Step of other content: not
    a retry, so it is neither answered from the ledger nor applied."""


class Abandoned(TridentError):
    """The caller went away (deadline or cancellation) before its Step started."""
