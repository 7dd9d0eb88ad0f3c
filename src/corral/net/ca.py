"""corral's certificate authority for TLS inspection, and the leaf certificates it signs.

Three sources (``[tls]``): by default one CA per user, created on first use in
corral's state directory (``ca/corral-ca.pem``: key and certificate in one
mode-0600 file, in a mode-0700 directory that every sandbox tier masks as
"corral's own state"); ``ca = "ephemeral"``, one made in memory for this run
and never written anywhere; or the user's own ``ca_cert`` / ``ca_key``.

Leaf certificates are ECDSA P-256 (fast to sign and to handshake with), one
per host, all sharing one key per proxy worker, valid for ``LEAF_DAYS``.

``cryptography`` is imported only where a certificate is made or parsed: a
run with the user's CA (the default, once it exists) reads the file as text and
never loads it; the proxy workers do, on a thread while the sandbox starts
(its import takes some 60 ms).
"""

from __future__ import annotations

import os
import time

from corral.errors import PolicyError
from corral.net.trust import USER_CA, USER_CA_CERT

TYPE_CHECKING = False
if TYPE_CHECKING:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes

    from corral.policy import TlsPolicy

CA_DAYS = 3650
EPHEMERAL_DAYS = 2
LEAF_DAYS = 30
# A leaf is made again this long before it expires (a proxy may serve for weeks).
LEAF_RENEW_DAYS = 7
SKEW_HOURS = 1  # certificates are backdated this much, for clocks slightly behind ours


def _now() -> datetime.datetime:
    import datetime  # not at import time: the user's CA is read without it

    return datetime.datetime.now(datetime.UTC)


def _days(n: float) -> datetime.timedelta:
    import datetime

    return datetime.timedelta(days=n)


class CA:
    """A CA certificate with its private key, as PEM; parsed on first use."""

    __slots__ = ("_cert", "_key", "cert_pem", "key_pem", "origin")

    def __init__(
        self,
        cert_pem: bytes,
        key_pem: bytes,
        origin: str,
        cert: x509.Certificate | None = None,
        key: CertificateIssuerPrivateKeyTypes | None = None,
    ) -> None:
        self.cert_pem = cert_pem
        self.key_pem = key_pem
        self.origin = origin  # "user", "ephemeral" or "own"
        self._cert = cert
        self._key = key

    @property
    def cert(self) -> x509.Certificate:
        if self._cert is None:
            from cryptography import x509

            self._cert = x509.load_pem_x509_certificate(self.cert_pem)
        return self._cert

    @property
    def key(self) -> CertificateIssuerPrivateKeyTypes:
        if self._key is None:
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric import ec, rsa

            key = serialization.load_pem_private_key(self.key_pem, password=None)
            assert isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
            self._key = key
        return self._key

    @property
    def expires(self) -> datetime.datetime:
        return not_after(self.cert)


def not_after(cert: x509.Certificate) -> datetime.datetime:
    """When ``cert`` expires, timezone-aware (``not_valid_after_utc`` is only in
    cryptography 42 and later; Debian 12 ships 38)."""
    import datetime

    aware: datetime.datetime | None = getattr(cert, "not_valid_after_utc", None)
    if aware is not None:
        return aware
    return cert.not_valid_after.replace(tzinfo=datetime.UTC)


def ca_for(tls: TlsPolicy, state_dir: str) -> CA:
    """The CA a run signs with, per its ``[tls]`` keys; PolicyError naming the key
    when the user's own CA cannot be used."""
    if tls.ca_cert:
        return load_own(tls.ca_cert, tls.ca_key)
    if tls.ca == "ephemeral":
        return create("corral ephemeral CA", EPHEMERAL_DAYS, "ephemeral")
    return user_ca(state_dir)


def create(common_name: str, days: int, origin: str) -> CA:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "corral"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _days(SKEW_HOURS / 24))
        .not_valid_after(now + _days(days))
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CA(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key), origin, cert, key)


def user_ca(state_dir: str) -> CA:
    """This user's CA, created on first use.  Two runs starting at once agree on
    one: the file appears whole (written aside, then linked into place) or not."""
    path = os.path.join(state_dir, USER_CA)
    try:
        ca = _read_user_ca(path)
    except FileNotFoundError:
        ca = None
    if ca is not None and not _expiring(ca, path):
        return ca
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(path), 0o700)
    fresh = create(f"corral CA ({_who()})", CA_DAYS, "user")
    data = fresh.key_pem + fresh.cert_pem
    aside = f"{path}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if ca is None:
            os.link(aside, path)  # fails if another run made one meanwhile: use that
        else:
            os.replace(aside, path)  # an expiring CA is replaced
            return fresh
    except FileExistsError:
        found = _read_user_ca(path)
        assert found is not None
        return found
    finally:
        if os.path.exists(aside):
            os.unlink(aside)
    return fresh


