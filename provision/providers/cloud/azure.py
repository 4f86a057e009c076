"""The cluster's Azure side as one Pulumi component: a resource group, a virtual network and
subnet with a NAT gateway (its machines' way out: Azure has retired default outbound access, and
burst VMs have no public address), per pool a network security group from the cluster's rule
set and a proximity placement group (or, where the pool names one, its capacity reservation
group: Azure takes no proximity placement group beside a reservation), virtual machines for
lasting nodes (accelerated networking; an InfiniBand (ND) pool's in one availability set, as
Azure links over InfiniBand only the VMs of one availability set or of a Uniform scale set with a
single placement group, one partition key, and a Flexible scale set carries no InfiniBand) and,
for burst pools, a Flexible scale set of capacity 0 that bursting makes VMs in.

Azure's rules the program keeps (tests/cloud_rules.py holds them for the mocks): a Marketplace
image sold under a plan (Rocky Linux) is named with its plan; encryption at host is not asked
for, as Azure refuses it in a subscription that has not registered the feature
(Microsoft.Compute/EncryptionAtHost). Managed disks are encrypted at rest all the same (Azure's
server-side encryption, platform keys)."""

from __future__ import annotations

import base64
from dataclasses import dataclass

import pulumi
import pulumi_azure_native as az

from provision.burst.config import (
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


class AzureCluster(pulumi.ComponentResource):
    def __init__(
        self,
        layout: CloudLayout,
        munge_key: bytes | None = None,
        tunnel_keys: dict[str, bytes] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
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
        for pool in layout.pools:
            self._pool(layout, pool, group, subnet, here)
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
        # a single placement group; a Flexible one carries none): an ND pool's lasting VMs
        # share the pool's availability set, in its proximity placement group
        avset = None
        if pool.infiniband and pool.nodes:
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
            self.templates[pool.name] = self._scale_set(layout, pool, where).id

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
        self, layout: CloudLayout, pool: CloudPool, where: _Where
    ) -> az.compute.VirtualMachineScaleSet:
        """A burst pool's template: a Flexible scale set of capacity 0 whose VM profile is a
        lasting node's VM (image, disk, security, NIC settings) without a public address."""
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
                user_data=user_data,
                capacity_reservation=where.reservation_profile(),
                os_profile=vmss.VirtualMachineScaleSetOSProfileArgs(
                    computer_name_prefix=layout.name(pool.name),
                    admin_username=self.user,
                    linux_configuration=self._linux(layout),
                ),
                storage_profile=vmss.VirtualMachineScaleSetStorageProfileArgs(
                    image_reference=self.image,
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
            tags=where.tags,
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
