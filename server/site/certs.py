"""The site's certificates: a private CA, the broker's server certificate, client certificates.

Keys are ECDSA P-256: every TLS stack a board runs (OpenSSL 1.1 and later, Python's
``ssl``, mbedTLS) verifies them, and they are generated in microseconds, so a site
of a hundred boards is made in a second. The broker certificate names every host
name (DNS) and address (IP) that clients will dial in its subjectAltName: TLS
clients check the name they dialled against the SANs only (the common name is
ignored), so a broker reached as ``192.168.1.10`` needs that IP there.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from device.errors import ConfigError

VALID_DAYS = 3650  # a site outlives a field test; re-run `covey site init` to renew
BACKDATE = dt.timedelta(hours=1)  # boards whose clocks lag a little still accept new certificates


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    return key.private_bytes(pem, pkcs8, serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    organization = x509.NameAttribute(NameOID.ORGANIZATION_NAME, "covey site")
    return x509.Name([organization, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def make_ca(run: str) -> Issued:
    """A self-signed CA that may sign end-entity certificates only (path length 0)."""
    key = _key()
    name = _name(f"covey site CA ({run})")
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _load_ca(ca: Issued) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate(ca.cert_pem)
        key = serialization.load_pem_private_key(ca.key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"the site's CA certificate or key does not load ({exc}); was the site edited?") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError("the site's CA key is not an EC key made by `covey site init`")
    return cert, key


def _issue(
    ca: Issued, common_name: str, usage: x509.ObjectIdentifier, san: list[x509.GeneralName] | None = None
) -> Issued:
    ca_cert, ca_key = _load_ca(ca)
    key = _key()
    builder = (
        _builder(_name(common_name), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_server(ca: Issued, hosts: list[str], ips: list[str]) -> Issued:
    """The broker's certificate: every host name as a DNS SAN and every address as an IP SAN."""
    san: list[x509.GeneralName] = [x509.DNSName(h) for h in hosts]
    san += [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
    return _issue(ca, (hosts or ips)[0], ExtendedKeyUsageOID.SERVER_AUTH, san)


def issue_client(ca: Issued, identity: str) -> Issued:
    """A client certificate whose common name is the identity (a device id, or ``coordinator``)."""
    return _issue(ca, identity, ExtendedKeyUsageOID.CLIENT_AUTH)


def subject_alt_names(cert_pem: bytes) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) of a certificate's subjectAltName (for checks and tests)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    return san.get_values_for_type(x509.DNSName), [str(a) for a in san.get_values_for_type(x509.IPAddress)]
