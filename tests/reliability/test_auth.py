"""Authentication, every clause in one place, against real `trident serve` processes.

- A plaintext client against a TLS server fails (the server's TLS handshake refuses it).
- No token or a wrong one (any length, one character off, another scheme or its case) is
  UNAUTHENTICATED on every method and changes nothing; the comparison is hmac.compare_digest.
- Under mTLS a client certificate from an unknown CA, or none, fails the handshake.
- A misconfiguration (mTLS without a CA file, an unknown auth mode, ...) exits non-zero before
  binding the port, with a message that names the setting.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import SERVING, SMALL, random_rollout, running_server, wait_until
from pki import Pki, make_pki, status_error, tls_client

from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.client.client import TridentClient, step_request
from service.server.auth import (
    EVERY_METHOD,
    ROLES,
    BearerTokenInterceptor,
    TokenTable,
    new_token,
    token_hash,
)
from service.testing.serverproc import (
    ServerProcess,
    TlsFiles,
    clean_env,
    scrape,
    serve_command,
    trident_cli,
)

Code = grpc.StatusCode
TOKEN = secrets.token_urlsafe(24)  # fresh each run: 32 characters of [A-Za-z0-9_-]
HANDSHAKE_WAIT_S = 5.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# ------------------------------------------------------------------------------ tokens
def bad_authorizations() -> dict[str, str | None]:
    """`authorization` values that must all be refused (None: no such metadata at all)."""
    last = TOKEN[-1]
    return {
        "no token": None,
        "empty value": "",
        "empty bearer": "Bearer ",
        "scheme only": "Bearer",
        "another token": f"Bearer {secrets.token_urlsafe(24)}",
        "last character differs": f"Bearer {TOKEN[:-1]}{'A' if last != 'A' else 'B'}",
        "one character short": f"Bearer {TOKEN[:-1]}",
        "one character long": f"Bearer {TOKEN}{last}",
        "twice the token": f"Bearer {TOKEN}{TOKEN}",
        "lower-case scheme": f"bearer {TOKEN}",
        "upper-case scheme": f"BEARER {TOKEN}",
        "two spaces": f"Bearer  {TOKEN}",
        "no scheme": TOKEN,
        "basic scheme": f"Basic {TOKEN}",
    }


def every_method(
    stub: pb_grpc.TrainerServiceStub, rng: np.random.Generator
) -> dict[str, Callable[..., object]]:
    """One well-formed call per TrainerService method (metadata passed through)."""
    rollout = random_rollout(rng)
    obs = encode(rng.standard_normal((2, 6)).astype(np.float32))
    start = pb.InteractStart(actor_id="auth", rollout_len=4, group_envs=[2])
    opening = pb.InteractRequest(start=start, obs=obs)
    return {
        "GetStatus": lambda **kw: stub.GetStatus(pb.GetStatusRequest(), **kw),
        "ListCheckpoints": lambda **kw: stub.ListCheckpoints(pb.ListCheckpointsRequest(), **kw),
        "Act": lambda **kw: stub.Act(pb.ActRequest(obs=obs, mode=pb.ACT_MODE_SAMPLE), **kw),
        "Step": lambda **kw: stub.Step(step_request(rollout), **kw),
        "StreamStep": lambda **kw: list(
            stub.StreamStep(iter([pb.StreamStepRequest(step=step_request(rollout))]), **kw)
        ),
        "Interact": lambda **kw: list(stub.Interact(iter([opening]), **kw)),
        "Checkpoint": lambda **kw: stub.Checkpoint(pb.CheckpointRequest(name="denied"), **kw),
        "Restore": lambda **kw: stub.Restore(pb.RestoreRequest(name="denied"), **kw),
        "UpdateHyperparams": lambda **kw: stub.UpdateHyperparams(
            pb.UpdateHyperparamsRequest(values={"optim.lr": 1.0}), **kw
        ),
    }


def denials(server: ServerProcess) -> float:
    """UNAUTHENTICATED answers counted by the server, over all methods."""
    return sum(
        count
        for (name, labels), count in scrape(server).items()
        if name == "trident_rpc_errors_total" and ("code", "UNAUTHENTICATED") in labels
    )


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("token")
    with running_server(directory, "server.auth_mode=token", token=TOKEN) as server:
        yield server


def test_bad_tokens_are_unauthenticated_on_every_method(
    token_server: ServerProcess, rng: np.random.Generator, capsys: pytest.CaptureFixture[str]
) -> None:
    with TridentClient(token_server.target, token=TOKEN) as client:
        before = client.status()
    counted = denials(token_server)
    sent = 0
    with grpc.insecure_channel(token_server.target) as channel:
        calls = every_method(pb_grpc.TrainerServiceStub(channel), rng)
        for case, authorization in bad_authorizations().items():
            metadata = [] if authorization is None else [("authorization", authorization)]
            reason = "missing" if not authorization else "wrong"
            for method, call in calls.items():
                with pytest.raises(grpc.RpcError) as caught:
                    call(metadata=metadata, timeout=10)
                sent += 1
                error = caught.value
                assert error.code() == Code.UNAUTHENTICATED, (case, method, error.details())
                assert f"got a {reason} token" in error.details(), (case, method, error.details())
                assert TOKEN[:8] not in error.details(), (case, method)
    assert denials(token_server) == counted + sent
    with TridentClient(token_server.target, token=TOKEN) as client:
        after = client.status()
        assert (after.param_digest, after.global_step) == (before.param_digest, before.global_step)
        assert not client.list_checkpoints()
        reply = client.step(random_rollout(rng))
        assert reply.global_step == before.global_step + 1
    with capsys.disabled():
        print(
            f"\n[auth] {len(bad_authorizations())} bad authorizations x {len(calls)} methods: "
            f"{sent} calls, all UNAUTHENTICATED and counted; the right token then steps"
        )


def test_token_never_leaves_the_server(token_server: ServerProcess) -> None:
    """GetStatus, UpdateHyperparams and a checkpoint's config.json carry no credential, not even
    a blank one; GetStatus says which authentication is on instead."""
    with TridentClient(token_server.target, token=TOKEN) as client:
        status = client.status()
        assert status.auth_mode == "token" and status.auth_token_set
        status_config = json.loads(status.config_json)
        hyper_config = json.loads(client.update_hyperparams({"optim.lr": 3e-4}))
        info = client.checkpoint("no-secrets")
    saved = (token_server.checkpoint_dir / info.name / "config.json").read_text()
    for config in (status_config, hyper_config, json.loads(saved)):
        assert not {"auth_token", "auth_mode"} & set(config["server"])
    for root, _dirs, files in os.walk(token_server.checkpoint_dir):
        for name in files:
            assert TOKEN.encode() not in (Path(root) / name).read_bytes(), name
    with TridentClient(token_server.target, token=TOKEN) as client:
        client.restore(info.name)  # the running server keeps its own credentials
        assert client.status().global_step >= 0
    with TridentClient(token_server.target) as client, pytest.raises(grpc.RpcError) as caught:
        client.status()
    assert caught.value.code() == Code.UNAUTHENTICATED


@dataclass(frozen=True)
class CallDetails(grpc.HandlerCallDetails):
    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


def test_token_hashes_are_compared_with_hmac_compare_digest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interceptor's verdict is hmac.compare_digest's, on sha256 hashes of the token (the
    server holds hashes only): forcing the comparison's answer flips the verdict, so no other
    comparison decides."""
    real = hmac.compare_digest
    compared: list[tuple[object, object]] = []
    forced: list[bool] = []  # empty: the real answer

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return forced[0] if forced else real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    denied: list[tuple[str, grpc.StatusCode]] = []
    tokens = TokenTable(((token_hash(TOKEN), "admin"),))
    interceptor = BearerTokenInterceptor(tokens, lambda *refusal: denied.append(refusal))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: None)

    def admitted(authorization: str) -> bool:
        details = CallDetails(
            "/trident.v1.TrainerService/Step", (("authorization", authorization),)
        )
        return interceptor.intercept_service(lambda _: handler, details) is handler

    right, wrong = f"Bearer {TOKEN}", f"Bearer {TOKEN[:-1]}"
    assert admitted(right) and not admitted(wrong)
    expected = token_hash(TOKEN)
    assert compared == [(expected, expected), (token_hash(TOKEN[:-1]), expected)]
    forced.append(True)
    assert admitted(wrong)
    forced[0] = False
    assert not admitted(right)
    assert len(compared) == 4 and denied == [("Step", Code.UNAUTHENTICATED)] * 2


