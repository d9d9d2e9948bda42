"""A throwaway certificate authority, so sandbox sites can speak TLS and tunnels get tested.

A site configured with ``tls: true`` serves https with a certificate for ``127.0.0.1`` and
``localhost`` signed by a CA made when the sandbox starts (an EC P-256 key, valid for a day,
never written anywhere but where a test asks). A client trusts it through the CA's PEM (the
fetcher's ``HUTCH_CA_FILE``); nothing else does, so it cannot be mistaken for a real one.

Needs the ``cryptography`` package (in the ``dev`` extra), imported only when a TLS site exists.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from pathlib import Path

__all__ = ["TestCA"]

VALID = datetime.timedelta(days=1)


class TestCA:
    """A CA and one server certificate it signed, both made in memory."""

    __test__ = False  # not a pytest test class, whatever its name says

    def __init__(self, name: str = "Hutch sandbox test CA") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + VALID)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        self.pem = ca_cert.public_bytes(serialization.Encoding.PEM)
        self._chain = cert.public_bytes(serialization.Encoding.PEM)
        self._key = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def write(self, path: str | Path) -> Path:
        """Write the CA certificate (PEM) for clients to trust; returns the path."""
        path = Path(path)
        path.write_bytes(self.pem)
        return path

    def server_context(self) -> ssl.SSLContext:
        """A server-side context with the signed certificate (ssl loads keys from files only)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="hutch-tls-") as folder:
            chain, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
            chain.write_bytes(self._chain)
            key.touch(mode=0o600)
            key.write_bytes(self._key)
            context.load_cert_chain(chain, key)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client-side context that trusts this CA only."""
        return ssl.create_default_context(cadata=self.pem.decode("ascii"))
