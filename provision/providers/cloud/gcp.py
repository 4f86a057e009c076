"""The cluster's GCP side as one Pulumi component: a VPC network and subnetwork (plus one network
per extra NIC, which GCP requires), firewall rules from the cluster's rule set, a compact
placement policy for GPU pools (or, where the pool names a reservation, the template consumes
that reservation and its placement), an instance template per pool (gVNIC, the extra NICs of
a3, GPUs stop for host maintenance) and the pool's lasting instances; where a pool is elastic,
the munge key's secret, each pool's node account, and the heads' burst account with its key."""

from __future__ import annotations

import base64

import pulumi
import pulumi_gcp as gcp

from provision.burst.config import cloud_template, fit_name, munge_secret, tunnel_secret
from provision.providers.cloud.joining import pool_user_data
from provision.providers.cloud.layout import IMAGES, ROOT_GB, CloudLayout, CloudPool

# Compute Engine names are at most 63 characters; Pulumi names a resource from its own name
# plus "-" and 7 characters
AUTONAMED_MAX = 63 - 8
# the label a specific reservation is named by in an instance's reservation affinity
RESERVATION_KEY = "compute.googleapis.com/reservation-name"


def extra_nic_range(i: int) -> str:
    """The subnetwork of extra NIC i (each NIC of a GCP VM needs its own VPC network)."""
    return f"172.{16 + i}.0.0/16"


def _name(layout: CloudLayout, *parts: str) -> str:
    """A resource's name that Compute Engine takes once Pulumi has added its suffix."""
    return fit_name(layout.name(*parts), AUTONAMED_MAX)


def _labels(layout: CloudLayout, pool: str | None = None) -> dict[str, str]:
    return {k: v.lower() for k, v in layout.tags(pool).items()}


def account_id(layout: CloudLayout, pool: str) -> str:
    """A pool's service account ID: 6-30 lower-case letters, digits and hyphens, starting with
    a letter (IAM's rule)."""
    text = "".join(c if c.isalnum() else "-" for c in f"{layout.cluster}-{pool}".lower())
    if not text[:1].isalpha():
        text = f"p-{text}"
    return fit_name(text.strip("-"), 30).ljust(6, "0")


