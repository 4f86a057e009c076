"""The certificates of an external etcd: one CA per cluster, one certificate per member, and
the API servers' client certificate, made on the workstation and kept with the cluster's secrets.

The CA (ten years) is made once. A member's certificate (one year; it serves clients and peers
and is the member's client for etcdctl) is remade when its names or addresses change or it has
under 30 days left: a new head's address, or a renewal, is one apply. Keys are 0600 from their
first byte (secrets.write_private); only certificates are readable.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, x25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from provision.cluster import Cluster
from provision.secrets import check_secret_file, create_once, make_secrets, write_private
from provision.state import private_dir

ETCD_DIR = "etcd"  # below the cluster's secrets directory
CA = "ca"
API_CLIENT = "apiserver-etcd-client"
CA_DAYS = 3650
LEAF_DAYS = 365
RENEW_DAYS = 30
_KEY_SIZES = (100, 4096)  # a PEM EC P-256 private key is about 240 bytes


@dataclass(frozen=True)
class Member:
    name: str
    addresses: tuple[str, ...]  # IPs in the certificate; the name (and localhost) always


def etcd_members(cluster: Cluster) -> list[Member]:
    return [
        Member(n.name, (str(n.address),) if n.address is not None else ())
        for n in cluster.head_nodes
    ]


def make_cluster_secrets(directory: Path, cluster: Cluster) -> Path:
    """Every secret the cluster needs, made once (the etcd certificates renewed when due)."""
    make_secrets(directory, cluster.spec.scheduler)
    cluster_certificates(directory, cluster)
    return directory


def cluster_certificates(directory: Path, cluster: Cluster) -> list[str]:
    """The certificates that name the nodes (an external etcd's), made or renewed once the
    nodes' addresses are known; the names (re)made."""
    spec = cluster.spec
    if spec.scheduler != "kubernetes" or spec.kubernetes.etcd != "external":
        return []
    return make_etcd_pki(directory, etcd_members(cluster), spec.name)


def make_etcd_pki(
    directory: Path,
    members: list[Member],
    cluster_name: str,
    now: datetime.datetime | None = None,
) -> list[str]:
    """Make what is missing or due (at `now`) under directory/etcd; return the names (re)made."""
    pki = private_dir(directory / ETCD_DIR)
    made: list[str] = []
    now = now or datetime.datetime.now(datetime.UTC)
    ca_cert, ca_key = _ca(pki, cluster_name, now, made)
    wanted = {m.name: _names(m) for m in members}
    wanted[API_CLIENT] = ((), ())
    for name, (dns, ips) in wanted.items():
        cert_path = pki / f"{name}.crt"
        if cert_path.exists() and (pki / f"{name}.key").exists():
            current = x509.load_pem_x509_certificate(cert_path.read_bytes())
            due = current.not_valid_after_utc - now < datetime.timedelta(days=RENEW_DAYS)
            signed_by_ca = current.issuer == ca_cert.subject
            if not due and signed_by_ca and _sans(current) == (dns, ips):
                check_secret_file(pki / f"{name}.key", _KEY_SIZES)
                continue
        key = ec.generate_private_key(ec.SECP256R1())
        server = name != API_CLIENT
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] * server)
        builder = (
            _builder(name, now, LEAF_DAYS)
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_leaf_usage(), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if server:
            alt: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            alt += [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        write_private(pki / f"{name}.key", _pem_key(key))
        _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        made.append(name)
    return made


def _ca(
    pki: Path, cluster_name: str, now: datetime.datetime, made: list[str]
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = pki / f"{CA}.crt", pki / f"{CA}.key"
    if cert_path.exists() and key_path.exists():
        key = serialization.load_pem_private_key(
            check_secret_file(key_path, _KEY_SIZES).read_bytes(), None
        )
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return x509.load_pem_x509_certificate(cert_path.read_bytes()), key
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(f"etcd-ca {cluster_name}", now, CA_DAYS)
        .issuer_name(_subject(f"etcd-ca {cluster_name}"))
        .public_key(key.public_key())
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
    # every member's certificate hangs on the CA: a new CA remakes them all
    for old in pki.glob("*.crt"):
        old.unlink()
    write_private(key_path, _pem_key(key))
    _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    made.append(CA)
    return cert, key


def _names(member: Member) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (
        tuple(sorted({member.name, "localhost"})),
        tuple(sorted({*member.addresses, "127.0.0.1"})),
    )


def _sans(cert: x509.Certificate) -> tuple[tuple[str, ...], tuple[str, ...]]:
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ((), ())
    dns = tuple(sorted(alt.get_values_for_type(x509.DNSName)))
    ips = tuple(sorted(str(a) for a in alt.get_values_for_type(x509.IPAddress)))
    return dns, ips


def _subject(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(common_name: str, now: datetime.datetime, days: int) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(_subject(common_name))
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # nodes' clocks drift a little
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _leaf_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=True,
        data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    tmp.replace(path)


TUNNEL_DIR = "wireguard"
_WG_KEY_SIZES = (45, 45)  # 32 bytes in base64, and a newline


def _wg_private() -> bytes:
    raw = x25519.X25519PrivateKey.generate().private_bytes_raw()
    return base64.b64encode(raw) + b"\n"


def wg_public(private: bytes) -> str:
    """The WireGuard public key (base64) of a private key file's content, as `wg pubkey`."""
    key = x25519.X25519PrivateKey.from_private_bytes(base64.b64decode(private.strip()))
    return base64.b64encode(key.public_key().public_bytes_raw()).decode()


def tunnel_keys(directory: Path, names: list[str]) -> list[str]:
    """A WireGuard key per tunnel member, made once under directory/wireguard: NAME.key (the
    role copies it to that node only) and NAME.pub (its peers' configurations name it). The
    names whose key was made now."""
    if not names:
        return []
    keys = private_dir(directory / TUNNEL_DIR)
    made = []
    for name in names:
        private = keys / f"{name}.key"
        if not private.exists():
            made.append(name)
        create_once(private, _wg_private, _WG_KEY_SIZES)
        public = (wg_public(private.read_bytes()) + "\n").encode()
        pub = keys / f"{name}.pub"
        if not pub.exists() or pub.read_bytes() != public:
            write_private(pub, public)
    return made