# ------------------------------------------------------------------------------ roles
def test_new_tokens_never_start_with_a_dash() -> None:
    """`trident token` prints what a user pastes after `--token`: one starting with '-' would
    read as a flag. A plain token_urlsafe starts so once in 64: 10,000 draws catch it."""
    tokens = [new_token() for _ in range(10_000)]
    assert not [t for t in tokens if t.startswith("-")]
    assert all(len(t) == 43 for t in tokens) and len(set(tokens)) == len(tokens)
    assert {c for t in tokens for c in t} <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )


def test_each_role_calls_its_methods_and_is_denied_the_rest(
    tmp_path: Path, rng: np.random.Generator, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tokens made by `trident token` for each role, served from a token file of hashes: every
    role x method either passes the interceptor or is PERMISSION_DENIED naming the role, each
    denial counted; the file never holds a token."""
    tokens_file = tmp_path / "tokens"
    tokens = {}
    for role in ROLES:
        made = trident_cli("token", "--role", role, "--tokens-file", str(tokens_file))
        assert made.returncode == 0, made.stderr
        tokens[role] = made.stdout.strip()
    text = tokens_file.read_text()
    assert oct(tokens_file.stat().st_mode & 0o777) == "0o600"
    assert len(text.splitlines()) == 3 and not any(t in text for t in tokens.values())
    outcomes: dict[tuple[str, str], str] = {}
    with running_server(tmp_path, f"server.auth_tokens_file={tokens_file}") as server, \
            grpc.insecure_channel(server.target) as channel:  # fmt: skip
        calls = every_method(pb_grpc.TrainerServiceStub(channel), rng)
        assert set(calls) == EVERY_METHOD
        for role, token in tokens.items():
            for method, call in calls.items():
                try:
                    call(metadata=[("authorization", f"Bearer {token}")], timeout=10)
                    outcomes[role, method] = "OK"
                except grpc.RpcError as error:
                    outcomes[role, method] = error.code().name
                    if error.code() == Code.PERMISSION_DENIED:
                        assert f"role {role!r}" in error.details() and method in error.details()
        counted = sum(count for (name, labels), count in scrape(server).items()
                      if name == "trident_rpc_errors_total"
                      and ("code", "PERMISSION_DENIED") in labels)  # fmt: skip
        with TridentClient(server.target, token=tokens["viewer"]) as client:
            assert client.status().auth_mode == "token" and client.status().auth_token_set
    for (role, method), outcome in outcomes.items():
        if method in ROLES[role]:
            assert outcome not in ("PERMISSION_DENIED", "UNAUTHENTICATED"), (role, method)
        else:
            assert outcome == "PERMISSION_DENIED", (role, method, outcome)
    denied = [key for key, outcome in outcomes.items() if outcome == "PERMISSION_DENIED"]
    assert counted == len(denied) == 3 * len(calls) - sum(len(m) for m in ROLES.values())
    with capsys.disabled():
        print(f"\n[auth] roles x methods: {len(outcomes)} calls, {len(denied)} PERMISSION_DENIED "
              "(each outside its role), the rest past the interceptor")


@pytest.mark.parametrize(
    ("content", "expected"),
    [("", "holds no token"), ("root sha256:" + "a" * 64, "line 1"),
     ("# a comment\nactor sha256:abc", "line 2"), ("actor " + "a" * 64, "line 1")],
)  # fmt: skip
def test_a_malformed_token_file_stops_start_up_naming_the_line(
    tmp_path: Path, content: str, expected: str
) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(content)
    done = trident_cli("serve", "--port", "0", "--metrics-port", "0",
                       "--auth-tokens-file", str(tokens_file), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "server.auth_tokens_file" in done.stderr, done.stderr
    assert expected in done.stderr, done.stderr


# ------------------------------------------------------------------------------ TLS and mTLS
def handshake_failures(server: ServerProcess) -> list[str]:
    """The server's gRPC-core log lines of refused TLS handshakes."""
    return [line for line in server.stderr().splitlines() if "Handshake failed" in line]


def refused_at_handshake(server: ServerProcess, client: TridentClient, reason: str) -> None:
    """GetStatus fails UNAVAILABLE, and the server logs a refused handshake naming `reason`."""
    seen = len(handshake_failures(server))
    error = status_error(client)
    assert error is not None and error.code() == Code.UNAVAILABLE, error
    wait_until(
        lambda: any(reason in line for line in handshake_failures(server)[seen:]),
        HANDSHAKE_WAIT_S,
        lambda: f"a refused handshake naming {reason}\n{server.stderr()}",
    )


@pytest.fixture
def core_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers started in the test log gRPC core's INFO lines (its handshake failures)."""
    monkeypatch.setenv("GRPC_VERBOSITY", "INFO")


@pytest.mark.usefixtures("core_logs")
def test_plaintext_client_against_tls_server_fails(
    pki: Pki, tmp_path: Path, rng: np.random.Generator, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = TlsFiles(pki.server.cert, pki.server.key)
    with running_server(tmp_path, "server.auth_mode=none", tls=tls) as server:  # no client auth
        assert server.events("serving")[0]["tls"] is True
        for host in ("127.0.0.1", "localhost"):
            with tls_client(server, pki.ca, host=host) as client:
                reply = client.step(random_rollout(rng))
                assert reply.global_step >= 1 and client.health() == "SERVING"
        with TridentClient(server.target, timeout_s=10) as plaintext:
            # A plaintext HTTP/2 preface where a TLS ClientHello belongs.
            refused_at_handshake(server, plaintext, "WRONG_VERSION_NUMBER")
        with tls_client(server, pki.other_ca) as untrusting:  # the client refuses the server
            error = status_error(untrusting)
            assert error is not None and error.code() == Code.UNAVAILABLE
            assert "handshake failed" in error.details().lower(), error.details()
        done = trident_cli("status", "--server", server.target, "--tls-ca", str(pki.ca.cert))
        assert done.returncode == 0, done.stderr
        assert not server.events("rejected")  # no refused call reached a handler
    with capsys.disabled():
        print(
            "\n[auth] TLS server: TLS clients served; plaintext client UNAVAILABLE (server "
            "handshake: WRONG_VERSION_NUMBER); client not trusting its CA UNAVAILABLE"
        )


@pytest.mark.usefixtures("core_logs")
@pytest.mark.parametrize("front_ends", [0, 2])
def test_mtls_refuses_unknown_ca_and_missing_client_cert(
    pki: Pki,
    tmp_path: Path,
    rng: np.random.Generator,
    capsys: pytest.CaptureFixture[str],
    front_ends: int,
) -> None:
    """Also with front-end processes (server.front_ends = 2), each terminating TLS."""
    tls = TlsFiles(pki.server.cert, pki.server.key, client_ca=pki.ca.cert)
    with running_server(tmp_path, "server.auth_mode=mtls", f"server.front_ends={front_ends}",
                        tls=tls) as server:  # fmt: skip
        with tls_client(server, pki.ca, pki.client) as client:
            assert status_error(client) is None
            obs = rng.standard_normal((3, 6)).astype(np.float32)
            assert client.act(obs).actions.shape == (3,)
        with tls_client(server, pki.ca, pki.other_client) as stranger:
            refused_at_handshake(server, stranger, "CERTIFICATE_VERIFY_FAILED")
        with tls_client(server, pki.ca) as anonymous:
            refused_at_handshake(server, anonymous, "PEER_DID_NOT_RETURN_A_CERTIFICATE")
        with TridentClient(server.target, timeout_s=10) as plaintext:
            refused_at_handshake(server, plaintext, "WRONG_VERSION_NUMBER")
        done = trident_cli(
            "status",
            "--server",
            server.target,
            "--tls-ca",
            str(pki.ca.cert),
            "--tls-cert",
            str(pki.client.cert),
            "--tls-key",
            str(pki.client.key),
        )
        assert done.returncode == 0, done.stderr
        assert not server.events("rejected")
    with capsys.disabled():
        print(
            "\n[auth] mTLS server: its CA's client served; unknown-CA client, no client cert and "
            "plaintext UNAVAILABLE (server handshake: CERTIFICATE_VERIFY_FAILED, "
            "PEER_DID_NOT_RETURN_A_CERTIFICATE, WRONG_VERSION_NUMBER)"
        )


# ------------------------------------------------------------------------------ misconfiguration
def _server_pem(pki: Pki) -> list[str]:
    return [f"server.tls_cert={pki.server.cert}", f"server.tls_key={pki.server.key}"]


def _junk(directory: Path) -> Path:
    junk = directory / "junk.pem"
    junk.write_text("this is not a certificate\n")
    return junk


# case -> (settings from the PKI and a scratch directory, the setting the message must name)
MISCONFIGURED: dict[str, tuple[Callable[[Pki, Path], list[str]], str]] = {
    "mtls without a CA file": (
        lambda p, d: [*_server_pem(p), "server.auth_mode=mtls"],
        "server.tls_client_ca",
    ),
    "unknown auth mode": (lambda p, d: ["server.auth_mode=kerberos"], "server.auth_mode"),
    "token mode without a token": (lambda p, d: ["server.auth_mode=token"], "server.auth_token"),
    "open mode with a token": (
        lambda p, d: ["server.auth_mode=none", f"server.auth_token={TOKEN}"],
        "server.auth_mode",
    ),
    "mtls with a token": (
        lambda p, d: [
            *_server_pem(p),
            f"server.tls_client_ca={p.ca.cert}",
            f"server.auth_token={TOKEN}",
            "server.auth_mode=mtls",
        ],
        "server.auth_token",
    ),
    "client CA without a server cert": (
        lambda p, d: [f"server.tls_client_ca={p.ca.cert}"],
        "server.tls_client_ca",
    ),
    "cert without a key": (lambda p, d: [f"server.tls_cert={p.server.cert}"], "server.tls_key"),
    "CA file missing": (
        lambda p, d: [*_server_pem(p), f"server.tls_client_ca={d / 'missing.pem'}"],
        "server.tls_client_ca",
    ),
    "cert file missing": (
        lambda p, d: [f"server.tls_cert={d / 'missing.pem'}", f"server.tls_key={p.server.key}"],
        "server.tls_cert",
    ),
    "key file missing": (
        lambda p, d: [f"server.tls_cert={p.server.cert}", f"server.tls_key={d / 'missing.pem'}"],
        "server.tls_key",
    ),
    "cert not PEM": (
        lambda p, d: [f"server.tls_cert={_junk(d)}", f"server.tls_key={p.server.key}"],
        "server.tls_cert",
    ),
    "CA not PEM": (
        lambda p, d: [*_server_pem(p), f"server.tls_client_ca={_junk(d)}"],
        "server.tls_client_ca",
    ),
}
BIND_ERROR = "expected a free address to bind"


def serve_on_held_port(tmp_path: Path, settings: list[str]) -> tuple[int, str]:
    """Run `serve` on a port this process holds open; its exit status and stderr.

    Holding the port makes the order observable: a server that got as far as binding fails
    there, with the bind error naming server.port, not with its misconfiguration.
    """
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        command = serve_command(
            tmp_path / "checkpoints", [*SMALL, *SERVING, *settings], ("--port", str(port))
        )
        done = subprocess.run(
            command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=15
        )
    assert '"serving"' not in done.stderr
    return done.returncode, done.stderr


def test_misconfiguration_exits_before_binding(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(index: int, case: str) -> tuple[int, str]:
        directory = tmp_path / str(index)
        directory.mkdir()
        return serve_on_held_port(directory, MISCONFIGURED[case][0](pki, directory))

    with ThreadPoolExecutor(4) as pool:  # a process start is mostly imports: run four at once
        outcomes = list(pool.map(run, range(len(MISCONFIGURED)), MISCONFIGURED))
    messages = []
    for (case, (_, setting)), (returncode, stderr) in zip(
        MISCONFIGURED.items(), outcomes, strict=True
    ):
        assert returncode == 2, (case, stderr)
        errors = [line for line in stderr.splitlines() if line.startswith("trident: error: ")]
        assert len(errors) == 1 and setting in errors[0], (case, stderr)
        assert BIND_ERROR not in stderr, (case, stderr)  # refused before the bind was tried
        assert TOKEN[:8] not in stderr, case  # the token is never echoed
        message = errors[0].removeprefix("trident: error: ")
        messages.append(f"  {case}: exit 2, {message[:100]}{'...' if len(message) > 100 else ''}")
    with capsys.disabled():
        print(f"\n[auth] {len(messages)} misconfigurations, each refused before binding:")
        print("\n".join(messages))


def test_held_port_is_the_bind_error(pki: Pki, tmp_path: Path) -> None:
    """The control: a sound mTLS config on the held port fails at the bind, naming it."""
    settings = [*_server_pem(pki), f"server.tls_client_ca={pki.ca.cert}", "server.auth_mode=mtls"]
    returncode, stderr = serve_on_held_port(tmp_path, settings)
    assert returncode == 2 and BIND_ERROR in stderr and "server.port" in stderr, stderr
