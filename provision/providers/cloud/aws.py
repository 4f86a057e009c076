"""The cluster's AWS side as one Pulumi component: a VPC, a subnet per zone the pools name and the
route to the internet (and, in a zone with burst nodes of a type with several network cards, a
private subnet going out through a NAT gateway), a key pair, and per pool a security group from
the cluster's rule set, a cluster placement group (GPU pools; or the pool's Capacity Reservation
or Block, which holds the placement), a launch template (EFA interfaces where the type has them,
encrypted root volume) and the pool's lasting instances. Burst nodes reuse the launch template.

EC2's rules the program keeps (tests/cloud_rules.py holds them for the mocks): descriptions only
in EC2's character set; no public address asked of a template with several network interfaces
(InvalidParameterCombination): a lasting node of such a type gets an Elastic IP on its primary
interface instead, as ParallelCluster gives its multi-card head node, and burst nodes of such a
type start in the private subnet, as ParallelCluster puts multi-card compute nodes behind a NAT
gateway; a public NAT gateway needs an Elastic IP and a subnet the internet gateway routes.

An HA Kubernetes control plane on heads here gets an internal Network Load Balancer at the spec's
API address in the heads' subnet, taken before any instance can be given it: IP targets (the
heads' private addresses) with client IP preservation off, so a head's own connection through it
comes back to it from the balancer's address and not from itself (the hairpin the Network Load
Balancer guide warns of), and an HTTPS health check of each API server's /readyz."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pulumi
import pulumi_aws as aws

from provision.burst.config import (
    TAG_CLUSTER,
    cloud_template,
    fit_name,
    munge_secret,
    tunnel_secret,
)
from provision.providers.cloud.joining import pool_user_data
from provision.providers.cloud.layout import (
    IMAGES,
    ROOT_GB,
    CloudLayout,
    CloudPool,
    Subnet,
    aws_subnets,
)

# the characters EC2 takes in a security group's and a rule's description
_EC2_TEXT = re.compile(r"[^a-zA-Z0-9. _\-:/()#,@\[\]+=&;{}!$*]")
# IMDSv2 answers a container on the node too: a PUT crosses one more hop (the bridge)
_METADATA_HOPS = 2


def ec2_text(text: str) -> str:
    """A description EC2 takes: its own characters only, at most 255."""
    return _EC2_TEXT.sub("", text)[:255]


class AwsCluster(pulumi.ComponentResource):
    def __init__(
        self,
        layout: CloudLayout,
        munge_key: bytes | None = None,
        tunnel_keys: dict[str, bytes] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        self.tunnel_keys = tunnel_keys or {}
        super().__init__("provision:aws:Cluster", layout.cluster, None, opts)
        region = next((p.region for p in layout.pools if p.region), None)
        provider = aws.Provider(
            layout.name("aws"),
            region=region,
            default_tags=aws.ProviderDefaultTagsArgs(tags=layout.tags()),
            opts=pulumi.ResourceOptions(parent=self),
        )
        here = pulumi.ResourceOptions(parent=self, provider=provider)
        tags = layout.tags()
        vpc = aws.ec2.Vpc(
            layout.name("vpc"),
            cidr_block=layout.cidr,
            enable_dns_hostnames=True,
            tags={**tags, "Name": layout.name("vpc")},
            opts=here,
        )
        gateway = aws.ec2.InternetGateway(layout.name("igw"), vpc_id=vpc.id, tags=tags, opts=here)
        routes = aws.ec2.RouteTable(
            layout.name("routes"),
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=gateway.id)],
            tags=tags,
            opts=here,
        )
        # a subnet per zone the pools name, each a slice of the range; pools without a zone
        # share the first (EC2 picks its zone where no pool names one); a zone with a private
        # pool also a private subnet, whose way out is a NAT gateway in the zone's public one
        subnets: dict[str | None, aws.ec2.Subnet] = {}
        private: dict[str | None, aws.ec2.Subnet] = {}
        self.subnets: dict[str, str] = {}  # name -> range: a running stack's are kept
        for carved in aws_subnets(layout):
            made = aws.ec2.Subnet(
                carved.name,
                vpc_id=vpc.id,
                cidr_block=carved.cidr,
                availability_zone=carved.zone,
                map_public_ip_on_launch=not carved.private,
                tags={**tags, "Name": carved.name},
                opts=here,
            )
            self.subnets[carved.name] = carved.cidr
            table = routes
            if carved.private:
                private[carved.zone] = made
                table = _nat_routes(layout, carved, vpc, subnets[carved.zone], gateway, here)
            else:
                subnets[carved.zone] = made
            aws.ec2.RouteTableAssociation(
                f"{layout.name('routes')}-{carved.name.removeprefix(layout.cluster + '-')}",
                subnet_id=made.id,
                route_table_id=table.id,
                opts=here,
            )
        first = next(iter(subnets.values()))
        # where a private pool's image builder starts: the public subnet of its zone (the
        # workstation reaches it at an Elastic IP)
        self.builder_subnets: dict[str, pulumi.Output[str]] = {}
        key = aws.ec2.KeyPair(
            layout.name("key"),
            key_name=layout.name("key"),
            public_key=layout.ssh_public_key,
            tags=tags,
            opts=here,
        )
        owner, pattern = IMAGES[layout.os_name]["aws"]
        image = aws.ec2.get_ami_output(
            owners=[owner],
            most_recent=True,
            filters=[aws.ec2.GetAmiFilterArgs(name="name", values=[pattern])],
            opts=pulumi.InvokeOptions(parent=self, provider=provider),
        )
        self.nodes: dict[str, dict[str, pulumi.Output[str]]] = {}
        self.templates: dict[str, pulumi.Output[str]] = {}
        self.secret = _munge_secret(layout, munge_key, tags, here) if layout.bursts else None
        self.node_roles: list[aws.iam.Role] = []  # the elastic pools' (the heads pass them on)
        balancer = None
        made = here
        if layout.api is not None:  # its address first: no instance may be given it
            balancer = _api_balancer(layout, subnets.get(layout.api.zone, first), tags, here)
            made = pulumi.ResourceOptions.merge(here, pulumi.ResourceOptions(depends_on=[balancer]))
        for pool in layout.pools:
            public = subnets.get(pool.zone, first)
            zone = pool.zone if pool.zone in subnets else next(iter(subnets))
            inside = private[zone] if pool.private else public
            if pool.private:
                self.builder_subnets[pool.name] = public.id
            self._pool(layout, pool, vpc, inside, key, image, made)
        if balancer is not None and layout.api is not None:
            heads = next(p for p in layout.pools if p.name == layout.api.pool)
            targets = {node: self.nodes[node]["private"] for node in heads.nodes}
            _api_targets(layout, balancer, vpc, targets, tags, here)
        # what the heads' burst programs act as: a user whose key apply puts on the heads, the
        # same whether they are on premises or instances of this stack
        self.burst_credentials: pulumi.Output[str] | None = None
        if layout.bursts:
            policy = pulumi.Output.all(*(r.arn for r in self.node_roles)).apply(
                lambda arns: burst_policy(layout.cluster, arns)
            )
            self.burst_credentials = _burst_user(layout, policy, tags, here)
        self.register_outputs(
            {
                "nodes": self.nodes,
                "templates": self.templates,
                "subnets": self.subnets,
                "builder_subnets": self.builder_subnets,
            }
        )

    def _pool(
        self,
        layout: CloudLayout,
        pool: CloudPool,
        vpc: aws.ec2.Vpc,
        subnet: aws.ec2.Subnet,
        key: aws.ec2.KeyPair,
        image: pulumi.Output[Any],
        here: pulumi.ResourceOptions,
    ) -> None:
        tags = layout.tags(pool.name)
        group = _security_group(layout, pool, vpc, tags, here)
        placement: dict[str, Any] = {}
        if pool.reservation:
            placement = _reserved(pool.reservation, pool.capacity_block)
        elif pool.gpus:
            pg = aws.ec2.PlacementGroup(
                layout.name(pool.name, "pg"),
                name=layout.name(pool.name, "pg"),
                strategy="cluster",
                tags=tags,
                opts=here,
            )
            placement = {"placement": aws.ec2.LaunchTemplatePlacementArgs(group_name=pg.name)}
        if pool.spot:  # one-time requests: a reclaimed instance ends, and a resume makes anew
            placement["instance_market_options"] = aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(
                market_type="spot",
                spot_options=aws.ec2.LaunchTemplateInstanceMarketOptionsSpotOptionsArgs(
                    spot_instance_type="one-time",
                    instance_interruption_behavior="terminate",
                ),
            )
        joining: dict[str, Any] = {}
        if pool.join is not None:
            assert self.secret is not None
            joining = self._joining(layout, pool, tags, here)
        template = aws.ec2.LaunchTemplate(
            layout.name(pool.name, "lt"),
            name=cloud_template(layout.cluster, pool.name),
            # an elastic pool's own image once made (its root device is the stock image's)
            image_id=pool.image or image.id,
            instance_type=pool.instance_type,
            key_name=key.key_name,
            network_interfaces=_interfaces(pool, subnet, group),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    # the image's own root device (Debian's /dev/xvda, Ubuntu's /dev/sda1):
                    # another name would add a spare volume and leave the root as it was
                    device_name=image.root_device_name,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=ROOT_GB,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_tokens="required",
                http_put_response_hop_limit=_METADATA_HOPS,
                # a burst node reads its name from the tag the burst program gives it
                instance_metadata_tags="enabled" if pool.join else None,
            ),
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=tags)
                for kind in ("instance", "volume", "network-interface")
            ],
            tags=tags,
            opts=here,
            **placement,
            **joining,
        )
        self.templates[pool.name] = template.id
        for node in pool.nodes:
            instance = aws.ec2.Instance(
                layout.name(node),
                launch_template=aws.ec2.InstanceLaunchTemplateArgs(
                    id=template.id, version="$Latest"
                ),
                tags={**tags, "Name": node},
                opts=here,
            )
            public = instance.public_ip
            if pool.efa > 1:  # the template asks no public address: one on the first interface
                address = aws.ec2.Eip(
                    layout.name(node, "eip"),
                    domain="vpc",
                    network_interface=instance.primary_network_interface_id,
                    tags={**tags, "Name": node},
                    opts=here,
                )
                public = address.public_ip
            self.nodes[node] = {"private": instance.private_ip, "public": public}

    def _joining(
        self,
        layout: CloudLayout,
        pool: CloudPool,
        tags: dict[str, str],
        here: pulumi.ResourceOptions,
    ) -> dict[str, Any]:
        """What an elastic pool's template adds for a node to join by itself: an instance
        profile whose role reads the cluster's munge key secret and nothing else, and the user
        data that runs the join program (no key material in it)."""
        assert pool.join is not None and self.secret is not None
        role, profile = _role_and_profile(layout, f"{pool.name}-node", tags, here)
        self.node_roles.append(role)
        readable = [self.secret.arn]
        if pool.join.tunnel_secret:  # a remote pool: its nodes' tunnel keys too
            keys = _secret(
                layout,
                layout.name(pool.name, "tunnel-keys"),
                tunnel_secret(layout.cluster, pool.name),
                f"tunnel keys of pool {pool.name} of cluster {layout.cluster}: read by its nodes",
                self.tunnel_keys.get(pool.name),
                tags,
                here,
            )
            readable.append(keys.arn)
        aws.iam.RolePolicy(
            layout.name(pool.name, "node", "munge"),
            role=role.id,
            policy=pulumi.Output.all(*readable).apply(lambda arns: read_only_policy(*arns)),
            opts=here,
        )
        data = pool_user_data(layout, pool, self.nodes).apply(_encoded)
        return {
            "iam_instance_profile": aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profile.arn),
            "user_data": data,
        }


def balancer_name(cluster: str, what: str) -> str:
    """An Elastic Load Balancing name (a load balancer's, a target group's): at most 32
    letters, digits and hyphens, no hyphen at either end."""
    return fit_name(f"{cluster}-{what}", 32).strip("-")


def _api_balancer(
    layout: CloudLayout, subnet: aws.ec2.Subnet, tags: dict[str, str], here: pulumi.ResourceOptions
) -> aws.lb.LoadBalancer:
    """The internal Network Load Balancer of the API, its address the spec's in the heads'
    subnet (a subnet mapping's private address: the balancer's own in that zone)."""
    assert layout.api is not None
    return aws.lb.LoadBalancer(
        layout.name("api"),
        name=balancer_name(layout.cluster, "api"),
        internal=True,
        load_balancer_type="network",
        subnet_mappings=[
            aws.lb.LoadBalancerSubnetMappingArgs(
                subnet_id=subnet.id, private_ipv4_address=layout.api.address
            )
        ],
        tags=tags,
        opts=here,
    )


def _api_targets(
    layout: CloudLayout,
    balancer: aws.lb.LoadBalancer,
    vpc: aws.ec2.Vpc,
    targets: dict[str, pulumi.Output[str]],
    tags: dict[str, str],
    here: pulumi.ResourceOptions,
) -> None:
    """The heads' API servers behind the balancer: a target group of their private addresses
    (IP targets), client IP preservation off, each checked at /readyz over HTTPS (anonymous,
    as kube-apiserver allows it), and a TCP listener on the API's port."""
    assert layout.api is not None
    port = layout.api.port
    group = aws.lb.TargetGroup(
        layout.name("api", "tg"),
        name=balancer_name(layout.cluster, "api-tg"),
        port=port,
        protocol="TCP",
        target_type="ip",
        vpc_id=vpc.id,
        preserve_client_ip="false",
        deregistration_delay=30,
        health_check=aws.lb.TargetGroupHealthCheckArgs(
            protocol="HTTPS",
            port=str(port),
            path="/readyz",
            healthy_threshold=2,
            unhealthy_threshold=2,
            interval=10,
        ),
        tags=tags,
        opts=here,
    )
    for node, address in targets.items():
        aws.lb.TargetGroupAttachment(
            layout.name("api", node),
            target_group_arn=group.arn,
            target_id=address,
            port=port,
            opts=here,
        )
    aws.lb.Listener(
        layout.name("api", "listener"),
        load_balancer_arn=balancer.arn,
        port=port,
        protocol="TCP",
        default_actions=[
            aws.lb.ListenerDefaultActionArgs(type="forward", target_group_arn=group.arn)
        ],
        tags=tags,
        opts=here,
    )


