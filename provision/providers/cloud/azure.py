"""The cluster's Azure side as one Pulumi component: a resource group, a virtual network and
subnet with a NAT gateway (its machines' way out: Azure has retired default outbound access, and
burst VMs have no public address), per pool a network security group from the cluster's rule
set and a proximity placement group (or, where the pool names one, its capacity reservation
group: Azure takes no proximity placement group beside a reservation), virtual machines for
lasting nodes (accelerated networking; an InfiniBand (ND) pool's in one availability set, as
Azure links over InfiniBand only the VMs of one availability set or of a Uniform scale set with a
single placement group, one partition key, and a Flexible scale set carries no InfiniBand) and,
for burst pools, a Flexible scale set of capacity 0 that bursting makes VMs in (its pool's own
image once made; Spot priority, deleted on eviction, for a spot pool).

What the heads act as in Azure (they are on premises): a user-assigned identity
`<cluster>-burst-heads` with a role of the cluster's own (what the burst programs do, in the
cluster's resource group alone), reached through workload identity federation: a federated
credential on the identity trusts the cluster's own OpenID Connect issuer, two public JSON
documents in a storage account of the stack (the discovery document and the key set, as
Microsoft's workload identity guide for self-managed issuers publishes them), whose key the
workstation made and apply installs on the heads. No client secret exists.

Azure's rules the program keeps (tests/cloud_rules.py holds them for the mocks): a Marketplace
image sold under a plan (Rocky Linux) is named with its plan; encryption at host is not asked
for, as Azure refuses it in a subscription that has not registered the feature
(Microsoft.Compute/EncryptionAtHost). Managed disks are encrypted at rest all the same (Azure's
server-side encryption, platform keys)."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_azure_native as az

from provision.burst.config import (
    TAG_AVAILABILITY_SET,
    cloud_group,
    cloud_template,
    key_vault,
    munge_secret,
    tunnel_secret,
)
from provision.providers.cloud.joining import pool_user_data
from provision.providers.cloud.layout import (
    AZURE_PLAN_OS,
    IMAGES,
    ROOT_GB,
    CloudLayout,
    CloudPool,
)

# Azure's built-in role that reads a Key Vault's secrets (and nothing else in it)
SECRETS_USER_ROLE = "4633458b-17de-408a-b874-0445c86b69e6"
# the public container of the heads' issuer, and the audience Entra asks of its tokens
ISSUER_CONTAINER = "oidc"
EXCHANGE_AUDIENCE = "api://AzureADTokenExchange"
# what the burst programs do (provision/burst/azure.py), in the cluster's resource group: read
# the pools' scale sets, make and delete VMs in them with their NICs and disks, attach the
# pools' node identities, place them in the pools' subnet, security groups, proximity placement
# groups or capacity reservations, and boot the pools' images
HEADS_ACTIONS = (
    "Microsoft.Compute/virtualMachineScaleSets/read",
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachines/write",
    "Microsoft.Compute/virtualMachines/delete",
    "Microsoft.Compute/disks/read",
    "Microsoft.Compute/disks/write",
    "Microsoft.Compute/disks/delete",
    "Microsoft.Compute/images/read",
    "Microsoft.Compute/proximityPlacementGroups/read",
    "Microsoft.Compute/capacityReservationGroups/read",
    "Microsoft.Compute/capacityReservationGroups/deploy/action",
    "Microsoft.Network/networkInterfaces/read",
    "Microsoft.Network/networkInterfaces/write",
    "Microsoft.Network/networkInterfaces/delete",
    "Microsoft.Network/networkInterfaces/join/action",
    "Microsoft.Network/virtualNetworks/subnets/read",
    "Microsoft.Network/virtualNetworks/subnets/join/action",
    "Microsoft.Network/networkSecurityGroups/read",
    "Microsoft.Network/networkSecurityGroups/join/action",
    "Microsoft.ManagedIdentity/userAssignedIdentities/read",
    "Microsoft.ManagedIdentity/userAssignedIdentities/assign/action",
)


def heads_subject(cluster: str) -> str:
    """The subject the heads' tokens carry and the federated credential trusts."""
    return f"provision:{cluster}:burst-heads"


