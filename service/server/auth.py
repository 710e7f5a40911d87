"""Bearer tokens with roles, checked by a server interceptor (health checks stay open for probes).

A token's role says which methods it may call: `actor` trains and acts, `viewer` watches,
`admin` may do everything, Checkpoint, Restore and UpdateHyperparams included. The server keeps
sha256 hashes, not tokens: a token file holds one `<role> sha256:<hex>` line per token
(`trident token` writes them), and `server.auth_token`, the single shared token, is an admin
token. An unknown or missing token is UNAUTHENTICATED; a known one calling outside its role is
PERMISSION_DENIED.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from service.config import ConfigError, ServerConfig

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
SERVICE_PREFIX = "/trident.v1.TrainerService/"
EVERY_METHOD = frozenset({"Step", "StreamStep", "Interact", "Act", "Checkpoint", "Restore",
                          "ListCheckpoints", "GetStatus", "UpdateHyperparams"})  # fmt: skip
ROLES: dict[str, frozenset[str]] = {
    "actor": frozenset({"Act", "Step", "StreamStep", "Interact", "GetStatus"}),
    "viewer": frozenset({"GetStatus", "ListCheckpoints"}),
    "admin": EVERY_METHOD,
}
_LINE = re.compile(r"(?P<role>[a-z]+)\s+sha256:(?P<hex>[0-9a-f]{64})")


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def token_line(role: str, token: str) -> str:
    """The token file's line for `token` with `role`."""
    if role not in ROLES:
        raise ValueError(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
    return f"{role} sha256:{token_hash(token).hex()}"


def new_token() -> str:
    """32 random bytes, URL-safe, never starting with '-': a command line would read such a
    token as a flag (`--token -x...` is "expected one argument")."""
    while (token := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return token


@dataclass(frozen=True)
class TokenTable:
    """The known token hashes and their roles."""

    entries: tuple[tuple[bytes, str], ...]

    @classmethod
    def of(cls, server: ServerConfig) -> TokenTable | None:
        """The server's tokens: server.auth_token (admin) and server.auth_tokens_file's; None
        when neither is set. ConfigError naming the file and line of a malformed entry."""
        entries = []
        if server.auth_token:
            entries.append((token_hash(server.auth_token), "admin"))
        if server.auth_tokens_file:
            entries.extend(read_token_file(Path(server.auth_tokens_file)))
        return cls(tuple(entries)) if entries else None

    def role_of(self, token: str) -> str | None:
        """The role of `token`, or None. Every entry is compared, in constant time each."""
        supplied, role = token_hash(token), None
        for digest, entry_role in self.entries:
            if hmac.compare_digest(supplied, digest):
                role = entry_role
        return role


def read_token_file(path: Path) -> list[tuple[bytes, str]]:
    where = f"server.auth_tokens_file = {str(path)!r}"
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{where}: {error.strerror or error}; expected a readable file of "
                          "'<role> sha256:<hex>' lines (trident token writes them)") from None
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.fullmatch(line)
        if match is None or match["role"] not in ROLES:
            raise ConfigError(
                f"{where}, line {number}: expected '<role> sha256:<64 hex digits>' with a role "
                f"of {', '.join(ROLES)}, got {line[:80]!r}"
            )
        entries.append((bytes.fromhex(match["hex"]), match["role"]))
    if not entries:
        raise ConfigError(f"{where}: holds no token; expected '<role> sha256:<hex>' lines")
    return entries


def _deny(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str, request_id: str
) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as `handler` that answers `code`."""

    def abort(request: Any, context: grpc.ServicerContext) -> None:
        context.set_trailing_metadata((("x-request-id", request_id),))
        context.abort(code, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Requires `authorization: Bearer <token>` of a known token whose role allows the method.
    `on_denied(method, code)` counts each refusal."""

    def __init__(
        self, tokens: TokenTable, on_denied: Callable[[str, grpc.StatusCode], None]
    ) -> None:
        self._tokens = tokens
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
        scheme, _, token = supplied.partition(" ")
        role = self._tokens.role_of(token) if scheme == "Bearer" and token else None
        name = method.rsplit("/", 1)[-1]
        if role is None:
            code = grpc.StatusCode.UNAUTHENTICATED
            reason = "missing" if not supplied else "wrong"
            message = f"authorization: expected 'Bearer <token>', got a {reason} token"
        elif not method.startswith(SERVICE_PREFIX) or name in ROLES[role]:
            return handler  # TrainerService methods by role; reflection for any known token
        else:
            code = grpc.StatusCode.PERMISSION_DENIED
            allowed = ", ".join(sorted(ROLES[role]))
            message = (f"authorization: a token of role {role!r} may call {allowed}; "
                       f"not {name} (an admin token may)")  # fmt: skip
        self._on_denied(name, code)
        return _deny(handler, code, message, request_id or uuid.uuid4().hex)
