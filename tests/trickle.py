"""A gRPC call whose request is trickled, a byte at a time, by a client that stays connected
(HTTP/2 by hand through `h2`: no gRPC client library sends a message in pieces)."""

from __future__ import annotations

import socket
import time

import h2.config
import h2.connection
import h2.events

DECLARED_BYTES = 1_000  # the request's length prefix: never reached, the request never whole


def trickle(target: str, method: str, every_s: float, timeout_s: float) -> str:
    """Open `method` on `target` (host:port, plaintext), send a request's 5-byte gRPC prefix
    declaring DECLARED_BYTES and then one byte every `every_s`, answering the server's pings and
    settings, until the server ends the call; return how: "reset" (RST_STREAM) or "status N"
    (trailers with grpc-status N). Raises TimeoutError after `timeout_s`."""
    host, port = target.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    with socket.create_connection((host, int(port))) as sock:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", method),
                                   (":authority", target), ("content-type", "application/grpc"),
                                   ("te", "trailers")])  # fmt: skip
        conn.send_data(stream, b"\0" + DECLARED_BYTES.to_bytes(4, "big"))
        sock.sendall(conn.data_to_send())
        sock.settimeout(every_s)
        sent = 0
        while time.monotonic() < deadline:
            try:
                received = sock.recv(65_536)
            except TimeoutError:
                received = None
            if received == b"":
                return "closed"
            for event in conn.receive_data(received) if received else ():
                if isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
                    return "reset"
                if isinstance(event, h2.events.TrailersReceived) and event.stream_id == stream:
                    status = dict(event.headers).get(b"grpc-status", b"?").decode()
                    return f"status {status}"
            if sent < DECLARED_BYTES - 1 and conn.local_flow_control_window(stream) > 0:
                conn.send_data(stream, b"\0")
                sent += 1
            sock.sendall(conn.data_to_send())
    raise TimeoutError(f"{method}: the server did not end the trickled call in {timeout_s} s")