def _nat_routes(
    layout: CloudLayout,
    carved: Subnet,
    vpc: aws.ec2.Vpc,
    public: aws.ec2.Subnet,
    gateway: aws.ec2.InternetGateway,
    here: pulumi.ResourceOptions,
) -> aws.ec2.RouteTable:
    """A private subnet's way out: a NAT gateway with an Elastic IP in its zone's public
    subnet (a public NAT gateway must live where the internet gateway routes), and the route
    table that sends the private subnet's traffic to it. The nodes' tunnel to the head goes
    out this way too (they dial the hub; its keepalive holds the NAT's mapping open)."""
    tags = layout.tags()
    suffix = carved.name.removeprefix(layout.cluster + "-")
    address = aws.ec2.Eip(
        layout.name(suffix, "nat"), domain="vpc", tags={**tags, "Name": carved.name}, opts=here
    )
    nat = aws.ec2.NatGateway(
        layout.name(suffix, "nat"),
        allocation_id=address.id,
        subnet_id=public.id,
        connectivity_type="public",
        tags={**tags, "Name": carved.name},
        opts=pulumi.ResourceOptions.merge(here, pulumi.ResourceOptions(depends_on=[gateway])),
    )
    return aws.ec2.RouteTable(
        layout.name("routes", suffix),
        vpc_id=vpc.id,
        routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id)],
        tags=tags,
        opts=here,
    )


