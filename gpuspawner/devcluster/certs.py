"""Certificates for the devcluster: a CA, the API server's serving certificate and
the service-account signing key pair, generated once per state folder; and, for a cluster
that aggregates an API server (Kueue's visibility API), a front-proxy CA and the client
certificate the API server proxies with."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import NameOID

API_SERVER_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
API_SERVER_IPS = ("127.0.0.1", "10.96.0.1")


def _pem_key(key: CertificateIssuerPrivateKeyTypes) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _cert(
    subject: str,
    key: CertificateIssuerPrivateKeyTypes,
    issuer_name: x509.Name,
    issuer_key: CertificateIssuerPrivateKeyTypes,
    ca: bool,
    sans: Sequence[x509.GeneralName] | None = None,
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    if client:
        builder = builder.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_certificates(pki: Path) -> Path:
    """Write ca.crt, apiserver.crt/.key and sa.key/.pub into ``pki`` (kept if present)."""
    pki.mkdir(parents=True, exist_ok=True)
    if all((pki / f).is_file() for f in ("ca.crt", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub")):
        return pki
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuspawner-devcluster-ca")])
    ca_cert = _cert("gpuspawner-devcluster-ca", ca_key, ca_name, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName(n) for n in API_SERVER_NAMES] + [x509.IPAddress(ipaddress.ip_address(i)) for i in API_SERVER_IPS]
    server_cert = _cert("kube-apiserver", server_key, ca_name, ca_key, ca=False, sans=sans)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (pki / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (pki / "apiserver.crt").write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    (pki / "apiserver.key").write_bytes(_pem_key(server_key))
    (pki / "sa.key").write_bytes(_pem_key(sa_key))
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for name in ("apiserver.key", "sa.key"):
        (pki / name).chmod(0o600)
    return pki


#: the front-proxy client certificate's name: the one name --requestheader-allowed-names allows
FRONT_PROXY_CLIENT = "front-proxy-client"
FRONT_PROXY_FILES = ("front-proxy-ca.crt", "front-proxy-client.crt", "front-proxy-client.key")


def write_front_proxy_certificates(pki: Path) -> Path:
    """Write front-proxy-ca.crt and front-proxy-client.crt/.key into ``pki`` (kept if present):
    the CA an aggregated API server trusts for the user the API server names in its
    X-Remote-* headers, and the client certificate the API server proxies with (kubeadm's
    names). A CA of its own, never the cluster's: a certificate the cluster's CA signs must
    not be able to assert a user in headers."""
    pki.mkdir(parents=True, exist_ok=True)
    if all((pki / f).is_file() for f in FRONT_PROXY_FILES):
        return pki
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuspawner-devcluster-front-proxy-ca")])
    ca_cert = _cert("gpuspawner-devcluster-front-proxy-ca", ca_key, ca_name, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert(FRONT_PROXY_CLIENT, key, ca_name, ca_key, ca=False, client=True)
    (pki / "front-proxy-ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (pki / "front-proxy-client.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (pki / "front-proxy-client.key").write_bytes(_pem_key(key))
    (pki / "front-proxy-client.key").chmod(0o600)
    return pki


def write_serving_certificate(directory: Path, name: str) -> Path:
    """A CA of its own and a serving certificate it signed for 127.0.0.1 and localhost, as
    ``ca.crt``, ``tls.crt`` and ``tls.key`` in ``directory`` (the names controller-runtime's
    webhook server reads): for a webhook the API server calls by URL. Kept if present."""
    directory.mkdir(parents=True, exist_ok=True)
    if all((directory / f).is_file() for f in ("ca.crt", "tls.crt", "tls.key")):
        return directory
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpuspawner-devcluster-{name}-ca")])
    ca_cert = _cert(f"gpuspawner-devcluster-{name}-ca", ca_key, ca_name, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = _cert(name, key, ca_name, ca_key, ca=False, sans=sans)
    (directory / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(_pem_key(key))
    (directory / "tls.key").chmod(0o600)
    return directory


def aggregation_args(pki: Path) -> list[str]:
    """kube-apiserver's flags for the aggregation layer, on a cluster with Kueue only (its
    visibility API is an APIService): the front-proxy client certificate it proxies with, the
    CA and the name an aggregated server trusts for the user in its X-Remote-* headers (in the
    ``kube-system/extension-apiserver-authentication`` ConfigMap it reads), and routing to the
    Service's EndpointSlices rather than its cluster IP (no kube-proxy here)."""
    return [
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        "--enable-aggregator-routing=true",
    ]
