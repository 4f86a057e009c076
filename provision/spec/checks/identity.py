"""The directory's checks (identity): TLS all the way, credentials whole, a CA that is one, and
no group of its that the nodes' own would hide."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from cryptography import x509

from provision.spec.checks.base import Problem
from provision.spec.models import Spec

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def check_identity(spec: Spec) -> list[Problem]:
    identity = spec.identity
    if identity is None:
        return []
    problems: list[Problem] = []
    schemes = {uri.split("://")[0] for uri in identity.uris}
    if len(schemes) > 1:
        problems.append(
            (
                ("identity", "uris"),
                "mixes ldaps:// and ldap://: SSSD asks every server the same way; make them "
                "all ldaps://, or all ldap:// (with StartTLS)",
            )
        )
    if (identity.bind_dn is None) != (identity.bind_password_file is None):
        given = "bind_dn" if identity.bind_dn is not None else "bind_password_file"
        problems.append(
            (
                ("identity", given),
                "the nodes' login to the directory needs both 'bind_dn' and "
                "'bind_password_file' (or neither, to read it anonymously)",
            )
        )
    if identity.rfc2307bis and identity.kind != "ldap":
        problems.append(
            (
                ("identity", "rfc2307bis"),
                f"applies to kind ldap only: {identity.kind} has a schema of its own",
            )
        )
    ca_problem = ca_file_problem(Path(identity.ca_file))
    if ca_problem:
        problems.append((("identity", "ca_file"), ca_problem))
    local = {g.name for g in spec.groups} | {u.name for u in spec.users}
    for i, group in enumerate(identity.allowed_groups):
        if group in local:
            problems.append(
                (
                    ("identity", "allowed_groups", i),
                    f"'{group}' is also a group of the spec (groups or a user's own): the "
                    "nodes' own would hide the directory's; name one or the other differently",
                )
            )
    return problems


def ca_file_problem(path: Path) -> str | None:
    """Why `path` is not a file of PEM CA certificates, or None."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"
    with warnings.catch_warnings():  # a system bundle's old roots may bend RFC 5280
        warnings.simplefilter("ignore")
        return _not_cas(path, data)


def _not_cas(path: Path, data: bytes) -> str | None:
    certificates = []
    for block in _PEM.findall(data):
        try:
            certificates.append(x509.load_pem_x509_certificate(block))
        except ValueError:
            continue  # one this library cannot read: SSSD's TLS library may
    if not certificates:
        return f"{path} holds no PEM certificate"
    for cert in certificates:
        try:
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = cert.issuer == cert.subject  # an old root may lack the extension
        if not is_ca:
            return (
                f"{path} holds a certificate that is not a CA's ({cert.subject.rfc4514_string()}):"
                " name the CA that signs the servers' certificates"
            )
    return None