def _role_and_profile(
    layout: CloudLayout, what: str, tags: dict[str, str], here: pulumi.ResourceOptions
) -> tuple[aws.iam.Role, aws.iam.InstanceProfile]:
    """An IAM role EC2 instances take on, in an instance profile (its permissions beside)."""
    role = aws.iam.Role(
        layout.name(what),
        assume_role_policy=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"Service": "ec2.amazonaws.com"},
                        "Action": "sts:AssumeRole",
                    }
                ],
            }
        ),
        tags=tags,
        opts=here,
    )
    profile = aws.iam.InstanceProfile(layout.name(what), role=role.name, tags=tags, opts=here)
    return role, profile


def burst_policy(cluster: str, node_role_arns: list[str]) -> str:
    """What the heads' burst programs may do in EC2 (provision/burst/aws.py), and no more:
    launch from the cluster's templates, tag at launch and name its own instances, look, end
    its own instances, and hand the elastic pools' node roles to the instances they launch."""
    own = {"StringEquals": {f"aws:ResourceTag/{TAG_CLUSTER}": cluster}}
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "Launch", "Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "*"},
                {
                    "Sid": "TagAtLaunch",
                    "Effect": "Allow",
                    "Action": "ec2:CreateTags",
                    "Resource": "*",
                    "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances"}},
                },
                {
                    "Sid": "NameOwn",
                    "Effect": "Allow",
                    "Action": "ec2:CreateTags",
                    "Resource": "arn:aws:ec2:*:*:instance/*",
                    "Condition": own,
                },
                {
                    "Sid": "Look",
                    "Effect": "Allow",
                    "Action": [
                        "ec2:DescribeInstances",
                        "ec2:DescribeLaunchTemplates",
                        "ec2:DescribeLaunchTemplateVersions",
                    ],
                    "Resource": "*",
                },
                {
                    "Sid": "EndOwn",
                    "Effect": "Allow",
                    "Action": "ec2:TerminateInstances",
                    "Resource": "arn:aws:ec2:*:*:instance/*",
                    "Condition": own,
                },
                {
                    "Sid": "PassNodeRoles",
                    "Effect": "Allow",
                    "Action": "iam:PassRole",
                    "Resource": list(node_role_arns),
                    "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
                },
            ],
        }
    )


