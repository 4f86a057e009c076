"""Render every file a cluster needs from its spec, without touching a host.

`render(cluster)` is pure: the same spec (and node addresses) gives byte-identical files.
`write_render(files, out)` puts them in a build directory, replacing each file atomically and
removing files an earlier render made that this one no longer does.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jinja2

from provision import REPO_ROOT
from provision.errors import UsageError
from provision.render import contract
from provision.render.context import Cluster
from provision.render.contract import emitted
from provision.render.firewall import address_sets, pool_rules
from provision.render.gpu import nccl_conf
from provision.render.slurm import gres_conf_context, slurm_conf_context
from provision.render.yamldata import Template, yaml_mapping, yaml_value
from provision.spec.fabric import fabric_addresses, rails

TEMPLATES = REPO_ROOT / "templates"
MANIFEST = ".provision-render.json"
# Where the roles install the rendered nftables sets file on each node.
NFT_SETS_PATH = "/etc/nftables.d/provision-sets.nft"

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


def _template(name: str, **context: Any) -> str:
    return _ENV.get_template(name).render(**context)


def render(cluster: Cluster) -> dict[str, str]:
    """Relative path -> file content, for every artifact of the cluster."""
    header = cluster.header
    files: dict[str, str] = {
        "inventory/hosts.yml": render_inventory(cluster),
        "inventory/group_vars/all.yml": render_group_vars(cluster),
        "files/hosts": _template(
            "hosts.j2",
            header=header,
            nodes=[n for n in cluster.nodes if n.address is not None],
            domain=cluster.spec.network.management.domain,
        ),
        "files/nftables/sets.nft": _template(
            "nftables-sets.nft.j2", header=header, sets=address_sets(cluster)
        ),
    }
    for pool, rules in pool_rules(cluster).items():
        lines = []
        for rule in rules:
            for source in rule.sources:
                match = f"ip saddr @{source}" if "/" not in source else f"ip saddr {source}"
                lines.append(
                    f'{match} {rule.protocol} dport {rule.ports} accept comment "{rule.service}"'
                )
        role = next(p.pool.role for p in cluster.pools if p.name == pool)
        files[f"files/nftables/{pool}.nft"] = _template(
            "nftables.nft.j2",
            header=header,
            pool=pool,
            role=role,
            sets_path=NFT_SETS_PATH,
            rule_lines=lines,
        )
    for view in cluster.pools:
        if view.profile.gpu is not None:
            files[f"files/nccl/{view.name}.conf"] = nccl_conf(cluster, view)
    if cluster.spec.scheduler == "slurm":
        files["files/slurm/slurm.conf"] = _template(
            "slurm.conf.j2", header=header, **slurm_conf_context(cluster)
        )
        files["files/slurm/gres.conf"] = _template(
            "gres.conf.j2", header=header, **gres_conf_context(cluster)
        )
        files["files/slurm/cgroup.conf"] = _template("cgroup.conf.j2", header=header)
    return dict(sorted(files.items()))


def render_inventory(cluster: Cluster) -> str:
    spec = cluster.spec
    lasting = cluster.lasting_nodes
    fabric = spec.network.fabric
    addresses, _ = fabric_addresses(spec, cluster.profiles, lasting)
    groups: list[dict[str, Any]] = []
    for role in ("head", "login", "compute", "storage"):
        hosts = [
            _host(n.name, ansible_host=n.address and str(n.address))
            for n in lasting
            if n.role == role
        ]
        groups.append({"name": role, "vars": [], "hosts": hosts})
    # GPU nodes: the NVIDIA roles run here
    hosts = [
        _host(n.name) for v in cluster.pools if v.profile.gpu for n in v.nodes if not n.elastic
    ]
    groups.append({"name": "gpu", "vars": [], "hosts": hosts})
    # Nodes on the RDMA fabric (the rdma and ipoib roles), and the fabric's subnet managers
    fabric_pools = [v for v in cluster.pools if rails(v.profile, fabric.kind)]
    hosts = [_host(n.name) for v in fabric_pools for n in v.nodes if not n.elastic]
    groups.append({"name": "fabric", "vars": [], "hosts": hosts})
    # opensm: the higher priority is master; the first named gets 15, the next 14, ...
    hosts = [_host(name, opensm_priority=15 - i) for i, name in enumerate(fabric.subnet_managers)]
    groups.append({"name": "subnet_manager", "vars": [], "hosts": hosts})
    for view in cluster.pools:
        gpu = view.profile.gpu
        gvars: dict[str, object] = {"provision_pool": view.name}
        if gpu:
            gvars["provision_nvswitch"] = gpu.nvswitch
        if view.pool.mig:
            gvars["provision_mig_layout"] = list(view.pool.mig)
        pool_rails = rails(view.profile, fabric.kind)
        if pool_rails:
            netdevs = [r.netdev for r in pool_rails if r.netdev]
            devices = [r.device for r in pool_rails if r.device]
            if netdevs:
                gvars["provision_fabric_netdevs"] = netdevs
            if devices:
                gvars["provision_fabric_devices"] = devices
        hosts = [
            _host(n.name, provision_fabric_addresses=addresses[n.name])
            if n.name in addresses
            else _host(n.name)
            for n in view.nodes
            if not n.elastic
        ]
        groups.append(
            {"name": f"pool_{view.name}", "vars": _pairs(emitted(gvars, "pool")), "hosts": hosts}
        )
    for provider in sorted({p.pool.provider for p in cluster.pools}):
        hosts = [_host(n.name) for n in lasting if n.provider == provider]
        groups.append({"name": f"provider_{provider}", "vars": [], "hosts": hosts})
    all_vars = {
        "ansible_user": spec.ssh.user,
        "ansible_port": spec.ssh.port,
        # every supported OS has it; naming it saves Ansible's interpreter discovery on each run
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    if spec.ssh.user != "root":
        all_vars["ansible_become"] = True
    return _template(
        "inventory.yml.j2",
        header=cluster.header,
        all_vars=_pairs(emitted(all_vars, "connection")),
        groups=groups,
    )


def _pairs(values: dict[str, object]) -> list[tuple[str, str]]:
    """Variables as (name, YAML value) pairs; every string is data (see yamldata)."""
    return [(key, yaml_value(value)) for key, value in values.items() if value is not None]


def _host(name: str, **hostvars: object) -> tuple[str, list[tuple[str, str]]]:
    """A host of the inventory: its name and its variables, each as a YAML value."""
    return name, _pairs(emitted(hostvars, "host"))


def group_vars(cluster: Cluster) -> dict[str, Any]:
    """Variables for every host: only what the spec sets; the roles own their defaults."""
    spec = cluster.spec
    out: dict[str, Any] = {
        "provision_cluster": spec.name,
        "provision_scheduler": spec.scheduler,
        "provision_files_dir": Template("{{ inventory_dir }}/../files"),
        "provision_nft_sets_path": NFT_SETS_PATH,
    }
    if spec.network.time_servers:
        out["common_time_servers"] = list(spec.network.time_servers)
    out["common_time_allow"] = [str(spec.network.management.cidr)]
    if spec.security.admins:
        out["common_admin_users"] = [
            {"name": a.name, "sudo": a.sudo, "ssh_keys": list(a.ssh_keys)}
            for a in spec.security.admins
        ]
    if spec.scheduler == "slurm" and "accounting" in spec.slurm.model_fields_set:
        out["slurm_accounting"] = spec.slurm.accounting
    fabric = spec.network.fabric
    if "fabric" in spec.network.model_fields_set:
        out["provision_fabric"] = fabric.kind
    for section, table in (
        (spec.software, contract.SOFTWARE),
        (spec.nvidia, contract.NVIDIA),
        (fabric, contract.FABRIC),
        (fabric.roce, contract.ROCE),
    ):
        for field in sorted(section.model_fields_set & set(table)):
            value = getattr(section, field)
            if value is not None:
                out[table[field]] = value
    return emitted(out, "all")


def render_group_vars(cluster: Cluster) -> str:
    return f"---\n# {cluster.header}\n" + yaml_mapping(group_vars(cluster))


def write_render(files: dict[str, str], out: Path) -> list[str]:
    """Write files under `out`; return the paths that changed. Files an earlier render wrote
    and this one does not are removed; files the render does not own are never touched."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} is a file: name a directory to render into")
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    previous = _manifest(out)
    changed = []
    digests = {}
    for rel, content in files.items():
        digest = hashlib.sha256(content.encode()).hexdigest()
        digests[rel] = digest
        target = out / rel
        if target.exists() and target.read_text(encoding="utf-8") == content:
            continue
        _atomic_write(target, content)
        changed.append(rel)
    for rel in sorted(set(previous) - set(files)):
        stale = out / rel
        if stale.is_file():
            stale.unlink()
            changed.append(rel)
    _atomic_write(manifest_path, json.dumps({"files": digests}, indent=1, sort_keys=True) + "\n")
    return changed


def _atomic_write(target: Path, content: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_render(directory: Path) -> dict[str, str]:
    """The files a render wrote into `directory` (by its manifest), or {} if none."""
    names = _manifest(directory)
    return {
        rel: (directory / rel).read_text() for rel in sorted(names) if (directory / rel).is_file()
    }


def _manifest(directory: Path) -> dict[str, str]:
    """The files an earlier render recorded in `directory`: each a plain relative path that
    stays inside it (a manifest is a file anyone could edit; render deletes what it names)."""
    path = directory / MANIFEST
    if not path.exists():
        return {}
    try:
        names = json.loads(path.read_text()).get("files", {})
        assert isinstance(names, dict)
    except (ValueError, AttributeError, AssertionError):
        raise UsageError(f"{path} is damaged: remove it (render writes it again)") from None
    root = directory.resolve()
    for rel in names:
        parts = Path(rel).parts
        inside = (directory / rel).resolve().is_relative_to(root)
        if not parts or Path(rel).is_absolute() or ".." in parts or not inside:
            raise UsageError(
                f"{path} names {rel!r}, outside {directory}: remove the manifest (render writes it "
                "again) and look at who wrote that"
            )
    return {str(k): str(v) for k, v in names.items()}
