"""`trident serve`'s own flags for credentials, and what the client commands print against the
server they start: the auth mode without the token, a TLS mismatch and a busy port in one line."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SERVING, SMALL, running_server
from pki import Pki, make_pki

from service.testing.serverproc import ServerProcess, clean_env, serve_command, trident_cli

TOKEN = "token-from-a-file-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    """A server given its token and TLS pair by flags alone (no --set, no environment)."""
    directory = tmp_path_factory.mktemp("flags")
    (directory / "token").write_text(f"{TOKEN}\n")  # as `echo` writes it
    flags = ("--auth-token-file", "token", "--tls-cert", str(pki.server.cert),
             "--tls-key", str(pki.server.key))  # fmt: skip
    with running_server(directory, extra_args=flags) as running:
        yield running


def test_serve_takes_token_file_and_tls_flags(server: ServerProcess, pki: Pki) -> None:
    (serving,) = server.events("serving")
    assert serving["tls"] is True and serving["auth"] == "token"
    tls = ("--server", server.target, "--tls-ca", str(pki.ca.cert))
    status = trident_cli("status", *tls, "--token", TOKEN, "--json", "--config")
    assert status.returncode == 0, status.stderr
    assert TOKEN not in status.stdout
    shown = json.loads(status.stdout)
    assert shown["auth_mode"] == "token" and shown["auth_token_set"] is True
    assert not {"auth_token", "auth_mode"} & set(shown["config"]["server"])
    denied = trident_cli("status", *tls)
    assert denied.returncode == 1
    assert denied.stderr.startswith("trident: error: UNAUTHENTICATED: ")
    assert denied.stderr.endswith("(pass the server's token: --token or $TRIDENT_TOKEN)\n")


def test_plaintext_client_is_told_to_check_tls(server: ServerProcess) -> None:
    done = trident_cli("status", "--server", server.target, "--token", TOKEN, "--timeout", "10")
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"trident: error: cannot reach a Trident server at {server.target}")
    assert "a TLS server needs --tls-ca" in line


def serve_beside(
    server: ServerProcess, directory: Path, *flags: str
) -> subprocess.CompletedProcess[str]:
    """A second `trident serve` of the small model, with `flags` after its own."""
    command = serve_command(directory / "checkpoints", [*SMALL, *SERVING], flags)
    return subprocess.run(
        command, cwd=directory, env=clean_env(), capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("front_ends", [0, 2])
def test_busy_ports_are_one_line_each(
    server: ServerProcess, tmp_path: Path, front_ends: int
) -> None:
    """No gRPC core log line before Trident's own, exit 2; with front-end processes too, where
    the learner reserves the port for them first."""
    split = ("--set", f"server.front_ends={front_ends}")
    grpc_port = serve_beside(server, tmp_path, *split, "--port", str(server.port))
    assert grpc_port.returncode == 2
    assert grpc_port.stderr == (
        f"trident: error: server.host:server.port = 127.0.0.1:{server.port} (--host, --port): "
        "Address already in use; expected a free address to bind (stop what holds the port, or "
        "pick another --port; 0 picks a free one)\n"
    )
    metrics_port = serve_beside(server, tmp_path, *split, "--metrics-port",
                                str(server.metrics_port))  # fmt: skip
    assert metrics_port.returncode == 2
    assert metrics_port.stderr == (
        f"trident: error: server.metrics_port = {server.metrics_port} on 127.0.0.1 "
        "(--metrics-port): Address already in use; expected a free port (stop what holds it, "
        "or pick another --metrics-port; 0 picks a free one)\n"
    )