def _burst_user(
    layout: CloudLayout,
    policy: pulumi.Output[str],
    tags: dict[str, str],
    here: pulumi.ResourceOptions,
) -> pulumi.Output[str]:
    """What the heads' burst programs act as: an IAM user with the burst policy alone and an
    access key, as a credentials file's text (a Pulumi secret: encrypted in the state; apply
    keeps it 0600 in the cluster's secrets, and the burst role puts it at root's
    ~/.aws/credentials on the heads)."""
    user = aws.iam.User(layout.name("burst"), name=layout.name("burst"), tags=tags, opts=here)
    aws.iam.UserPolicy(layout.name("burst"), user=user.name, policy=policy, opts=here)
    key = aws.iam.AccessKey(layout.name("burst"), user=user.name, opts=here)
    return pulumi.Output.secret(
        pulumi.Output.all(key.id, key.secret).apply(
            lambda pair: (
                f"[default]\naws_access_key_id = {pair[0]}\naws_secret_access_key = {pair[1]}\n"
            )
        )
    )


def read_only_policy(*secret_arns: str) -> str:
    """The burst node role's one permission: read the cluster's munge key secret (and a remote
    pool's tunnel keys), nothing else."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "secretsmanager:GetSecretValue",
                    "Resource": secret_arns[0] if len(secret_arns) == 1 else list(secret_arns),
                }
            ],
        }
    )


def _encoded(text: str) -> str:
    """User data as a launch template takes it: base64."""
    return base64.b64encode(text.encode()).decode()


def _munge_secret(
    layout: CloudLayout,
    munge_key: bytes | None,
    tags: dict[str, str],
    here: pulumi.ResourceOptions,
) -> aws.secretsmanager.Secret:
    """The cluster's munge key in Secrets Manager, which burst nodes read at boot."""
    return _secret(
        layout,
        layout.name("munge-key"),
        munge_secret(layout.cluster),
        f"munge key of cluster {layout.cluster}: read by its burst nodes",
        munge_key,
        tags,
        here,
    )


