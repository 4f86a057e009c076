"""Shared storage on real nodes: what the renderer hands the nfs_server and mounts roles, the
ganesha.conf the role writes from it (Ansible's own templating of the role's template), which
node mounts what, and the firewall's NFS rule. Live: molecule/storage (nfs-ganesha serving a
compute node read-write and read-only and refusing the head, checked with libnfs; the mounts
in /etc/fstab and the mounting in check mode); the lab's volumes: tests/test_lab_storage.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provision.cluster import Cluster
from provision.errors import SpecError
from provision.render import render
from provision.render.firewall import pool_rules
from provision.spec import load_spec

from .conftest import ROLES_DIR

SPEC = """\
name: st
os: debian12
network:
  management: {cidr: 10.1.0.0/24, domain: st.example.org}
pools:
  - {name: head, role: head, profile: cpu-node, hosts: [{name: head001, address: 10.1.0.10}]}
  - {name: store, role: storage, profile: cpu-node, count: 1, first_address: 10.1.0.20}
  - {name: gpu, role: compute, profile: cpu-node, count: 2, first_address: 10.1.0.30}
security:
  admin_cidrs: [10.9.0.0/24]
storage:
  exports:
    - pool: store
      path: /srv/home
      clients:
        - {pools: [gpu, head], access: rw, squash: none}
        - {network: 10.2.0.0/16, access: ro, squash: all}
    - {pool: head, path: /srv/apps}
  mounts:
    - source: "store001.st.example.org:/srv/home"
      path: /home
      pools: [head, gpu]
      options: "rw,hard,_netdev"
    - {source: "10.1.0.10:/srv/apps", path: /srv/apps}
    - {source: "10.3.0.5@tcp:/scratch", path: /scratch, pools: [gpu], fstype: lustre}
