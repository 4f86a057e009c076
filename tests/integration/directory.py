"""A real directory for the lab's tests: Debian's OpenLDAP server (slapd) in a container on the
lab's network, speaking LDAPS with a certificate from a test CA made here, holding users with
their SSH keys (the openssh-lpk attribute) and POSIX groups (RFC 2307, memberUid).
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from provision.providers.lab import podman

SUFFIX = "dc=lab,dc=test"
READER = f"cn=reader,{SUFFIX}"  # the nodes' bind account
ADMIN = f"cn=admin,{SUFFIX}"  # slapd's own, made by its package
_SLAPD = "/usr/sbin/slapd -u openldap -g openldap -F /etc/ldap/slapd.d -h"

# the openssh-lpk schema's attribute and class (OpenSSH's LDAP public key patch): keys in entries
_SSH_SCHEMA = """dn: cn=openssh-lpk,cn=schema,cn=config
objectClass: olcSchemaConfig
cn: openssh-lpk
olcAttributeTypes: ( 1.3.6.1.4.1.24552.500.1.1.1.13 NAME 'sshPublicKey'
  DESC 'an OpenSSH public key' EQUALITY octetStringMatch
  SYNTAX 1.3.6.1.4.1.1466.115.121.1.40 )
olcObjectClasses: ( 1.3.6.1.4.1.24552.500.1.1.2.0 NAME 'ldapPublicKey' SUP top AUXILIARY
  DESC 'an entry with OpenSSH public keys' MAY ( sshPublicKey $ uid ) )
"""

_TLS = """dn: cn=config
changetype: modify
replace: olcTLSCACertificateFile
olcTLSCACertificateFile: /etc/ldap/tls/ca.pem
-
replace: olcTLSCertificateFile
olcTLSCertificateFile: /etc/ldap/tls/server.pem
-
replace: olcTLSCertificateKeyFile
olcTLSCertificateKeyFile: /etc/ldap/tls/server.key
"""

# nothing for anonymous readers (Debian's default lets them read every entry): the nodes must
# bind as the reader to see anyone, so a directory that answers proves the bind password
_ACCESS = """dn: olcDatabase={1}mdb,cn=config
changetype: modify
replace: olcAccess
olcAccess: {0}to attrs=userPassword by self write by anonymous auth by * none
olcAccess: {1}to * by users read by * none
"""


@dataclass(frozen=True)
class Person:
    name: str
    uid: int
    groups: tuple[str, ...]  # the directory's groups they are in, besides their own
    key: str  # their SSH public key


@dataclass(frozen=True)
class Directory:
    container: str
    address: str
    ca_file: Path
    password_file: Path  # the reader's password, mode 0600

    @property
    def uri(self) -> str:
        return f"ldaps://{self.address}"

    def stop(self) -> None:
        self._exec("pkill -x slapd; while pgrep -x slapd >/dev/null; do sleep 0.2; done")

    def start(self) -> None:
        self._exec(f"{_SLAPD} 'ldaps:/// ldapi:///'")

    def _exec(self, script: str, stdin: bytes | None = None) -> str:
        out = podman.podman("exec", "-i", self.container, "sh", "-ec", script, stdin=stdin)
        return out.stdout.decode()


def make_ca(work: Path, address: str) -> tuple[Path, bytes, bytes]:
    """A CA (its certificate in work/directory-ca.pem) and a server certificate and key it
    signed for `address`, valid for two days."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "provision test directory CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ldap.lab.test")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("ldap.lab.test"), x509.IPAddress(ipaddress.IPv4Address(address))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = work / "directory-ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return ca_file, cert.public_bytes(serialization.Encoding.PEM), key_pem


def ssh_key(work: Path, name: str) -> str:
    """A new key pair in work/<name> (and .pub); the public key."""
    path = work / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)],
                   check=True)  # fmt: skip
    return path.with_suffix(".pub").read_text().strip()