class GcpCluster(pulumi.ComponentResource):
    def __init__(
        self,
        layout: CloudLayout,
        munge_key: bytes | None = None,
        tunnel_keys: dict[str, bytes] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        self.tunnel_keys = tunnel_keys or {}
        super().__init__("provision:gcp:Cluster", layout.cluster, None, opts)
        region = next((p.region for p in layout.pools if p.region), None)
        provider = gcp.Provider(
            _name(layout, "gcp"),
            region=region,
            default_labels=_labels(layout),
            opts=pulumi.ResourceOptions(parent=self),
        )
        here = pulumi.ResourceOptions(parent=self, provider=provider)
        network = gcp.compute.Network(
            _name(layout, "net"), auto_create_subnetworks=False, mtu=8896, opts=here
        )
        subnet = gcp.compute.Subnetwork(
            _name(layout, "subnet"),
            network=network.id,
            ip_cidr_range=layout.cidr,
            region=region,
            opts=here,
        )
        extra = []
        for i in range(max((p.extra_nics for p in layout.pools), default=0)):
            net = gcp.compute.Network(
                _name(layout, f"gpunet{i}"), auto_create_subnetworks=False, mtu=8896, opts=here
            )
            extra.append(
                gcp.compute.Subnetwork(
                    _name(layout, f"gpusubnet{i}"),
                    network=net.id,
                    ip_cidr_range=extra_nic_range(i),
                    region=region,
                    opts=here,
                )
            )
            gcp.compute.Firewall(
                _name(layout, f"gpunet{i}-internal"),
                network=net.id,
                direction="INGRESS",
                source_ranges=[extra_nic_range(i)],
                allows=[gcp.compute.FirewallAllowArgs(protocol="all")],
                opts=here,
            )
        self.nodes: dict[str, dict[str, pulumi.Output[str]]] = {}
        self.templates: dict[str, pulumi.Output[str]] = {}
        self.instances: dict[str, gcp.compute.InstanceFromTemplate] = {}
        self.secret = _munge_secret(layout, munge_key, here) if layout.bursts else None
        self.node_accounts: dict[str, gcp.serviceaccount.Account] = {}  # elastic pools'
        made = here
        address = None
        if layout.api is not None:  # reserved first: Compute Engine gives it no instance
            address = gcp.compute.Address(
                _name(layout, "api"),
                name=_name(layout, "api"),
                address_type="INTERNAL",
                address=layout.api.address,
                subnetwork=subnet.id,
                region=region,
                description=f"{layout.cluster}: the Kubernetes API's internal load balancer",
                opts=here,
            )
            made = pulumi.ResourceOptions.merge(here, pulumi.ResourceOptions(depends_on=[address]))
        for pool in layout.pools:
            self._pool(
                layout, pool, network, subnet, extra, IMAGES[layout.os_name]["gcp"][0], region, made
            )
        if address is not None:
            self._api_balancer(layout, network, subnet, address, region, here)
        # what the heads' burst programs act as: a service account whose key apply puts on
        # them, the same whether they are on premises or instances of this stack
        self.burst_credentials: pulumi.Output[str] | None = None
        if layout.bursts:
            self.burst_credentials = _burst_account(layout, self.node_accounts, provider, here)
        self.register_outputs({"nodes": self.nodes, "templates": self.templates})

    def _pool(
        self,
        layout: CloudLayout,
        pool: CloudPool,
        network: gcp.compute.Network,
        subnet: gcp.compute.Subnetwork,
        extra: list[gcp.compute.Subnetwork],
        image: str,
        region: str | None,
        here: pulumi.ResourceOptions,
    ) -> None:
        tag = _name(layout, pool.name)
        _firewall_rules(layout, pool, network, tag, here)
        policy_link = None
        affinity = None
        if pool.reservation:  # the reservation holds the placement: no compact policy of ours
            affinity = gcp.compute.InstanceTemplateReservationAffinityArgs(
                type="SPECIFIC_RESERVATION",
                specific_reservation=(
                    gcp.compute.InstanceTemplateReservationAffinitySpecificReservationArgs(
                        key=RESERVATION_KEY, values=[pool.reservation]
                    )
                ),
            )
        elif pool.gpus:
            policy = gcp.compute.ResourcePolicy(
                _name(layout, pool.name, "compact"),
                region=region,
                group_placement_policy=gcp.compute.ResourcePolicyGroupPlacementPolicyArgs(
                    collocation="COLLOCATED"
                ),
                opts=here,
            )
            policy_link = policy.self_link
        metadata: dict[str, object] = {"ssh-keys": f"{layout.admin_user}:{layout.ssh_public_key}"}
        account = None
        if pool.join is not None:  # cloud-init reads `user-data` on Compute Engine
            metadata["user-data"] = pool_user_data(layout, pool, self.nodes)
            account = self._reader(layout, pool, here)
        template = gcp.compute.InstanceTemplate(
            _name(layout, pool.name, "tpl"),
            # a fixed name: bursting makes instances from it by name (provision/burst/gcp.py)
            name=cloud_template(layout.cluster, pool.name),
            machine_type=pool.instance_type,
            disks=[
                # every GCP disk is encrypted at rest (Google-managed keys)
                gcp.compute.InstanceTemplateDiskArgs(
                    # an elastic pool's own image once made
                    source_image=pool.image or image,
                    boot=True,
                    auto_delete=True,
                    disk_size_gb=ROOT_GB,
                    disk_type="pd-ssd",
                )
            ],
            network_interfaces=_interfaces(pool, subnet, extra),
            scheduling=_scheduling(pool),
            resource_policies=policy_link,
            reservation_affinity=affinity,
            metadata=metadata,
            service_account=account,
            tags=[tag],
            labels=_labels(layout, pool.name),
            # templates cannot change in place; with a fixed name the old one goes first
            opts=pulumi.ResourceOptions.merge(
                here, pulumi.ResourceOptions(delete_before_replace=True)
            ),
        )
        self.templates[pool.name] = template.self_link
        for node in pool.nodes:
            instance = gcp.compute.InstanceFromTemplate(
                _name(layout, node),
                name=node,
                zone=pool.zone,
                source_instance_template=template.self_link_unique,
                labels=_labels(layout, pool.name),
                opts=here,
            )
            self.instances[node] = instance
            nic = instance.network_interfaces.apply(lambda n: n[0])
            self.nodes[node] = {
                "private": nic.apply(lambda n: n.network_ip or ""),
                "public": nic.apply(
                    lambda n: (n.access_configs[0].nat_ip or "") if n.access_configs else ""
                ),
            }

    def _api_balancer(
        self,
        layout: CloudLayout,
        network: gcp.compute.Network,
        subnet: gcp.compute.Subnetwork,
        address: gcp.compute.Address,
        region: str | None,
        here: pulumi.ResourceOptions,
    ) -> None:
        """The internal passthrough Network Load Balancer of the API: the heads in an unmanaged
        instance group, a regional backend service (INTERNAL, TCP, by connection) checking
        each API server's /readyz over HTTPS, and a forwarding rule at the reserved address on
        the API's port. Packets reach a head addressed to the balancer (the guest agent routes
        that address to the head itself), which the API server, listening on every address,
        takes; the heads' own API traffic never goes through it (their firewall sends it to
        their haproxy), since Compute Engine answers a backend's own with itself."""
        api = layout.api
        assert api is not None
        heads = next(p for p in layout.pools if p.name == api.pool)
        group = gcp.compute.InstanceGroup(
            _name(layout, "api", "heads"),
            name=_name(layout, "api", "heads"),
            zone=api.zone,
            network=network.id,
            instances=[self.instances[node].self_link for node in heads.nodes],
            named_ports=[gcp.compute.InstanceGroupNamedPortArgs(name="kube-api", port=api.port)],
            opts=here,
        )
        check = gcp.compute.RegionHealthCheck(
            _name(layout, "api", "readyz"),
            region=region,
            https_health_check=gcp.compute.RegionHealthCheckHttpsHealthCheckArgs(
                port=api.port, request_path="/readyz"
            ),
            check_interval_sec=5,
            timeout_sec=5,
            healthy_threshold=2,
            unhealthy_threshold=2,
            opts=here,
        )
        backend = gcp.compute.RegionBackendService(
            _name(layout, "api"),
            region=region,
            load_balancing_scheme="INTERNAL",
            protocol="TCP",
            health_checks=check.id,
            backends=[
                gcp.compute.RegionBackendServiceBackendArgs(
                    group=group.self_link, balancing_mode="CONNECTION"
                )
            ],
            opts=here,
        )
        gcp.compute.ForwardingRule(
            _name(layout, "api"),
            region=region,
            load_balancing_scheme="INTERNAL",
            ip_address=address.address,
            ip_protocol="TCP",
            ports=[str(api.port)],
            backend_service=backend.id,
            network=network.id,
            subnetwork=subnet.id,
            opts=here,
        )

    def _reader(
        self, layout: CloudLayout, pool: CloudPool, here: pulumi.ResourceOptions
    ) -> gcp.compute.InstanceTemplateServiceAccountArgs:
        """The pool's service account, allowed to read the cluster's munge key secret and
        nothing else (the secret's own IAM binding; the cloud-platform scope, as Google asks,
        with IAM deciding)."""
        assert self.secret is not None
        account = gcp.serviceaccount.Account(
            _name(layout, pool.name, "node"),
            account_id=account_id(layout, pool.name),
            display_name=f"{layout.cluster} pool {pool.name}: burst nodes",
            opts=here,
        )
        self.node_accounts[pool.name] = account
        member = account.email.apply(lambda email: f"serviceAccount:{email}")
        gcp.secretmanager.SecretIamMember(
            _name(layout, pool.name, "munge"),
            secret_id=self.secret.id,
            role="roles/secretmanager.secretAccessor",
            member=member,
            opts=here,
        )
        if pool.join is not None and pool.join.tunnel_secret:  # a remote pool's tunnel keys
            keys = _secret(
                layout,
                _name(layout, pool.name, "tunnel-keys"),
                tunnel_secret(layout.cluster, pool.name),
                self.tunnel_keys.get(pool.name),
                here,
            )
            gcp.secretmanager.SecretIamMember(
                _name(layout, pool.name, "tunnel-keys"),
                secret_id=keys.id,
                role="roles/secretmanager.secretAccessor",
                member=member,
                opts=here,
            )
        return gcp.compute.InstanceTemplateServiceAccountArgs(
            email=account.email, scopes=["cloud-platform"]
        )


def _scheduling(pool: CloudPool) -> gcp.compute.InstanceTemplateSchedulingArgs:
    """GPUs stop for host maintenance. A spot pool's instances are Spot VMs that Compute Engine
    deletes when it takes them back (a resume makes anew), as its Spot VM guide has them: no
    automatic restart, terminated on host maintenance."""
    if pool.spot:
        return gcp.compute.InstanceTemplateSchedulingArgs(
            provisioning_model="SPOT",
            preemptible=True,
            instance_termination_action="DELETE",
            automatic_restart=False,
            on_host_maintenance="TERMINATE",
        )
    return gcp.compute.InstanceTemplateSchedulingArgs(
        on_host_maintenance="TERMINATE" if pool.gpus else "MIGRATE",
        automatic_restart=True,
    )


def _burst_account(
    layout: CloudLayout,
    node_accounts: dict[str, gcp.serviceaccount.Account],
    provider: gcp.Provider,
    here: pulumi.ResourceOptions,
) -> pulumi.Output[str]:
    """The heads' identity in GCP: a service account with Compute Engine's instance admin role
    in the project (bulkInsert from the pools' templates, list, delete; IAM's conditions cannot
    name instances by their labels, so the grant is the project's, as slurm-gcp's controller
    has it) and the right to attach each elastic pool's node account to the instances it
    makes, and a key of it: the key file's JSON, a Pulumi secret (encrypted in the state;
    apply keeps it 0600 in the cluster's secrets, and the burst role installs it for root on
    the heads)."""
    account = gcp.serviceaccount.Account(
        _name(layout, "burst-heads"),
        account_id=account_id(layout, "burst-heads"),
        display_name=f"{layout.cluster}: the heads' burst programs",
        opts=here,
    )
    member = account.email.apply(lambda email: f"serviceAccount:{email}")
    project = gcp.organizations.get_client_config_output(
        opts=pulumi.InvokeOptions(provider=provider)
    ).project
    gcp.projects.IAMMember(
        _name(layout, "burst-heads", "compute"),
        project=project,
        role="roles/compute.instanceAdmin.v1",
        member=member,
        opts=here,
    )
    for pool, node in node_accounts.items():
        gcp.serviceaccount.IAMMember(
            _name(layout, pool, "node", "user"),
            service_account_id=node.name,
            role="roles/iam.serviceAccountUser",
            member=member,
            opts=here,
        )
    key = gcp.serviceaccount.Key(
        _name(layout, "burst-heads"), service_account_id=account.name, opts=here
    )
    return pulumi.Output.secret(key.private_key.apply(lambda text: base64.b64decode(text).decode()))


def _munge_secret(
    layout: CloudLayout, munge_key: bytes | None, here: pulumi.ResourceOptions
) -> gcp.secretmanager.Secret:
    """The cluster's munge key in Secret Manager, which burst nodes read at boot."""
    return _secret(
        layout, _name(layout, "munge-key"), munge_secret(layout.cluster), munge_key, here
    )


def _secret(
    layout: CloudLayout,
    resource: str,
    secret_id: str,
    value: bytes | None,
    here: pulumi.ResourceOptions,
) -> gcp.secretmanager.Secret:
    """A secret of the cluster in Secret Manager; its value a Pulumi secret (encrypted in the
    stack's state), sent as its own bytes; without it (a preview) only the secret."""
    secret = gcp.secretmanager.Secret(
        resource,
        secret_id=secret_id,
        replication=gcp.secretmanager.SecretReplicationArgs(
            auto=gcp.secretmanager.SecretReplicationAutoArgs()
        ),
        labels=_labels(layout),
        opts=here,
    )
    if value is not None:
        gcp.secretmanager.SecretVersion(
            resource,
            secret=secret.id,
            secret_data=pulumi.Output.secret(base64.b64encode(value).decode()),
            is_secret_data_base64=True,
            opts=here,
        )
    return secret


def _firewall_rules(
    layout: CloudLayout,
    pool: CloudPool,
    network: gcp.compute.Network,
    tag: str,
    here: pulumi.ResourceOptions,
) -> None:
    """The pool's ingress from the cluster's rule set: one rule each, on the pool's tag."""
    for n, rule in enumerate(pool.ingress):
        ports = (
            str(rule.from_port)
            if rule.from_port == rule.to_port
            else f"{rule.from_port}-{rule.to_port}"
        )
        gcp.compute.Firewall(
            _name(layout, pool.name, f"in{n}"),
            network=network.id,
            description=rule.description,
            direction="INGRESS",
            source_ranges=list(rule.cidrs),
            target_tags=[tag],
            allows=[gcp.compute.FirewallAllowArgs(protocol=rule.protocol, ports=[ports])],
            opts=here,
        )


def _interfaces(
    pool: CloudPool, subnet: gcp.compute.Subnetwork, extra: list[gcp.compute.Subnetwork]
) -> list[gcp.compute.InstanceTemplateNetworkInterfaceArgs]:
    """gVNIC on the cluster's subnet with a public address, then the type's extra NICs, one
    network each (4 on a3-highgpu-8g)."""
    return [
        gcp.compute.InstanceTemplateNetworkInterfaceArgs(
            subnetwork=subnet.id,
            nic_type="GVNIC",
            access_configs=[gcp.compute.InstanceTemplateNetworkInterfaceAccessConfigArgs()],
        )
    ] + [
        gcp.compute.InstanceTemplateNetworkInterfaceArgs(subnetwork=s.id, nic_type="GVNIC")
        for s in extra[: pool.extra_nics]
    ]
