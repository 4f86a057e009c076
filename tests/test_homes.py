"""Admins and the login user on a shared /home: pinned IDs from the spec, the homes made on the
NFS server (or after the mounts), and the keys where neither a mount nor root squash hides
them. The roles' expressions are evaluated by Ansible's own templating here; sshd's reading of
the keys and the homes on a shared /home are live in tests/integration/test_static_apply.py and
test_ha.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from provision.cluster import Cluster
from provision.render.inventory import group_vars
from provision.spec import load_spec
from provision.spec.storage import holds_homes

from .conftest import ROLES_DIR, ROOT
from .test_nvidia_sources import _load, trust

SUPERPOD = ROOT / "examples" / "dgx-superpod-ha.yaml"


def _role_template(role: str, expr: str, variables: dict[str, Any]) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    merged = _load(ROLES_DIR / role / "defaults" / "main.yml") | _load(
        ROLES_DIR / role / "vars" / "main.yml"
    )
    values = {k: trust(v) for k, v in merged.items()} | variables
    return Templar(loader=DataLoader(), variables=values).template(trust_as_template(expr))


def _pool_vars(cluster: Cluster) -> dict[str, dict[str, Any]]:
    from ansible.parsing.dataloader import DataLoader

    from provision.render import render

    groups = DataLoader().load(render(cluster)["inventory/hosts.yml"])["all"]["children"]
    return {k.removeprefix("pool_"): dict(v.get("vars") or {}) for k, v in groups.items()}


def test_a_lab_pool_on_a_shared_home_volume_gets_its_homes_made_after_useradd_too() -> None:
    """A lab's /home is a podman volume (there from the container's start): the admins' homes
    are made on it as on NFS, by the pinned IDs, not by each node's useradd."""
    pools = _pool_vars(Cluster(load_spec(ROOT / "examples" / "lab-ha.yaml")))
    assert pools["head"]["common_homes_shared"] and pools["compute"]["common_homes_shared"]
    assert not any(
        v.get("common_homes_shared")
        for v in _pool_vars(Cluster(load_spec(ROOT / "examples" / "lab.yaml"))).values()
    )


def test_a_mount_holds_the_homes_at_home_or_above_it() -> None:
    assert holds_homes("/home") and holds_homes("/")
    assert not holds_homes("/home/shared") and not holds_homes("/homes")


def test_the_superpods_nfs_server_makes_the_admins_homes_in_its_home_export() -> None:
    cluster = Cluster(load_spec(SUPERPOD))
    from provision.render.inventory import _storage_vars

    storage = _storage_vars(cluster, "storage")
    exports = {e["path"]: e for e in storage["nfs_server_exports"]}  # type: ignore[attr-defined]
    assert exports["/srv/home"]["homes_dir"] == "/srv/home"
    assert "homes_dir" not in exports["/srv/slurm"]  # mounted at /shared/slurm: no homes there
    # the pools that mount /home make no home with useradd; the storage pool does
    pools = _pool_vars(cluster)
    assert all(pools[p].get("common_homes_shared") for p in ("head", "login", "gpu", "mig"))
    assert "common_homes_shared" not in pools["storage"]
    admins = group_vars(cluster)["common_admin_users"]
    assert [(a["name"], a["uid"]) for a in admins] == [("alice", 5001), ("bob", 5002)]


def test_the_server_adds_the_login_users_home_by_its_own_ids() -> None:
    exports = [{"path": "/srv/home", "homes_dir": "/srv/home"}, {"path": "/srv/slurm"}]
    admins = [{"name": "alice", "uid": 5001, "ssh_keys": ["k"]}]
    facts = {"getent_passwd": {"ubuntu": ["x", "1000", "1000", "", "/home/ubuntu", "/bin/bash"]}}
    variables = {
        "nfs_server_exports": exports,
        "common_admin_users": admins,
        "ansible_user": "ubuntu",
        "ansible_facts": facts,
    }
    assert _role_template("nfs_server", "{{ _nfs_server_homes }}", variables) == [
        {"path": "/srv/home/alice", "uid": 5001, "gid": 5001},
        {"path": "/srv/home/ubuntu", "uid": "1000", "gid": "1000"},
    ]
    # root's home is not under /home: nothing more
    root = {**variables, "ansible_user": "root", "ansible_facts": {}}
    assert _role_template("nfs_server", "{{ _nfs_server_homes }}", root) == [
        {"path": "/srv/home/alice", "uid": 5001, "gid": 5001},
    ]