def issuer_account(cluster: str, subscription: str) -> str:
    """The issuer's storage account: 3-24 lower-case letters and digits, unique in Azure (the
    cluster's name and a digest of it with the subscription)."""
    stem = "".join(c for c in cluster.lower() if c.isalnum())[:14] or "cluster"
    digest = hashlib.sha256(f"{subscription}/{cluster}".encode()).hexdigest()[:6]
    return f"{stem}oidc{digest}"


def issuer_documents(issuer: str, jwk: dict[str, str]) -> dict[str, str]:
    """The blob name -> text of the issuer's discovery document and key set."""
    discovery = {
        "issuer": issuer,
        "jwks_uri": f"{issuer}openid/v1/jwks",
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"],
    }
    return {
        ".well-known/openid-configuration": json.dumps(discovery, sort_keys=True),
        "openid/v1/jwks": json.dumps({"keys": [jwk]}, sort_keys=True),
    }


class AzureCluster(pulumi.ComponentResource):
    def __init__(
        self,
        layout: CloudLayout,
        munge_key: bytes | None = None,
        tunnel_keys: dict[str, bytes] | None = None,
        issuer_key: dict[str, str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """issuer_key: the public JWK of the heads' issuer (the workstation keeps its private
        half); the heads' identity is made where pools burst."""
        self.tunnel_keys = tunnel_keys or {}
        super().__init__("provision:azure:Cluster", layout.cluster, None, opts)
        here = pulumi.ResourceOptions(parent=self)
        location = next((p.region for p in layout.pools if p.region), None)
        tags = layout.tags()
        group = az.resources.ResourceGroup(
            layout.name("rg"),
            # a fixed name: bursting finds the pools' scale sets in it (provision/burst/azure.py)
            resource_group_name=cloud_group(layout.cluster),
            location=location,
            tags=tags,
            opts=here,
        )
        vnet = az.network.VirtualNetwork(
            layout.name("vnet"),
            resource_group_name=group.name,
            location=group.location,
            address_space=az.network.AddressSpaceArgs(address_prefixes=[layout.cidr]),
            tags=tags,
            opts=here,
        )
        outbound = _static_address(layout.name("nat-ip"), group, tags, here)
        nat = az.network.NatGateway(
            layout.name("nat"),
            resource_group_name=group.name,
            location=group.location,
            sku=az.network.NatGatewaySkuArgs(name="Standard"),
            public_ip_addresses=[az.network.SubResourceArgs(id=outbound.id)],
            tags=tags,
            opts=here,
        )
        subnet = az.network.Subnet(
            layout.name("subnet"),
            resource_group_name=group.name,
            virtual_network_name=vnet.name,
            address_prefix=layout.cidr,
            nat_gateway=az.network.SubResourceArgs(id=nat.id),
            # no implicit way out: only the NAT gateway's (or a node's own public address)
            default_outbound_access=False,
            opts=here,
        )
        publisher, offer, sku = IMAGES[layout.os_name]["azure"]
        self.image = az.compute.ImageReferenceArgs(
            publisher=publisher, offer=offer, sku=sku, version="latest"
        )
        self.plan = (
            az.compute.PlanArgs(name=sku, product=offer, publisher=publisher)
            if layout.os_name in AZURE_PLAN_OS
            else None
        )
        # the user the inventory logs in as (Azure refuses "root" as the admin account)
        self.user = layout.admin_user
        self.nodes: dict[str, dict[str, pulumi.Output[str]]] = {}
        self.templates: dict[str, pulumi.Output[str]] = {}
        self.client = az.authorization.get_client_config_output(
            opts=pulumi.InvokeOptions(parent=self)
        )
        self.vault = _vault(layout, group, self.client, here) if layout.bursts else None
        self.secret = (
            _secret(
                layout,
                "munge-key",
                munge_secret(layout.cluster),
                munge_key,
                (self.vault, group),
                here,
            )
            if self.vault is not None
            else None
        )
        self.api_backend: pulumi.Output[str] | None = None  # the API balancer's heads
        made = here
        if layout.api is not None:  # its static address first: no NIC may be given it
            balancer, self.api_backend = _api_balancer(layout, group, subnet, tags, here)
            made = pulumi.ResourceOptions.merge(here, pulumi.ResourceOptions(depends_on=[balancer]))
        for pool in layout.pools:
            self._pool(layout, pool, group, subnet, made)
        self.burst_credentials: pulumi.Output[str] | None = None
        if layout.bursts and issuer_key is not None:
            self.burst_credentials = self._heads(layout, group, issuer_key, here)
        self.register_outputs({"nodes": self.nodes, "templates": self.templates})

    def _linux(self, layout: CloudLayout) -> az.compute.LinuxConfigurationArgs:
        return az.compute.LinuxConfigurationArgs(
            disable_password_authentication=True,
            ssh=az.compute.SshConfigurationArgs(
                public_keys=[
                    az.compute.SshPublicKeyArgs(
                        path=f"/home/{self.user}/.ssh/authorized_keys",
                        key_data=layout.ssh_public_key,
                    )
                ]
            ),
        )

    def _pool(
        self,
        layout: CloudLayout,
        pool: CloudPool,
        group: az.resources.ResourceGroup,
        subnet: az.network.Subnet,
        here: pulumi.ResourceOptions,
    ) -> None:
        tags = layout.tags(pool.name)
        nsg = self._security_group(layout, pool, group, tags, here)
        ppg = None
        if not pool.reservation:  # Azure refuses a proximity placement group with one
            ppg = az.compute.ProximityPlacementGroup(
                layout.name(pool.name, "ppg"),
                resource_group_name=group.name,
                location=group.location,
                proximity_placement_group_type="Standard",
                tags=tags,
                opts=here,
            )
        where = _Where(group, subnet, nsg, ppg, pool.reservation, tags, here)
        # InfiniBand links only the VMs of one availability set (or of a Uniform scale set with
        # a single placement group; a Flexible one carries none): an ND pool's VMs, lasting and
        # burst, share the pool's availability set, in its proximity placement group
        avset = None
        if pool.infiniband and (pool.nodes or pool.elastic):
            avset = az.compute.AvailabilitySet(
                layout.name(pool.name, "avset"),
                availability_set_name=layout.name(pool.name, "avset"),
                resource_group_name=group.name,
                location=group.location,
                sku=az.compute.SkuArgs(name="Aligned"),  # managed disks
                proximity_placement_group=where.placement(),
                tags=tags,
                opts=here,
            )
        for node in pool.nodes:
            self._vm(layout, pool, node, where, avset)
        if pool.elastic:
            self.templates[pool.name] = self._scale_set(layout, pool, where, avset).id

    @staticmethod
    def _security_group(
        layout: CloudLayout,
        pool: CloudPool,
        group: az.resources.ResourceGroup,
        tags: dict[str, str],
        here: pulumi.ResourceOptions,
    ) -> az.network.NetworkSecurityGroup:
        """The pool's ingress, from the cluster's rule set: one inbound rule each."""
        return az.network.NetworkSecurityGroup(
            layout.name(pool.name, "nsg"),
            resource_group_name=group.name,
            location=group.location,
            security_rules=[
                az.network.SecurityRuleArgs(
                    name=f"in{n}",
                    description=rule.description,
                    priority=100 + n,
                    direction="Inbound",
                    access="Allow",
                    protocol=rule.protocol.capitalize(),
                    source_address_prefixes=list(rule.cidrs),
                    source_port_range="*",
                    destination_address_prefix="*",
                    destination_port_range=str(rule.from_port)
                    if rule.from_port == rule.to_port
                    else f"{rule.from_port}-{rule.to_port}",
                )
                for n, rule in enumerate(pool.ingress)
            ],
            tags=tags,
            opts=here,
        )

    def _vm(
        self,
        layout: CloudLayout,
        pool: CloudPool,
        node: str,
        where: _Where,
        avset: az.compute.AvailabilitySet | None,
    ) -> None:
        """A lasting node: a static public address, an accelerated NIC, the VM (in the pool's
        availability set where it has one)."""
        group = where.group
        address = _static_address(layout.name(node, "ip"), group, where.tags, where.opts)
        nic = az.network.NetworkInterface(
            layout.name(node, "nic"),
            resource_group_name=group.name,
            location=group.location,
            enable_accelerated_networking=True,
            network_security_group=az.network.NetworkSecurityGroupArgs(id=where.nsg.id),
            ip_configurations=[
                az.network.NetworkInterfaceIPConfigurationArgs(
                    name="primary",
                    subnet=az.network.SubnetArgs(id=where.subnet.id),
                    public_ip_address=az.network.PublicIPAddressArgs(id=address.id),
                    private_ip_allocation_method="Dynamic",
                    load_balancer_backend_address_pools=(
                        [az.network.BackendAddressPoolArgs(id=self.api_backend)]
                        if self.api_backend is not None
                        and layout.api is not None
                        and pool.name == layout.api.pool
                        else None
                    ),
                )
            ],
            tags=where.tags,
            opts=where.opts,
        )
        az.compute.VirtualMachine(
            layout.name(node),
            vm_name=node,
            resource_group_name=group.name,
            location=group.location,
            hardware_profile=az.compute.HardwareProfileArgs(vm_size=pool.instance_type),
            os_profile=az.compute.OSProfileArgs(
                computer_name=node,
                admin_username=self.user,
                linux_configuration=self._linux(layout),
            ),
            storage_profile=az.compute.StorageProfileArgs(
                image_reference=self.image,
                os_disk=az.compute.OSDiskArgs(
                    create_option="FromImage",
                    disk_size_gb=ROOT_GB,
                    managed_disk=az.compute.ManagedDiskParametersArgs(
                        storage_account_type=_DISK_TYPE
                    ),
                ),
            ),
            network_profile=az.compute.NetworkProfileArgs(
                network_interfaces=[
                    az.compute.NetworkInterfaceReferenceArgs(id=nic.id, primary=True)
                ]
            ),
            plan=self.plan,
            proximity_placement_group=where.placement(),
            capacity_reservation=where.reservation_profile(),
            availability_set=(
                az.compute.SubResourceArgs(id=avset.id) if avset is not None else None
            ),
            tags=where.tags,
            opts=where.opts,
        )
        self.nodes[node] = {
            "private": nic.ip_configurations.apply(
                lambda c: (c[0].private_ip_address or "") if c else ""
            ),
            "public": address.ip_address.apply(lambda a: a or ""),
        }

    def _scale_set(
        self,
        layout: CloudLayout,
        pool: CloudPool,
        where: _Where,
        avset: az.compute.AvailabilitySet | None = None,
    ) -> az.compute.VirtualMachineScaleSet:
        """A burst pool's template: a Flexible scale set of capacity 0 whose VM profile is a
        lasting node's VM (image, disk, security, NIC settings) without a public address. An
        InfiniBand pool's names its availability set in a tag: its burst VMs are made there."""
        vmss = az.compute
        identity, user_data = None, None
        if pool.join is not None:
            reader = self._reader(layout, pool, where)
            identity = vmss.VirtualMachineScaleSetIdentityArgs(
                type=vmss.ResourceIdentityType.USER_ASSIGNED,
                user_assigned_identities=[reader.id],
            )
            # a VM reads it from its metadata service; the burst program copies it into each VM
            user_data = pool_user_data(layout, pool, self.nodes, reader.client_id).apply(
                lambda text: base64.b64encode(text.encode()).decode()
            )
        image = vmss.ImageReferenceArgs(id=pool.image) if pool.image else self.image
        spot: dict[str, Any] = {}
        if pool.spot:  # Azure Spot: evicted VMs are deleted; up to the on-demand price
            spot = {
                "priority": vmss.VirtualMachinePriorityTypes.SPOT,
                "eviction_policy": vmss.VirtualMachineEvictionPolicyTypes.DELETE,
                "billing_profile": vmss.BillingProfileArgs(max_price=-1),
            }
        return vmss.VirtualMachineScaleSet(
            layout.name(pool.name, "vmss"),
            vm_scale_set_name=cloud_template(layout.cluster, pool.name),
            resource_group_name=where.group.name,
            location=where.group.location,
            sku=vmss.SkuArgs(name=pool.instance_type, tier="Standard", capacity=0),
            plan=self.plan,
            # Flexible: bursting creates named VMs in it from this profile, one per node. Azure
            # takes neither overprovisioning nor a single placement group in this mode (both
            # left null, as its orchestration modes page asks), and carries no InfiniBand here
            orchestration_mode=vmss.OrchestrationMode.FLEXIBLE,
            platform_fault_domain_count=1,
            proximity_placement_group=where.placement(),
            identity=identity,
            virtual_machine_profile=vmss.VirtualMachineScaleSetVMProfileArgs(
                **spot,
                user_data=user_data,
                capacity_reservation=where.reservation_profile(),
                os_profile=vmss.VirtualMachineScaleSetOSProfileArgs(
                    computer_name_prefix=layout.name(pool.name),
                    admin_username=self.user,
                    linux_configuration=self._linux(layout),
                ),
                storage_profile=vmss.VirtualMachineScaleSetStorageProfileArgs(
                    # the pool's own image once made (provision image build)
                    image_reference=image,
                    os_disk=vmss.VirtualMachineScaleSetOSDiskArgs(
                        create_option="FromImage",
                        disk_size_gb=ROOT_GB,
                        managed_disk=vmss.VirtualMachineScaleSetManagedDiskParametersArgs(
                            storage_account_type=_DISK_TYPE
                        ),
                    ),
                ),
                network_profile=vmss.VirtualMachineScaleSetNetworkProfileArgs(
                    # a VM of a Flexible scale set makes its NIC from this configuration
                    network_api_version="2020-11-01",
                    network_interface_configurations=[
                        vmss.VirtualMachineScaleSetNetworkConfigurationArgs(
                            name="primary",
                            primary=True,
                            enable_accelerated_networking=True,
                            network_security_group=vmss.SubResourceArgs(id=where.nsg.id),
                            ip_configurations=[
                                vmss.VirtualMachineScaleSetIPConfigurationArgs(
                                    name="primary",
                                    subnet=vmss.ApiEntityReferenceArgs(id=where.subnet.id),
                                )
                            ],
                        )
                    ],
                ),
            ),
            tags=(
                avset.id.apply(lambda i: {**where.tags, TAG_AVAILABILITY_SET: i})
                if avset is not None
                else where.tags
            ),
            opts=where.opts,
        )

    def _reader(
        self, layout: CloudLayout, pool: CloudPool, where: _Where
    ) -> az.managedidentity.UserAssignedIdentity:
        """The pool's user-assigned identity, allowed to read the cluster's munge key secret
        (and a remote pool's tunnel keys) alone (Key Vault Secrets User, scoped to each one
        secret)."""
        assert self.secret is not None and self.vault is not None
        reader = az.managedidentity.UserAssignedIdentity(
            layout.name(pool.name, "node"),
            resource_group_name=where.group.name,
            location=where.group.location,
            tags=where.tags,
            opts=where.opts,
        )
        readable = [("munge", self.secret)]
        if pool.join is not None and pool.join.tunnel_secret:
            name = tunnel_secret(layout.cluster, pool.name)
            keys = self.tunnel_keys.get(pool.name)
            keys_secret = _secret(
                layout,
                f"{pool.name}-tunnel-keys",
                name,
                keys,
                (self.vault, where.group),
                where.opts,
            )
            readable.append(("tunnel-keys", keys_secret))
        role = self.client.subscription_id.apply(
            lambda sub: (
                f"/subscriptions/{sub}/providers/Microsoft.Authorization/"
                f"roleDefinitions/{SECRETS_USER_ROLE}"
            )
        )
        for what, secret in readable:
            az.authorization.RoleAssignment(
                layout.name(pool.name, what),
                principal_id=reader.principal_id,
                principal_type="ServicePrincipal",
                role_definition_id=role,
                scope=secret.id,
                opts=where.opts,
            )
        return reader

    def _heads(
        self,
        layout: CloudLayout,
        group: az.resources.ResourceGroup,
        jwk: dict[str, str],
        here: pulumi.ResourceOptions,
    ) -> pulumi.Output[str]:
        """The heads' identity, its federated credential, the issuer it trusts and its role; the
        heads' credentials file without its key (apply adds it): JSON."""
        tags = layout.tags()
        subscription = self.client.subscription_id
        account = az.storage.StorageAccount(
            layout.name("issuer"),
            account_name=subscription.apply(lambda sub: issuer_account(layout.cluster, sub)),
            resource_group_name=group.name,
            location=group.location,
            kind="StorageV2",
            sku=az.storage.SkuArgs(name="Standard_LRS"),
            # the issuer's two documents are public (Entra reads them without a login); the
            # container holds nothing else
            allow_blob_public_access=True,
            enable_https_traffic_only=True,
            minimum_tls_version="TLS1_2",
            tags=tags,
            opts=here,
        )
        container = az.storage.BlobContainer(
            layout.name("issuer"),
            account_name=account.name,
            resource_group_name=group.name,
            container_name=ISSUER_CONTAINER,
            public_access=az.storage.PublicAccess.BLOB,
            opts=here,
        )
        issuer = account.name.apply(
            lambda name: f"https://{name}.blob.core.windows.net/{ISSUER_CONTAINER}/"
        )
        for n, blob in enumerate(issuer_documents("", jwk)):
            az.storage.Blob(
                layout.name("issuer", str(n)),
                account_name=account.name,
                container_name=container.name,
                resource_group_name=group.name,
                blob_name=blob,
                content_type="application/json",
                source=issuer.apply(
                    lambda url, blob=blob: pulumi.StringAsset(issuer_documents(url, jwk)[blob])
                ),
                opts=here,
            )
        identity = az.managedidentity.UserAssignedIdentity(
            layout.name("burst-heads"),
            resource_name_=f"{layout.cluster}-burst-heads",
            resource_group_name=group.name,
            location=group.location,
            tags=tags,
            opts=here,
        )
        az.managedidentity.FederatedIdentityCredential(
            layout.name("burst-heads"),
            federated_identity_credential_resource_name="heads",
            resource_name_=identity.name,
            resource_group_name=group.name,
            issuer=issuer,
            subject=heads_subject(layout.cluster),
            audiences=[EXCHANGE_AUDIENCE],
            opts=here,
        )
        role = az.authorization.RoleDefinition(
            layout.name("burst-heads"),
            # a role definition's name is a GUID, one per cluster and subscription
            role_definition_id=subscription.apply(
                lambda sub: str(uuid.uuid5(uuid.NAMESPACE_URL, f"provision:{sub}:{layout.cluster}"))
            ),
            role_name=f"{layout.cluster} burst heads",
            description=f"What the burst programs of cluster {layout.cluster} do",
            scope=group.id,
            assignable_scopes=[group.id],
            permissions=[az.authorization.PermissionArgs(actions=list(HEADS_ACTIONS))],
            opts=here,
        )
        az.authorization.RoleAssignment(
            layout.name("burst-heads"),
            principal_id=identity.principal_id,
            principal_type="ServicePrincipal",
            role_definition_id=role.id,
            scope=group.id,
            opts=here,
        )
        return pulumi.Output.all(
            self.client.tenant_id, identity.client_id, subscription, issuer
        ).apply(
            lambda parts: json.dumps(
                {
                    "tenant": parts[0],
                    "client_id": parts[1],
                    "subscription": parts[2],
                    "issuer": parts[3],
                    "subject": heads_subject(layout.cluster),
                    "kid": jwk["kid"],
                },
                sort_keys=True,
            )
        )


def _vault(
    layout: CloudLayout,
    group: az.resources.ResourceGroup,
    client: pulumi.Output[az.authorization.GetClientConfigResult],
    here: pulumi.ResourceOptions,
) -> az.keyvault.Vault:
    """The cluster's Key Vault (role-based access: only role assignments reach its secrets)."""
    return az.keyvault.Vault(
        layout.name("kv"),
        vault_name=key_vault(layout.cluster),
        resource_group_name=group.name,
        location=group.location,
        properties=az.keyvault.VaultPropertiesArgs(
            tenant_id=client.tenant_id,
            sku=az.keyvault.SkuArgs(family="A", name="standard"),
            enable_rbac_authorization=True,
        ),
        tags=layout.tags(),
        opts=here,
    )


def _secret(
    layout: CloudLayout,
    resource: str,
    name: str,
    value: bytes | None,
    where: tuple[az.keyvault.Vault, az.resources.ResourceGroup],
    here: pulumi.ResourceOptions,
) -> az.keyvault.Secret:
    """A secret of the cluster in its Key Vault: the value base64 (a Key Vault secret is text)
    and a Pulumi secret (encrypted in the stack's state); a preview without it plans an empty
    value."""
    text = base64.b64encode(value).decode() if value is not None else ""
    vault, group = where
    return az.keyvault.Secret(
        layout.name(resource),
        secret_name=name,
        vault_name=vault.name,
        resource_group_name=group.name,
        properties=az.keyvault.SecretPropertiesArgs(value=pulumi.Output.secret(text)),
        tags=layout.tags(),
        opts=here,
    )


def _static_address(
    name: str,
    group: az.resources.ResourceGroup,
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> az.network.PublicIPAddress:
    """A static public address (Standard: what a NAT gateway and a zonal VM take)."""
    return az.network.PublicIPAddress(
        name,
        resource_group_name=group.name,
        location=group.location,
        public_ip_allocation_method="Static",
        sku=az.network.PublicIPAddressSkuArgs(name="Standard"),
        tags=tags,
        opts=opts,
    )


def _api_balancer(
    layout: CloudLayout,
    group: az.resources.ResourceGroup,
    subnet: az.network.Subnet,
    tags: dict[str, str],
    here: pulumi.ResourceOptions,
) -> tuple[az.network.LoadBalancer, pulumi.Output[str]]:
    """The API's internal Standard Load Balancer: a static frontend at the spec's address in
    the subnet, a backend pool the heads' NICs join, an HTTPS probe of each API server's
    /readyz, and one TCP rule on the API's port (no floating IP: a head sees its own address).
    Azure drops a flow a backend opens to its own balancer's frontend when it lands on that
    backend; the heads' own API traffic goes to their haproxy instead (their firewall sends it
    there). Returns the balancer and its backend pool's ID."""
    api = layout.api
    assert api is not None
    name = layout.name("api")
    own = pulumi.Output.concat(group.id, "/providers/Microsoft.Network/loadBalancers/", name)
    frontend = pulumi.Output.concat(own, "/frontendIPConfigurations/api")
    backend = pulumi.Output.concat(own, "/backendAddressPools/heads")
    probe = pulumi.Output.concat(own, "/probes/readyz")
    balancer = az.network.LoadBalancer(
        name,
        load_balancer_name=name,
        resource_group_name=group.name,
        location=group.location,
        sku=az.network.LoadBalancerSkuArgs(name="Standard", tier="Regional"),
        frontend_ip_configurations=[
            az.network.FrontendIPConfigurationArgs(
                name="api",
                private_ip_address=api.address,
                private_ip_allocation_method="Static",
                subnet=az.network.SubnetArgs(id=subnet.id),
            )
        ],
        backend_address_pools=[az.network.BackendAddressPoolArgs(name="heads")],
        probes=[
            az.network.ProbeArgs(
                name="readyz",
                protocol="Https",
                port=api.port,
                request_path="/readyz",
                interval_in_seconds=5,
                number_of_probes=2,
            )
        ],
        load_balancing_rules=[
            az.network.LoadBalancingRuleArgs(
                name="kube-api",
                protocol="Tcp",
                frontend_port=api.port,
                backend_port=api.port,
                frontend_ip_configuration=az.network.SubResourceArgs(id=frontend),
                backend_address_pool=az.network.SubResourceArgs(id=backend),
                probe=az.network.SubResourceArgs(id=probe),
                enable_floating_ip=False,
                idle_timeout_in_minutes=30,  # watches hold connections for long
                enable_tcp_reset=True,
            )
        ],
        tags=tags,
        opts=here,
    )
    return balancer, backend


@dataclass(frozen=True)
class _Where:
    """What a pool's machines are placed in: group, subnet, security group, placement."""

    group: az.resources.ResourceGroup
    subnet: az.network.Subnet
    nsg: az.network.NetworkSecurityGroup
    ppg: az.compute.ProximityPlacementGroup | None
    reservation: str | None  # the capacity reservation group's resource ID
    tags: dict[str, str]
    opts: pulumi.ResourceOptions

    def placement(self) -> az.compute.SubResourceArgs | None:
        return az.compute.SubResourceArgs(id=self.ppg.id) if self.ppg else None

    def reservation_profile(self) -> az.compute.CapacityReservationProfileArgs | None:
        if not self.reservation:
            return None
        return az.compute.CapacityReservationProfileArgs(
            capacity_reservation_group=az.compute.SubResourceArgs(id=self.reservation)
        )


# every machine, lasting or burst: a Premium SSD root of ROOT_GB
_DISK_TYPE = "Premium_LRS"