"""


def _cluster(tmp_path: Path, text: str = SPEC) -> Cluster:
    path = tmp_path / "st.yaml"
    path.write_text(text)
    return Cluster(load_spec(path))


def _pool_vars(cluster: Cluster) -> dict[str, dict[str, Any]]:
    from ansible.parsing.dataloader import DataLoader

    hosts = DataLoader().load(render(cluster)["inventory/hosts.yml"])
    groups = hosts["all"]["children"]
    return {
        name.removeprefix("pool_"): dict(group.get("vars") or {})
        for name, group in groups.items()
        if name.startswith("pool_")
    }


def test_static_nodes_serve_and_mount_nfs_and_mount_lustre(tmp_path: Path) -> None:
    pools = _pool_vars(_cluster(tmp_path))
    assert pools["store"]["nfs_server_exports"] == [
        {
            "path": "/srv/home",
            "clients": [
                {
                    "match": ["10.1.0.10", "10.1.0.30", "10.1.0.31"],
                    "access": "rw",
                    "squash": "none",
                },
                {"match": ["10.2.0.0/16"], "access": "ro", "squash": "all"},
            ],
            # mounted as /home: the users' homes are made here (no admins: the login user's)
            "homes_dir": "/srv/home",
        }
    ]
    # no clients given: every address of the management network, read-write, root squashed
    assert pools["head"]["nfs_server_exports"] == [
        {
            "path": "/srv/apps",
            "clients": [{"match": ["10.1.0.0/24"], "access": "rw", "squash": "root"}],
        }
    ]
    assert "nfs_server_exports" not in pools["gpu"]
    home = {
        "src": "store001.st.example.org:/srv/home",
        "path": "/home",
        "fstype": "nfs4",
        "opts": "rw,hard,_netdev",
    }
    # the head serves /srv/apps at that path: it keeps its directory, the others mount it
    apps = {
        "src": "10.1.0.10:/srv/apps",
        "path": "/srv/apps",
        "fstype": "nfs4",
        "opts": "defaults,_netdev",
        "skip_on": "head001",
    }
    scratch = {"src": "10.3.0.5@tcp:/scratch", "path": "/scratch", "fstype": "lustre"}
    scratch["opts"] = "defaults,_netdev"
    assert pools["gpu"]["mounts_filesystems"] == [home, apps, scratch]
    assert pools["head"]["mounts_filesystems"] == [home, apps]


def test_a_lab_pool_gets_volumes_not_roles(tmp_path: Path) -> None:
    text = SPEC.replace(
        "profile: cpu-node, count: 2", "profile: lab-container, provider: lab, count: 2"
    )
    text = text.replace(
        '    - {source: "10.3.0.5@tcp:/scratch", path: /scratch, pools: [gpu], fstype: lustre}\n',
        "",
    )
    text = text.replace(
        "        - {pools: [gpu, head], access: rw, squash: none}\n",
        "        - {pools: [head], access: rw, squash: none}\n        - {network: 10.1.0.0/24}\n",
    )
    pools = _pool_vars(_cluster(tmp_path, text))
    assert "mounts_filesystems" not in pools["gpu"]
    assert "mounts_filesystems" in pools["head"]


def _mounts_here(filesystems: list[dict[str, str]], host: str) -> list[dict[str, str]]:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    expr = DataLoader().load((ROLES_DIR / "mounts" / "vars" / "main.yml").read_text())
    templar = Templar(
        loader=DataLoader(),
        variables={"mounts_filesystems": filesystems, "inventory_hostname": host},
    )
    return templar.template(trust_as_template(expr["_mounts_here"]))  # type: ignore[no-any-return]


def test_the_server_of_a_directory_does_not_mount_it_over_itself(tmp_path: Path) -> None:
    mounts = _pool_vars(_cluster(tmp_path))["head"]["mounts_filesystems"]
    assert [m["path"] for m in _mounts_here(mounts, "head001")] == ["/home"]
    assert [m["path"] for m in _mounts_here(mounts, "head002")] == ["/home", "/srv/apps"]


def test_a_server_binds_its_own_export_where_the_others_mount_it(tmp_path: Path) -> None:
    # the head serves /srv/hh, which every pool mounts as /home (the usual small cluster)
    text = SPEC.replace(
        "    - {pool: head, path: /srv/apps}\n",
        "    - {pool: head, path: /srv/apps}\n    - {pool: head, path: /srv/hh}\n",
    )
    text = text.replace('"store001.st.example.org:/srv/home"', '"head001:/srv/hh"')
    pools = _pool_vars(_cluster(tmp_path, text))
    home = pools["head"]["mounts_filesystems"][0]
    assert (home["path"], home["bind_on"], home["bind_src"]) == ("/home", "head001", "/srv/hh")
    # a node of another pool mounts it over NFS, and its pool's entry names no binding
    gpu = pools["gpu"]["mounts_filesystems"]
    assert "bind_on" not in gpu[0]
    assert _mount_task(gpu, "gpu001") == [
        ("head001:/srv/hh", "/home", "nfs4", "rw,hard,_netdev"),
        ("10.1.0.10:/srv/apps", "/srv/apps", "nfs4", "defaults,_netdev"),
        ("10.3.0.5@tcp:/scratch", "/scratch", "lustre", "defaults,_netdev"),
    ]
    # on the head: bound, never an NFS mount of itself (its own name may be 127.0.1.1, which
    # the export does not admit), and no NFS client needed for it; another node of its pool
    # would mount it
    head = pools["head"]["mounts_filesystems"]
    assert _mount_task(head, "head001") == [("/srv/hh", "/home", "none", "bind")]
    assert _mounts_here(head, "head001") == []
    assert [m[:3] for m in _mount_task(head, "head002")] == [
        ("head001:/srv/hh", "/home", "nfs4"),
        ("10.1.0.10:/srv/apps", "/srv/apps", "nfs4"),
    ]


def _mount_task(filesystems: list[dict[str, str]], host: str) -> list[tuple[str, ...]]:
    """(src, path, fstype, opts) of each mount the role's mount task makes on host, in order:
    the task's own arguments and condition, templated per item by Ansible."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    tasks = DataLoader().load((ROLES_DIR / "mounts" / "tasks" / "main.yml").read_text())
    task = next(
        t for t in tasks if "ansible.posix.mount" in t and t["loop"] == "{{ mounts_filesystems }}"
    )
    args = task["ansible.posix.mount"]
    made = []
    for item in filesystems:
        variables: dict[str, Any] = {"item": item, "inventory_hostname": host}
        bound = Templar(loader=DataLoader(), variables=variables).template(
            trust_as_template(task["vars"]["_bound"])
        )
        templar = Templar(loader=DataLoader(), variables={**variables, "_bound": bound})
        if not templar.template(trust_as_template("{{ " + task["when"] + " }}")):
            continue
        made.append(
            tuple(
                str(templar.template(trust_as_template(args[k])))
                for k in ("src", "path", "fstype", "opts")
            )
        )
    return made


