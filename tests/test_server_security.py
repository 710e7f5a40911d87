"""Bearer tokens, TLS and mTLS on a real server, and settings that must stop it from starting."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from serverproc import (
    ServerProcess,
    TlsFiles,
    clean_env,
    random_rollout,
    running_server,
    scrape,
    serve_command,
    start_server,
    trident_cli,
    value,
)

from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.client.client import TridentClient, channel_credentials, step_request

Code = grpc.StatusCode
TOKEN = "secret"


# ------------------------------------------------------------------------------ certificates
@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(directory: Path, name: str) -> tuple[Pem, x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    pem = Pem(directory / f"{name}.crt", directory / f"{name}.key")
    pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.key.write_bytes(_key_pem(key))
    return pem, cert, key


def make_leaf(
    directory: Path,
    name: str,
    ca: tuple[Pem, x509.Certificate, ec.EllipticCurvePrivateKey],
    server: bool,
) -> Pem:
    _, ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    pem = Pem(directory / f"{name}.crt", directory / f"{name}.key")
    pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.key.write_bytes(_key_pem(key))
    return pem


@dataclass(frozen=True)
class Pki:
    ca: Pem
    server: Pem
    client: Pem
    other_ca: Pem
    other_client: Pem


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "trident-test-ca")
    other = make_ca(directory, "other-ca")
    return Pki(
        ca=ca[0],
        server=make_leaf(directory, "server", ca, server=True),
        client=make_leaf(directory, "client", ca, server=False),
        other_ca=other[0],
        other_client=make_leaf(directory, "other-client", other, server=False),
    )


def tls_client(
    server: ServerProcess, ca: Pem, client: Pem | None = None, host: str = "127.0.0.1"
) -> TridentClient:
    credentials = channel_credentials(
        str(ca.cert), str(client.cert) if client else None, str(client.key) if client else None
    )
    return TridentClient(f"{host}:{server.port}", credentials=credentials, timeout_s=10)


def status_code(client: TridentClient) -> Code:
    """OK, or the code GetStatus fails with (no retries)."""
    client.retries = 0
    try:
        client.status()
    except grpc.RpcError as error:
        return error.code()
    return Code.OK


# ------------------------------------------------------------------------------ token
@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("token"), token=TOKEN) as server:
        yield server


@pytest.mark.parametrize(("token", "reason"), [(None, "missing"), ("wrong", "wrong")])
def test_missing_or_wrong_token_is_unauthenticated(
    token_server: ServerProcess, token: str | None, reason: str
) -> None:
    with TridentClient(token_server.target, token=token) as client:
        for call in (
            client.status,
            client.list_checkpoints,
            lambda: client.act(np.zeros((2, 6), np.float32)),
            lambda: client.step(random_rollout(np.random.default_rng(0))),
            lambda: client.checkpoint("unauthorised"),
            lambda: list(client.stream_step([random_rollout(np.random.default_rng(0))])),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == Code.UNAUTHENTICATED
            assert reason in caught.value.details()
            assert TOKEN not in caught.value.details()
    with TridentClient(token_server.target, token=TOKEN) as client:
        status = client.status()
        assert status.global_step == 0 and not client.list_checkpoints()


def test_right_token_works_and_health_needs_none(token_server: ServerProcess) -> None:
    with TridentClient(token_server.target, token=TOKEN) as client:
        reply = client.step(random_rollout(np.random.default_rng(1)))
        assert client.status().global_step == reply.global_step
    with TridentClient(token_server.target) as anonymous:
        assert anonymous.health() == "SERVING"
        assert anonymous.health("trident.v1.TrainerService") == "SERVING"
    assert trident_cli("health", "--server", token_server.target).returncode == 0
    denied = trident_cli("status", "--server", token_server.target)
    assert denied.returncode == 1 and "UNAUTHENTICATED" in denied.stderr
    allowed = trident_cli("status", "--server", token_server.target, "--token", TOKEN)
    assert allowed.returncode == 0, allowed.stderr
    denials = value(
        scrape(token_server), "trident_rpc_errors_total", method="GetStatus", code="UNAUTHENTICATED"
    )
    assert denials >= 1


def test_unauthenticated_error_carries_request_id(token_server: ServerProcess) -> None:
    with grpc.insecure_channel(token_server.target) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        request_id = uuid.uuid4().hex
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetStatus(
                pb.GetStatusRequest(), metadata=(("x-request-id", request_id),), timeout=10
            )
        assert caught.value.code() == Code.UNAUTHENTICATED
        assert dict(caught.value.trailing_metadata() or ()).get("x-request-id") == request_id


# ------------------------------------------------------------------------------ TLS
def test_tls_server_takes_tls_clients_only(pki: Pki, tmp_path: Path) -> None:
    with running_server(tmp_path, tls=TlsFiles(pki.server.cert, pki.server.key)) as server:
        assert server.events("serving")[0]["tls"] is True
        for host in ("127.0.0.1", "localhost"):
            with tls_client(server, pki.ca, host=host) as client:
                reply = client.step(random_rollout(np.random.default_rng(0)))
                assert reply.global_step >= 1 and client.health() == "SERVING"
        with TridentClient(server.target, timeout_s=10) as plaintext:
            assert status_code(plaintext) == Code.UNAVAILABLE
        with tls_client(server, pki.other_ca) as untrusting:
            assert status_code(untrusting) == Code.UNAVAILABLE
        done = trident_cli("status", "--server", server.target, "--tls-ca", str(pki.ca.cert))
        assert done.returncode == 0, done.stderr


def test_mtls_server_requires_a_client_cert_from_its_ca(pki: Pki, tmp_path: Path) -> None:
    tls = TlsFiles(pki.server.cert, pki.server.key, client_ca=pki.ca.cert)
    with running_server(tmp_path, tls=tls) as server:
        with tls_client(server, pki.ca, pki.client) as client:
            assert status_code(client) == Code.OK
            assert client.act(np.zeros((3, 6), np.float32)).actions.shape == (3,)
        with tls_client(server, pki.ca, pki.other_client) as stranger:
            assert status_code(stranger) == Code.UNAVAILABLE
        with tls_client(server, pki.ca) as anonymous:
            assert status_code(anonymous) == Code.UNAVAILABLE
        with TridentClient(server.target, timeout_s=10) as plaintext:
            assert status_code(plaintext) == Code.UNAVAILABLE
        with grpc.secure_channel(
            server.target,
            grpc.ssl_channel_credentials(pki.ca.cert.read_bytes()),
        ) as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.Step(step_request(random_rollout(np.random.default_rng(0))), timeout=10)
            assert caught.value.code() == Code.UNAVAILABLE
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


# ------------------------------------------------------------------------------ misconfiguration
def fails_to_start(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    command = serve_command(tmp_path / "checkpoints", overrides, None, None, ())
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=30
    )
    assert time.monotonic() - started < 15
    assert done.returncode != 0, done.stderr
    assert '"serving"' not in done.stderr
    return done


def test_client_ca_without_a_server_cert_is_refused(pki: Pki, tmp_path: Path) -> None:
    done = fails_to_start(tmp_path, f"server.tls_client_ca={pki.ca.cert}")
    assert "server.tls_client_ca" in done.stderr


@pytest.mark.parametrize("setting", ["server.tls_cert", "server.tls_key", "server.tls_client_ca"])
def test_missing_pem_file_is_refused_naming_the_setting(
    pki: Pki, tmp_path: Path, setting: str
) -> None:
    files = {
        "server.tls_cert": str(pki.server.cert),
        "server.tls_key": str(pki.server.key),
        "server.tls_client_ca": str(pki.ca.cert),
    }
    files[setting] = str(tmp_path / "does-not-exist.pem")
    done = fails_to_start(tmp_path, *(f"{key}={value}" for key, value in files.items()))
    assert setting in done.stderr and "does-not-exist.pem" in done.stderr


def test_cert_without_key_is_refused(pki: Pki, tmp_path: Path) -> None:
    done = fails_to_start(tmp_path, f"server.tls_cert={pki.server.cert}")
    assert "server.tls_key" in done.stderr


def test_unparsable_pem_is_refused_naming_the_setting(pki: Pki, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("this is not a certificate\n")
    done = fails_to_start(tmp_path, f"server.tls_cert={junk}", f"server.tls_key={pki.server.key}")
    assert "server.tls_cert" in done.stderr


def test_port_in_use_is_refused(tmp_path: Path) -> None:
    with running_server(tmp_path / "first") as first:
        try:
            second = start_server(tmp_path / "second", extra_args=("--port", str(first.port)))
        except RuntimeError as error:  # exited before serving: what should happen
            assert str(first.port) in str(error)
        else:
            second.terminate()
            pytest.fail(f"a second server is serving on port {first.port}")