def user_ca_cert(state_dir: str) -> str:
    """The user CA's certificate alone (no key), mode 0644, for clients outside
    a sandbox (``corral proxy serve``): written from the CA file when missing."""
    ca = user_ca(state_dir)
    path = os.path.join(state_dir, USER_CA_CERT)
    try:
        with open(path, "rb") as fh:
            if fh.read() == ca.cert_pem:
                return path
    except FileNotFoundError:
        pass
    aside = f"{path}.{os.getpid()}.{os.urandom(4).hex()}"
    with open(aside, "wb") as fh:
        fh.write(ca.cert_pem)
    os.chmod(aside, 0o644)
    os.replace(aside, path)
    return path


def _read_user_ca(path: str) -> CA | None:
    """The CA file as text: its two PEM blocks, not parsed (see the module doc)."""
    with open(path, "rb") as fh:
        data = fh.read()
    cert_pem = _pem_block(data, b"CERTIFICATE")
    key_pem = _pem_block(data, b"PRIVATE KEY")
    if cert_pem is None or key_pem is None:
        raise PolicyError(
            f"corral's CA in {path} is damaged: remove the file and a new one is made"
        )
    return CA(cert_pem, key_pem, "user")


def _pem_block(data: bytes, label: bytes) -> bytes | None:
    begin = data.find(b"-----BEGIN " + label + b"-----")
    end = data.find(b"-----END " + label + b"-----", begin)
    if begin < 0 or end < 0:
        return None
    return data[begin : end + len(label) + 14] + b"\n"


def _expiring(ca: CA, path: str) -> bool:
    """Is the user's CA within LEAF_DAYS of its end?  Judged by the file's age,
    so that it is parsed (cryptography loaded) only in its last months."""
    age = time.time() - os.stat(path).st_mtime
    if age < (CA_DAYS - 4 * LEAF_DAYS) * 86400:
        return False
    try:
        return ca.expires - _now() <= _days(LEAF_DAYS)
    except ValueError:
        raise PolicyError(
            f"corral's CA in {path} is damaged: remove the file and a new one is made"
        ) from None


def _who() -> str:
    import pwd
    import socket

    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _pem_key(key: CertificateIssuerPrivateKeyTypes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_own(cert_path: str, key_path: str) -> CA:
    """``[tls] ca_cert`` / ``ca_key``: a CA certificate and its unencrypted key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    cert_data = _read(cert_path, "ca_cert")
    key_data = _read(key_path, "ca_key")
    try:
        cert = x509.load_pem_x509_certificate(cert_data)
    except ValueError:
        raise PolicyError(f"tls.ca_cert: {cert_path} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except TypeError:
        raise PolicyError(
            f"tls.ca_key: {key_path} is encrypted; corral needs the key unencrypted"
        ) from None
    except ValueError:
        raise PolicyError(f"tls.ca_key: {key_path} holds no PEM private key") from None
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise PolicyError(f"tls.ca_cert: {cert_path} is not a CA certificate (CA:TRUE)")
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise PolicyError(f"tls.ca_key: {key_path}: only EC and RSA keys can sign here")
    if _spki(key.public_key()) != _spki(cert.public_key()):
        raise PolicyError(f"tls.ca_key: {key_path} is not the key of tls.ca_cert {cert_path}")
    if not_after(cert) <= _now():
        raise PolicyError(f"tls.ca_cert: {cert_path} has expired")
    return CA(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key), "own", cert, key)


def _spki(public: object) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _read(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise PolicyError(f"tls.{key}: cannot read {path}: {exc.strerror}") from None


class Issuer:
    """Signs leaf certificates for one proxy worker: one ECDSA P-256 key for all
    of them, made when the worker starts (never written to disk)."""

    def __init__(self, ca: CA) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import ec

        self.ca = ca
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.key_pem = _pem_key(self.key)
        self._ca_ski = x509.AuthorityKeyIdentifier.from_issuer_public_key(
            ca.cert.public_key()  # type: ignore[arg-type]
        )
        self._public = self.key.public_key()
        self._ski = x509.SubjectKeyIdentifier.from_public_key(self._public)

    def leaf(self, host: str) -> tuple[bytes, datetime.datetime]:
        """A PEM certificate for ``host`` (a normalized name or an address) and
        when it should be made again."""
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        now = _now()
        until = min(now + _days(LEAF_DAYS), self.ca.expires)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.ca.cert.subject)
            .public_key(self._public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _days(SKEW_HOURS / 24))
            .not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(self._ca_ski, critical=False)
            .add_extension(self._ski, critical=False)
            .sign(self.ca.key, hashes.SHA256())
        )
        renew = until - min(_days(LEAF_RENEW_DAYS), (until - now) / 2)
        return cert.public_bytes(serialization.Encoding.PEM), renew