def test_a_client_looks_for_the_admins_and_the_login_users_homes() -> None:
    admins = [{"name": "alice", "uid": 5001, "ssh_keys": ["k"]}]
    facts = {"getent_passwd": {"ops": ["x", "1001", "1001", "", "/home/ops", "/bin/bash"]}}
    variables = {"common_admin_users": admins, "ansible_user": "ops", "ansible_facts": facts}
    assert _role_template("common", "{{ _common_shared_homes }}", variables) == [
        {"home": "/home/alice", "uid": 5001, "gid": 5001},
        {"home": "/home/ops", "uid": "1001", "gid": "1001"},
    ]
    paths = _role_template("common", "{{ _common_key_paths }}", variables)
    assert paths == ["/etc/ssh/provision-keys/alice", "/etc/ssh/provision-login-keys/ops"]


class _Node:
    """A node's answers to verify's admin check: its passwd entries and root's key files."""

    def __init__(self, passwd: dict[str, str], keys: dict[str, str]) -> None:
        self.passwd, self.keys, self.asked = passwd, keys, []  # type: ignore[var-annotated]

    def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Any:
        from provision.verify.remote import Output

        self.asked.append(command)
        name = command.split()[2]
        if name not in self.passwd or name not in self.keys:
            return Output(2, "", "")
        return Output(0, self.passwd[name] + "\n" + self.keys[name], "")


def test_verify_reads_the_admins_keys_where_sshd_does_and_their_pinned_uid(
    tmp_path: Path,
) -> None:
    from provision.state import State
    from provision.verify import ADMIN_KEYS_DIR, VerifyContext, check_admin_users

    assert _role_template("common", "{{ _common_keys_dir }}", {}) == ADMIN_KEYS_DIR
    cluster = Cluster(load_spec(SUPERPOD))
    alice, bob = cluster.spec.security.admins
    ctx = VerifyContext(cluster, State(tmp_path, cluster.spec.name), "")
    node = cluster.nodes[0]
    good = _Node(
        {"alice": "alice:x:5001:5001::/home/alice:/bin/bash",
         "bob": "bob:x:5002:5002::/home/bob:/bin/bash"},
        {"alice": alice.ssh_keys[0] + "\n", "bob": bob.ssh_keys[0] + "\n"},
    )  # fmt: skip
    results = check_admin_users(ctx, node, good)  # type: ignore[arg-type]
    assert [(r.passed, r.evidence) for r in results] == [(True, "1 key(s) authorized")] * 2
    assert good.asked[0] == f"getent passwd alice && cat {ADMIN_KEYS_DIR}/alice"
    drifted = _Node(
        {"alice": "alice:x:1001:1001::/home/alice:/bin/bash",
         "bob": "bob:x:5002:5002::/home/bob:/bin/bash"},
        {"alice": alice.ssh_keys[0], "bob": "ssh-ed25519 AAAAother bob@elsewhere"},
    )  # fmt: skip
    results = check_admin_users(ctx, node, drifted)  # type: ignore[arg-type]
    assert [(r.passed, r.evidence) for r in results] == [
        (False, "uid 1001, not 5001"),
        (False, "1 key(s) not authorized"),
    ]
    gone = check_admin_users(ctx, node, _Node({}, {}))  # type: ignore[arg-type]
    assert gone[0].evidence == f"user or {ADMIN_KEYS_DIR}/alice missing" and not gone[0].passed
