"""The directory (identity): the rendered sssd.conf for each kind of directory (and no secret in
it), the variables that reach the sssd role, where users log in, the bind password and CA
copied as secrets, verify's reading of sssctl and getent as recorded on the lab, and the
role's key command refusing a local name. SSSD against a real slapd runs live in
tests/integration/test_lab.py (logins, a 2-node job, refusals, the directory stopped)."""

from __future__ import annotations

import configparser
import os
import subprocess
from pathlib import Path

import pytest

from provision.cluster import Cluster
from provision.errors import SpecError, UsageError
from provision.lifecycle import _directory_secrets
from provision.parsers.node import directory_problems
from provision.render import render
from provision.render.firewall import admin_reach
from provision.render.identity import CA_PATH
from provision.render.inventory import group_vars
from provision.secrets import DIRECTORY_BIND_PASSWORD, DIRECTORY_CA, directory_secrets
from provision.spec import load_spec

from .conftest import ROLES_DIR, ROOT
from .test_homes import _pool_vars

SUPERPOD = ROOT / "examples" / "dgx-superpod-ha.yaml"
LAB = ROOT / "examples" / "lab.yaml"
DATA = Path(__file__).parent / "data" / "sssd"
CA = (ROOT / "examples" / "directory-ca.pem").read_text()


def _lab(tmp_path: Path, identity: str) -> Cluster:
    (tmp_path / "ca.pem").write_text(CA)
    spec = tmp_path / "lab.yaml"
    spec.write_text(LAB.read_text() + "identity:\n" + identity)
    return Cluster(load_spec(spec))


def _sssd_conf(cluster: Cluster) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(render(cluster)["files/sssd/sssd.conf"])
    return parser


def test_the_superpods_directory_renders_with_no_secret_and_the_login_pool_as_door() -> None:
    cluster = Cluster(load_spec(SUPERPOD))
    conf = _sssd_conf(cluster)
    assert conf["sssd"]["services"] == "nss, pam, ssh, ifp"
    assert conf["sssd"]["domains"] == "directory"
    domain = conf["domain/directory"]
    assert domain["ldap_uri"] == "ldaps://ldap1.example.org, ldaps://ldap2.example.org"
    assert domain["ldap_search_base"] == "dc=example,dc=org"
    assert domain["ldap_schema"] == "rfc2307"
    assert domain["ldap_default_bind_dn"] == "cn=cluster-reader,ou=services,dc=example,dc=org"
    assert domain["simple_allow_groups"] == "hpc-users"
    assert (domain["access_provider"], domain["auth_provider"]) == ("simple", "none")
    assert domain["sudo_provider"] == "none"  # the directory grants no sudo
    assert (domain["ldap_tls_reqcert"], domain["ldap_tls_cacert"]) == ("demand", CA_PATH)
    assert domain["ldap_user_ssh_public_key"] == "sshPublicKey"
    assert "ldap_id_use_start_tls" not in domain  # ldaps://
    assert not any("authtok" in key for key in domain)
    out = group_vars(cluster)
    assert out["provision_directory"] is True
    assert out["sssd_bind"] is True
    default = (ROLES_DIR / "sssd" / "defaults" / "main.yml").read_text()
    assert (
        f'sssd_bind_password_file: "{{{{ provision_secrets_dir }}}}/{DIRECTORY_BIND_PASSWORD}"'
        in default
    )
    pools = _pool_vars(cluster)
    assert [p for p, v in pools.items() if v.get("sssd_door")] == ["login"]
    door = {r.service: r for r in admin_reach(cluster)}["ssh (users)"]
    assert door.where == "login[01-02]"
    assert door.who.startswith("the users' keys and the directory's keys of its hpc-users")