def _secret(
    layout: CloudLayout,
    resource: str,
    name: str,
    description: str,
    value: bytes | None,
    tags: dict[str, str],
    here: pulumi.ResourceOptions,
) -> aws.secretsmanager.Secret:
    """A secret of the cluster in Secrets Manager. Its value is a Pulumi secret (encrypted in
    the stack's state); without it (a preview from the spec alone) only the secret is
    planned."""
    secret = aws.secretsmanager.Secret(
        resource,
        name=name,
        description=description,
        recovery_window_in_days=0,  # destroy removes it: a new cluster of the name gets anew
        tags=tags,
        opts=here,
    )
    if value is not None:
        aws.secretsmanager.SecretVersion(
            resource,
            secret_id=secret.id,
            secret_binary=pulumi.Output.secret(base64.b64encode(value).decode()),
            opts=here,
        )
    return secret


def _reserved(reservation: str, capacity_block: bool) -> dict[str, Any]:
    """A launch template's part that puts its instances into the pool's reservation, in place of
    a placement group of ours: the reservation holds the placement (an On-Demand Capacity
    Reservation made in a cluster placement group launches only into that group; a Capacity
    Block lies in an UltraCluster already). A Capacity Block's instances launch in its own
    market, which EC2 refuses without the block's ID."""
    out: dict[str, Any] = {
        "capacity_reservation_specification": (
            aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                capacity_reservation_target=(
                    aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                        capacity_reservation_id=reservation
                    )
                )
            )
        )
    }
    if capacity_block:
        out["instance_market_options"] = aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(
            market_type="capacity-block"
        )
    return out