def _ganesha_conf(exports: list[dict[str, Any]], template: str = "ganesha.conf.j2") -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role = ROLES_DIR / "nfs_server"
    loader = DataLoader()
    variables = {
        **loader.load((role / "defaults" / "main.yml").read_text()),
        **loader.load((role / "vars" / "main.yml").read_text()),
        "nfs_server_exports": exports,
        "ansible_managed": "Managed by Ansible",
    }
    templar = Templar(loader=loader, variables=variables)
    text = (role / "templates" / template).read_text()
    return str(templar.template(trust_as_template(text)))


def test_ganesha_conf_admits_each_client_with_its_access(tmp_path: Path) -> None:
    conf = _ganesha_conf(_pool_vars(_cluster(tmp_path))["store"]["nfs_server_exports"])
    assert "Protocols = 4;" in conf
    assert "Only_Numeric_Owners = true;" in conf
    assert "Grace_Period = 90;" in conf
    # nothing is exported to anyone by default: each client block opens its own way in
    assert conf.count("Access_Type = None;") == 2
    export = conf[conf.index("EXPORT {") :]
    assert 'Path = "/srv/home";' in export and 'Pseudo = "/srv/home";' in export
    assert "Export_Id = 1;" in export
    blocks = [b.split("}")[0] for b in export.split("CLIENT {")[1:]]
    assert [" ".join(b.split()) for b in blocks] == [
        "Clients = 10.1.0.10, 10.1.0.30, 10.1.0.31; Access_Type = RW; Squash = No_Root_Squash;",
        "Clients = 10.2.0.0/16; Access_Type = RO; Squash = All_Squash;",
    ]


def test_a_client_entry_that_matches_no_node_writes_no_client_block() -> None:
    conf = _ganesha_conf(
        [{"path": "/srv/x", "clients": [{"match": [], "access": "rw", "squash": "root"}]}]
    )
    assert "CLIENT" not in conf and 'Path = "/srv/x";' in conf


def test_the_kernel_servers_exports_admit_each_client_with_its_access(tmp_path: Path) -> None:
    """storage.nfs_server: kernel: /etc/exports.d/provision.exports, one line an export, each
    client with its access and squash; an export no client matches is not written at all (a
    path alone there would export it to every host)."""
    kernel = SPEC.replace("storage:\n", "storage:\n  nfs_server: kernel\n", 1)
    store = _pool_vars(_cluster(tmp_path, kernel))["store"]
    assert store["nfs_server_implementation"] == "kernel"
    assert "nfs_server_implementation" not in _pool_vars(_cluster(tmp_path))["store"]
    exports = store["nfs_server_exports"]
    lines = _ganesha_conf(exports, "exports.j2").splitlines()
    assert [line for line in lines if not line.startswith("#")] == [
        "/srv/home 10.1.0.10(rw,sync,no_subtree_check,no_root_squash) "
        "10.1.0.30(rw,sync,no_subtree_check,no_root_squash) "
        "10.1.0.31(rw,sync,no_subtree_check,no_root_squash) "
        "10.2.0.0/16(ro,sync,no_subtree_check,all_squash)"
    ]
    nobody = _ganesha_conf(
        [{"path": "/srv/x", "clients": [{"match": [], "access": "rw", "squash": "root"}]}],
        "exports.j2",
    )
    assert [line for line in nobody.splitlines() if "/srv/x" in line] == [
        "# /srv/x: no client matches it, not exported"
    ]


