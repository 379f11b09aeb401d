"""Certificates and keys for the loopback test bed, made with `cryptography` (an ansible-core dependency)."""
from __future__ import annotations

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write(path: str, data: bytes, mode: int = 0o600) -> str:
    with open(path, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)
    return path


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _name(cn: str, orgs=()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name(attrs)


class CertificateAuthority:
    """A throwaway CA for one control-plane run. Files land in `directory`."""

    def __init__(self, directory: str, name: str = "alauda-testbed-ca"):
        self.directory = directory
        now = datetime.datetime.now(datetime.timezone.utc)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(name)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = _write(os.path.join(directory, "ca.crt"), self.cert.public_bytes(serialization.Encoding.PEM),
                                0o644)
        self.key_path = _write(os.path.join(directory, "ca.key"), _key_pem(self.key))

    def issue(self, stem: str, cn: str, orgs=(), dns=(), ips=(), server=False, client=False) -> tuple[str, str]:
        """Issue a leaf certificate; returns (cert_path, key_path)."""
        now = datetime.datetime.now(datetime.timezone.utc)
        key = ec.generate_private_key(ec.SECP256R1())
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, orgs)).issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path = _write(os.path.join(self.directory, f"{stem}.crt"), cert.public_bytes(serialization.Encoding.PEM),
                           0o644)
        key_path = _write(os.path.join(self.directory, f"{stem}.key"), _key_pem(key))
        return cert_path, key_path


def service_account_keypair(directory: str) -> tuple[str, str]:
    """RSA key pair for signing service-account tokens; returns (private_path, public_path)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv = _write(os.path.join(directory, "sa.key"), _key_pem(key))
    pub = _write(os.path.join(directory, "sa.pub"), key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
    return priv, pub