def _security_group(
    layout: CloudLayout,
    pool: CloudPool,
    vpc: aws.ec2.Vpc,
    tags: dict[str, str],
    here: pulumi.ResourceOptions,
) -> aws.ec2.SecurityGroup:
    """The pool's ingress from the cluster's rule set; all traffic among its own members, both
    ways (EFA's traffic is allowed by the group's own rules, not by addresses)."""
    return aws.ec2.SecurityGroup(
        layout.name(pool.name, "sg"),
        vpc_id=vpc.id,
        description=ec2_text(f"{layout.cluster} pool {pool.name}: cluster rule set"),
        ingress=[
            aws.ec2.SecurityGroupIngressArgs(
                description=ec2_text(rule.description),
                protocol=rule.protocol,
                from_port=rule.from_port,
                to_port=rule.to_port,
                cidr_blocks=list(rule.cidrs),
            )
            for rule in pool.ingress
        ]
        # EFA needs all traffic between the group's own members
        + [aws.ec2.SecurityGroupIngressArgs(protocol="-1", from_port=0, to_port=0, self=True)],
        egress=[
            aws.ec2.SecurityGroupEgressArgs(
                protocol="-1", from_port=0, to_port=0, cidr_blocks=["0.0.0.0/0"]
            ),
            aws.ec2.SecurityGroupEgressArgs(protocol="-1", from_port=0, to_port=0, self=True),
        ],
        tags=tags,
        opts=here,
    )


def _interfaces(
    pool: CloudPool, subnet: aws.ec2.Subnet, group: aws.ec2.SecurityGroup
) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgs]:
    """One interface, or one EFA per network card where the type has them (32 on p5.48xlarge):
    card 0 holds the primary interface (EFA with its IP address). On P5 the other cards carry
    EFA only, no IP address (efa-only), as AWS's P5 guide lays them out; on P4d each is a
    full EFA. A public address is asked for only where there is one interface (EC2 refuses it
    on several)."""
    efa_only = pool.instance_type.startswith("p5")
    cards = pool.efa or 1
    return [
        aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            device_index=0 if card == 0 else 1,
            network_card_index=card if pool.efa else None,
            interface_type=(None if not pool.efa else "efa-only" if card and efa_only else "efa"),
            subnet_id=subnet.id,
            security_groups=[group.id],
            associate_public_ip_address="true" if cards == 1 else None,
            delete_on_termination="true",
        )
        for card in range(cards)
    ]