def test_nfs_is_open_to_the_cluster_and_the_networks_exports_name(tmp_path: Path) -> None:
    rules = pool_rules(_cluster(tmp_path))
    nfs = [r for r in rules["store"] if r.service == "nfs"]
    assert [(r.ports, r.sources) for r in nfs] == [("2049", ("cluster_nodes", "10.2.0.0/16"))]
    assert not [r for r in rules["gpu"] if r.service == "nfs"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("    - {pool: head, path: /srv/apps}\n", ""),
            "storage.mounts[1].source: head001 exports nothing holding /srv/apps: add it to "
            "storage.exports for pool 'head'",
        ),
        (
            ("{pools: [gpu, head], access: rw", "{pools: [gpu], access: rw"),
            "pool 'head' mounts store001.st.example.org:/srv/home, but "
            "storage.exports[0].clients does not admit it",
        ),
        (
            ('"10.3.0.5@tcp:/scratch"', '"lustre01:/scratch"'),
            "'lustre01:/scratch' is not a Lustre source",
        ),
        (
            ('"store001.st.example.org:/srv/home"', '"store001.st.example.org@tcp:/srv/home"'),
            "should be 'server:/path'",
        ),
    ],
)
def test_storage_the_nodes_would_fail_at_is_refused(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = tmp_path / "st.yaml"
    assert change[0] in SPEC
    path.write_text(SPEC.replace(*change))
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    assert message in str(raised.value)


def test_a_pool_without_addresses_cannot_be_named_as_clients(tmp_path: Path) -> None:
    text = SPEC.replace(
        "profile: cpu-node, count: 2, first_address: 10.1.0.30",
        "profile: aws-p5.48xlarge, provider: aws, region: us-east-1, count: 2, network: aws",
    )
    remote = "\n  remote: [{name: aws, cidr: 10.2.0.0/16}]"
    text = text.replace("domain: st.example.org}", "domain: st.example.org}" + remote)
    path = tmp_path / "st.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    assert "pool 'gpu' has nodes without a known address" in str(raised.value)


def test_plan_names_the_nfs_restart_and_the_mounts_that_come_and_stay(tmp_path: Path) -> None:
    from provision.changes import changes

    old = render(_cluster(tmp_path))
    assert changes(old, old).storage is None
    # the network client becomes read-write; /scratch leaves the spec; /data comes
    text = SPEC.replace("access: ro, squash: all", "access: rw, squash: all")
    text = text.replace(
        '    - {source: "10.3.0.5@tcp:/scratch", path: /scratch, pools: [gpu], fstype: lustre}\n',
        '    - {source: "filer.example.org:/data", path: /data, pools: [gpu]}\n',
    )
    found = changes(old, render(_cluster(tmp_path, text))).storage
    assert found is not None
    assert found.to_json() == {
        "nfs_server_restarts": ["store001"],
        "mounts_added": {"gpu001": ["/data"], "gpu002": ["/data"]},
        "mounts_left_mounted": {"gpu001": ["/scratch"], "gpu002": ["/scratch"]},
        "nfs_servers_left_serving": [],
    }


def test_plan_says_a_server_left_with_no_exports_goes_on_serving(tmp_path: Path) -> None:
    from provision.changes import changes

    old = render(_cluster(tmp_path))
    # the head's /srv/apps export leaves the spec, and the mount of it with it
    text = SPEC.replace("    - {pool: head, path: /srv/apps}\n", "")
    text = text.replace('    - {source: "10.1.0.10:/srv/apps", path: /srv/apps}\n', "")
    found = changes(old, render(_cluster(tmp_path, text))).storage
    assert found is not None
    assert found.left_serving == ("head001",)
    assert found.servers == ()


def test_a_mount_of_a_servers_root_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "st.yaml"
    path.write_text(SPEC.replace('"10.1.0.10:/srv/apps"', '"10.1.0.10:/"'))
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    assert str(raised.value).endswith(
        "storage.mounts[1].source: head001 exports nothing holding / (it exports /srv/apps): "
        "add it to storage.exports for pool 'head'"
    )