def _entries(people: list[Person], groups: dict[str, int]) -> str:
    out = [
        f"dn: ou=people,{SUFFIX}\nobjectClass: organizationalUnit\nou: people\n",
        f"dn: ou=groups,{SUFFIX}\nobjectClass: organizationalUnit\nou: groups\n",
    ]
    for p in people:
        out.append(
            f"dn: uid={p.name},ou=people,{SUFFIX}\nobjectClass: inetOrgPerson\n"
            f"objectClass: posixAccount\nobjectClass: ldapPublicKey\nuid: {p.name}\n"
            f"cn: {p.name}\nsn: {p.name}\nuidNumber: {p.uid}\ngidNumber: {p.uid}\n"
            f"homeDirectory: /home/{p.name}\nloginShell: /bin/bash\nsshPublicKey: {p.key}\n"
        )
        out.append(
            f"dn: cn={p.name},ou=groups,{SUFFIX}\nobjectClass: posixGroup\ncn: {p.name}\n"
            f"gidNumber: {p.uid}\n"
        )
    for name, gid in groups.items():
        members = "".join(f"memberUid: {p.name}\n" for p in people if name in p.groups)
        out.append(
            f"dn: cn={name},ou=groups,{SUFFIX}\nobjectClass: posixGroup\ncn: {name}\n"
            f"gidNumber: {gid}\n{members}"
        )
    return "\n".join(out)


def start_directory(
    image: str,
    container: str,
    network: str,
    address: str,
    work: Path,
    people: list[Person],
    groups: dict[str, int],
) -> Directory:
    """slapd from Debian's packages in a container of the lab image, at `address` on `network`:
    LDAPS with a test CA's certificate, the people and groups in it, and a reader account
    whose password is in work/directory-bind.password."""
    podman.podman("rm", "-f", "-t", "0", container, check=False)
    podman.podman(
        "run", "-d", "--name", container, "--hostname", "ldap", "--network",
        f"{network}:ip={address}", "--systemd=always", "--no-hosts", image, "/sbin/init",
    )  # fmt: skip
    admin_password = secrets.token_urlsafe(18)
    reader_password = secrets.token_urlsafe(18)
    password_file = work / "directory-bind.password"
    password_file.write_text(reader_password + "\n")
    password_file.chmod(0o600)
    ca_file, cert, key = make_ca(work, address)
    directory = Directory(container, address, ca_file, password_file)
    # the package's own start would be outside this test's hands: slapd runs as started below
    preseed = (
        "slapd slapd/domain string lab.test\nslapd shared/organization string lab\n"
        f"slapd slapd/password1 password {admin_password}\n"
        f"slapd slapd/password2 password {admin_password}\n"
    )
    directory._exec(
        "printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d;"
        " debconf-set-selections; apt-get update -qq;"
        " DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends"
        " slapd ldap-utils >/dev/null; rm /usr/sbin/policy-rc.d; install -d -m 750 -g openldap"
        " /etc/ldap/tls",
        stdin=preseed.encode(),
    )
    for name, data, mode in (
        ("ca.pem", ca_file.read_bytes(), "644"),
        ("server.pem", cert, "644"),
        ("server.key", key, "640"),
    ):
        directory._exec(
            f"cat > /etc/ldap/tls/{name}; chgrp openldap /etc/ldap/tls/{name}; "
            f"chmod {mode} /etc/ldap/tls/{name}",
            stdin=data,
        )
    reader = (
        f"dn: {READER}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\n"
        f"cn: reader\nuserPassword: {reader_password}\n"
    )
    directory._exec(f"{_SLAPD} ldapi:///; sleep 1; ldapmodify -Q -Y EXTERNAL -H ldapi:///",
                    stdin=_TLS.encode())  # fmt: skip
    directory._exec("ldapadd -Q -Y EXTERNAL -H ldapi:///", stdin=_SSH_SCHEMA.encode())
    directory._exec("ldapmodify -Q -Y EXTERNAL -H ldapi:///", stdin=_ACCESS.encode())
    ldif = f"{reader}\n{_entries(people, groups)}"
    directory._exec("cat > /tmp/people.ldif", stdin=ldif.encode())
    directory._exec(f"ldapadd -x -D {ADMIN} -w {admin_password} -H ldapi:/// -f /tmp/people.ldif")
    directory.stop()
    directory.start()
    return directory
