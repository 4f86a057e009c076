"""SSSD's configuration for the spec's directory (identity): rendered here, with no secret in it.

The bind password and the directory's CA come from files the spec names; the nodes phase copies
them into the cluster's secrets directory (secrets.py), and the sssd role puts them on the nodes.
"""

from __future__ import annotations

from provision.cluster import Cluster
from provision.render.jinja import template

# SSSD's domain for the directory: the name sssctl and the logs know it by
DOMAIN = "directory"
# where the nodes keep the directory's CA (the sssd role's default)
CA_PATH = "/etc/sssd/pki/provision-directory-ca.pem"


def identity_files(cluster: Cluster) -> dict[str, str]:
    identity = cluster.spec.identity
    if identity is None:
        return {}
    return {
        "files/sssd/sssd.conf": template(
            "sssd.conf.j2",
            header=cluster.header,
            identity=identity,
            domain=DOMAIN,
            ca_path=CA_PATH,
            start_tls=identity.uris[0].startswith("ldap://"),
        )
    }