def test_each_kind_of_directory_is_read_its_own_way(tmp_path: Path) -> None:
    base = (
        "  uris: [ldap://ldap.lab.test]\n  base_dn: dc=lab,dc=test\n  ca_file: ca.pem\n"
        "  allowed_groups: [hpc, ml]\n"
    )
    plain = _lab(tmp_path, base)
    domain = _sssd_conf(plain)["domain/directory"]
    assert domain["ldap_id_use_start_tls"] == "true"  # ldap://: StartTLS, never in the clear
    assert domain["simple_allow_groups"] == "hpc, ml"
    assert "ldap_default_bind_dn" not in domain  # anonymous
    assert "sssd_bind" not in group_vars(plain)
    # the lab has no login pool: its heads are the users' door, for the directory's alone
    assert [p for p, v in _pool_vars(plain).items() if v.get("sssd_door")] == ["head"]
    door = {r.service: r for r in admin_reach(plain)}["ssh (users)"]
    assert (door.where, door.who.split(",")[0]) == ("head001", "the directory's keys of its hpc")
    bis = _sssd_conf(_lab(tmp_path, base + "  rfc2307bis: true\n"))["domain/directory"]
    assert bis["ldap_schema"] == "rfc2307bis"
    ad = _sssd_conf(_lab(tmp_path, base + "  kind: active_directory\n"))["domain/directory"]
    assert ad["ldap_schema"] == "ad"
    assert (ad["ldap_id_mapping"], ad["ldap_referrals"]) == ("false", "false")
    ipa = _sssd_conf(_lab(tmp_path, base + "  kind: freeipa\n"))["domain/directory"]
    assert (ipa["ldap_schema"], ipa["ldap_user_ssh_public_key"]) == ("ipa", "ipaSshPubKey")
    assert "ldap_id_mapping" not in ipa
    own = _sssd_conf(_lab(tmp_path, base + "  ssh_key_attribute: altSecurityIdentities\n"))
    assert own["domain/directory"]["ldap_user_ssh_public_key"] == "altSecurityIdentities"
    assert "files/sssd/sssd.conf" not in render(Cluster(load_spec(LAB)))


def test_directory_users_may_hold_accounts_and_come_from_the_user_networks(
    tmp_path: Path,
) -> None:
    """With a directory, an account's user need not be in users (the directory has them), and
    the user networks need no user of the spec's; without one, both are refused."""
    slurm = "  accounting: true\n"
    accounts = slurm + "  accounts: [{name: ml, users: [dora]}]\n"
    text = (
        LAB.read_text()
        .replace(slurm, accounts)
        .replace("security:\n", "security:\n  user_cidrs: [192.168.7.0/24]\n")
    )
    (tmp_path / "ca.pem").write_text(CA)
    spec = tmp_path / "lab.yaml"
    spec.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    refused = {issue.path for issue in caught.value.issues}
    assert refused == {"slurm.accounts[0].users[0]", "security.user_cidrs"}
    spec.write_text(
        text
        + "identity:\n  uris: [ldaps://l.lab.test]\n  base_dn: dc=lab,dc=test\n"
        + "  ca_file: ca.pem\n  allowed_groups: [hpc]\n"
    )
    cluster = Cluster(load_spec(spec))
    assert group_vars(cluster)["slurm_accounts"][0]["users"] == ["dora"]


def test_a_ca_file_holding_a_servers_certificate_is_refused(tmp_path: Path) -> None:
    """The CA file must hold CAs: a server's own certificate would trust that server alone,
    and says the author named the wrong file."""
    from cryptography import x509

    example = x509.load_pem_x509_certificate(CA.encode())
    assert example.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server = (DATA / "server-certificate.pem").read_text()
    (tmp_path / "ca.pem").write_text(server)
    spec = tmp_path / "lab.yaml"
    spec.write_text(
        LAB.read_text()
        + "identity:\n  uris: [ldaps://l.lab.test]\n  base_dn: dc=lab,dc=test\n"
        + "  ca_file: ca.pem\n  allowed_groups: [hpc]\n"
    )
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    (issue,) = caught.value.issues
    assert issue.path == "identity.ca_file"
    assert "holds a certificate that is not a CA's (CN=ldap.lab.test)" in issue.message


