"""The one table from domain errors to gRPC status codes."""

from __future__ import annotations

import grpc

from service import errors

STATUS_OF: dict[type[Exception], grpc.StatusCode] = {
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.CheckpointNotFound: grpc.StatusCode.NOT_FOUND,
    errors.CheckpointCorrupt: grpc.StatusCode.DATA_LOSS,
    errors.CheckpointIncompatible: grpc.StatusCode.FAILED_PRECONDITION,
    errors.StalePolicy: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ForgottenStepKey: grpc.StatusCode.FAILED_PRECONDITION,
    errors.KeyReused: grpc.StatusCode.ALREADY_EXISTS,
    errors.InferenceOnly: grpc.StatusCode.FAILED_PRECONDITION,
    errors.QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Abandoned: grpc.StatusCode.CANCELLED,
}


def status_of(error: Exception) -> grpc.StatusCode | None:
    """The status a domain error maps to; None for anything else (an internal error)."""
    for kind, code in STATUS_OF.items():
        if isinstance(error, kind):
            return code
    return None
