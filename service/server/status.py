"""The one table from domain errors to gRPC status codes, and the one from the errors that
refuse a rollout to the reason its drop is counted under."""

from __future__ import annotations

import grpc

from service import errors
from service.step_ledger import AHEAD

STATUS_OF: dict[type[Exception], grpc.StatusCode] = {
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.CheckpointNotFound: grpc.StatusCode.NOT_FOUND,
    errors.CheckpointCorrupt: grpc.StatusCode.DATA_LOSS,
    errors.CheckpointIncompatible: grpc.StatusCode.FAILED_PRECONDITION,
    errors.CheckpointDiskFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.StalePolicy: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ForgottenStepKey: grpc.StatusCode.FAILED_PRECONDITION,
    errors.KeyReused: grpc.StatusCode.ALREADY_EXISTS,
    errors.InferenceOnly: grpc.StatusCode.FAILED_PRECONDITION,
    errors.QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.OverLimit: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Abandoned: grpc.StatusCode.CANCELLED,
}


def status_of(error: Exception) -> grpc.StatusCode | None:
    """The status a domain error maps to; None for anything else (an internal error)."""
    for kind, code in STATUS_OF.items():
        if isinstance(error, kind):
            return code
    return None


# trident_rollouts_dropped_total's reasons; a StalePolicy is "behind" or "ahead" (its message
# says which: older than train.max_policy_lag allows, or newer than the server's state)
DROP_REASONS: dict[type[Exception], str] = {
    errors.Abandoned: "abandoned",  # its caller left before its Step started
    errors.Unavailable: "shutdown",  # still queued when a drain's grace ran out
    errors.KeyReused: "key_reused",
    errors.ForgottenStepKey: "key_forgotten",
}
REASONS = ("behind", "ahead", *DROP_REASONS.values())


def drop_reason(error: BaseException) -> str | None:
    """Why a rollout was not trained on (one of REASONS); None for an error that refuses no
    rollout for itself (bad input, an internal error)."""
    if isinstance(error, errors.StalePolicy):
        return "ahead" if AHEAD in str(error) else "behind"
    for kind, reason in DROP_REASONS.items():
        if isinstance(error, kind):
            return reason
    return None
