"""Test certificates and TLS clients: a CA with a server and a client leaf, and a second CA (a
stranger to the server) with a client leaf of its own."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from service.client.client import TridentClient, channel_credentials
from service.testing.serverproc import ServerProcess

Authority = tuple["Pem", x509.Certificate, ec.EllipticCurvePrivateKey]


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


def _write(
    directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Pem:
    pem = Pem(directory / f"{name}.crt", directory / f"{name}.key")
    pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.key.write_bytes(_key_pem(key))
    return pem


def make_ca(directory: Path, name: str) -> Authority:
    """A self-signed CA valid for a day: its PEM files, certificate and key."""
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
    return _write(directory, name, cert, key), cert, key


def make_leaf(directory: Path, name: str, ca: Authority, server: bool) -> Pem:
    """A certificate signed by `ca`: for a server (127.0.0.1 and localhost) or a client."""
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
    return _write(directory, name, builder.sign(ca_key, hashes.SHA256()), key)


@dataclass(frozen=True)
class Pki:
    ca: Pem
    server: Pem
    client: Pem
    other_ca: Pem
    other_client: Pem


def make_pki(directory: Path) -> Pki:
    """Fresh keys and certificates in `directory`."""
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
    """A client that trusts `ca` and, for mTLS, presents `client`."""
    credentials = channel_credentials(
        str(ca.cert), str(client.cert) if client else None, str(client.key) if client else None
    )
    return TridentClient(f"{host}:{server.port}", credentials=credentials, timeout_s=10)


def status_error(client: TridentClient) -> grpc.RpcError | None:
    """None if GetStatus succeeds (no retries), else its error."""
    client.retries = 0
    try:
        client.status()
    except grpc.RpcError as error:
        return error
    return None