def test_the_bind_password_and_the_ca_are_copied_as_secrets(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    identity_text = (
        "  uris: [ldaps://l.lab.test]\n  base_dn: dc=lab,dc=test\n  ca_file: ca.pem\n"
        "  bind_dn: cn=reader,dc=lab,dc=test\n  bind_password_file: bind.password\n"
        "  allowed_groups: [hpc]\n"
    )
    password = tmp_path / "bind.password"
    password.write_text("s3cret-bind\n")
    password.chmod(0o644)
    cluster = _lab(tmp_path, identity_text)
    with pytest.raises(
        UsageError, match=r"identity.bind_password_file: .* mode 0644, readable by others"
    ):
        _directory_secrets(secrets, cluster.spec)
    password.chmod(0o600)
    _directory_secrets(secrets, cluster.spec)
    copy = secrets / DIRECTORY_BIND_PASSWORD
    assert copy.read_text() == "s3cret-bind"  # the line, without its newline
    assert oct(copy.stat().st_mode & 0o777) == "0o600"
    assert (secrets / DIRECTORY_CA).read_text() == CA
    assert "s3cret" not in "".join(render(cluster).values())
    # a CA that stopped being one since validate stops the run before any node
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    with pytest.raises(UsageError, match=r"identity.ca_file: .* holds no PEM certificate"):
        _directory_secrets(secrets, cluster.spec)
    # the spec without a directory: its secrets go
    directory_secrets(secrets, None, None)
    assert not copy.exists() and not (secrets / DIRECTORY_CA).exists()


def test_verify_reads_sssd_online_and_offline_as_recorded_on_the_lab() -> None:
    groups = (DATA / "getent-group-hpc.txt").read_text()
    problems, seen = directory_problems((DATA / "sssctl-online.txt").read_text(), groups, ["hpc"])
    assert problems == [] and seen == "online; hpc gid 5100 (2 member(s) by name)"
    problems, _ = directory_problems((DATA / "sssctl-offline.txt").read_text(), groups, ["hpc"])
    assert problems == ["the directory is down or unreachable: SSSD is offline (cached users only)"]
    problems, _ = directory_problems((DATA / "sssctl-no-ifp.txt").read_text(), "", ["hpc", "ml"])
    assert problems[0].startswith("SSSD does not answer for the directory (InfoPipe operation")
    assert problems[1:] == ["group hpc is not in the directory", "group ml is not in the directory"]


KEYS = ROLES_DIR / "sssd" / "files" / "directory-keys"


@pytest.mark.parametrize("name", ["root", "nobody", "-f", "a b", "../x", ""])
def test_the_key_command_gives_no_key_for_a_local_or_odd_name(name: str) -> None:
    """sshd asks it for every login: a name the node's own files hold, or not a name at all,
    gets no key from the directory (exit 0, nothing printed: sshd then tries no more)."""
    out = subprocess.run(
        ["sh", str(KEYS), name], capture_output=True, text=True, check=False, timeout=10
    )
    assert (out.returncode, out.stdout) == (0, ""), out.stderr


def test_the_key_command_asks_sssd_for_a_directory_user(tmp_path: Path) -> None:
    """A name the node's files do not hold goes to SSSD's sss_ssh_authorizedkeys (a stand-in
    here that says what it was asked: SSSD is not on this machine)."""
    script = KEYS.read_text().replace("/usr/bin/sss_ssh_authorizedkeys", str(tmp_path / "ask"))
    assert script != KEYS.read_text()
    (tmp_path / "keys").write_text(script)
    (tmp_path / "ask").write_text('#!/bin/sh\necho "asked for $1"\n')
    os.chmod(tmp_path / "ask", 0o755)
    out = subprocess.run(
        ["sh", str(tmp_path / "keys"), "dora-5001"], capture_output=True, text=True, check=True
    )
    assert out.stdout == "asked for dora-5001\n"
