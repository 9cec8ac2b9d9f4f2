"""Signed URLs over https: the node's bulk reads (tensor_registry/api/http1.py) verify the
server with the process's TLS context, the same one its httpx clients use (SSL_CERT_FILE)."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from harness.loopback import QuietHandler, serving
from tensor_registry.api.download import download
from tensor_registry.api.errors import ConnectionFailed
from tensor_registry.engine.sources import HTTPRangeReader
from tensor_registry.node_cache import NodeCache

DATA = os.urandom(300_000)


def _ca_and_leaf(folder: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA's certificate and a leaf for 127.0.0.1 that it signed: (ca.pem, cert, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / f"{name}-ca.pem", folder / f"{name}-cert.pem", folder / f"{name}-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


class _Blob(QuietHandler):
    def do_GET(self) -> None:
        start, end = 0, len(DATA) - 1
        asked = self.headers.get("Range")
        if asked:
            first, _, last = asked.removeprefix("bytes=").partition("-")
            start, end = int(first), int(last)
        body = DATA[start : end + 1]
        self.send_response(206 if asked else 200)
        if asked:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(DATA)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def _https(cert: Path, key: Path) -> Iterator[str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with serving(_Blob, tls=context) as base:
        yield f"{base}/blob?sig=x"


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, tuple[Path, Path, Path]]:
    return {name: _ca_and_leaf(tmp_path, name) for name in ("ours", "other")}


@pytest.mark.parametrize("readers", [1, 3])
def test_a_download_over_https_trusts_the_configured_ca(
    tmp_path: Path,
    certs: dict[str, tuple[Path, Path, Path]],
    monkeypatch: pytest.MonkeyPatch,
    readers: int,
) -> None:
    ca, cert, key = certs["ours"]
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    with _https(cert, key) as url:
        target = tmp_path / "model.tensors"
        digest = download(url, target, size=len(DATA), readers=readers, parallel_min_bytes=1)
        assert target.read_bytes() == DATA
        assert digest == hashlib.sha256(DATA).hexdigest()
        # The engine's range reader goes over the same connections.
        view = memoryview(bytearray(1000))
        reader = HTTPRangeReader(url, len(DATA))
        try:
            assert reader(5000, view) == 1000 and bytes(view) == DATA[5000:6000]
        finally:
            reader.close()


def test_a_server_whose_certificate_no_trusted_ca_signed_is_refused(
    tmp_path: Path, certs: dict[str, tuple[Path, Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, cert, key = certs["ours"]
    monkeypatch.setenv("SSL_CERT_FILE", str(certs["other"][0]))
    cache = NodeCache(tmp_path / "cache", parallel_min_bytes=1)
    with _https(cert, key) as url:
        for readers in (1, 3):
            with pytest.raises(ConnectionFailed) as caught:
                cache.fetch(
                    url, sha256=hashlib.sha256(DATA).hexdigest(), size=len(DATA), readers=readers
                )
            assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value), caught.value
        with pytest.raises(ConnectionFailed):
            HTTPRangeReader(url, len(DATA))(0, memoryview(bytearray(10)))
    assert cache.size() == 0 and list((tmp_path / "cache" / "tmp").iterdir()) == []
