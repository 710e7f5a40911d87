"""Bearer-token authentication as a server interceptor (health checks stay open for probes)."""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable
from typing import Any

import grpc

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def _deny(handler: grpc.RpcMethodHandler, message: str, request_id: str) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as `handler` that answers UNAUTHENTICATED."""

    def abort(request: Any, context: grpc.ServicerContext) -> None:
        context.set_trailing_metadata((("x-request-id", request_id),))
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Requires `authorization: Bearer <token>` metadata, compared in constant time."""

    def __init__(self, token: str, on_denied: Callable[[str], None]) -> None:
        self._expected = f"Bearer {token}".encode()
        self._on_denied = on_denied

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        supplied, request_id = "", ""
        for key, value in handler_call_details.invocation_metadata:
            if key == "authorization":
                supplied = str(value)
            elif key == "x-request-id":
                request_id = str(value)[:128]
        if hmac.compare_digest(supplied.encode(), self._expected):
            return handler
        self._on_denied(method.rsplit("/", 1)[-1])
        reason = "missing" if not supplied else "wrong"
        return _deny(
            handler,
            f"authorization: expected 'Bearer <token>', got a {reason} token",
            request_id or uuid.uuid4().hex,
        )
