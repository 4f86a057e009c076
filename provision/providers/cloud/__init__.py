"""Cloud providers (AWS, GCP, Azure): one Pulumi stack per cluster and cloud, driven by the
Automation API, state in a file backend under the cluster's state directory.

Before anything is created, `check_ready` says in one line what is missing: the cloud's Python
SDK (an optional extra), the Pulumi CLI, or the cloud's credentials; then `check_capacity` asks
the cloud, read-only, whether it offers the pools' instance types and has the quota for them.
The SDKs are imported only here and only when a cloud pool is applied, so the toolkit runs
without them.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from provision.cluster import Cluster, compress
from provision.errors import OperationError, SpecError
from provision.pki import TUNNEL_DIR
from provision.providers.base import Defaults, ProviderPlan, planned_only
from provision.secrets import MUNGE_KEY, create_once, write_private
from provision.spec.models import Spec
from provision.spec.nodes import Node
from provision.sshkeys import public_key
from provision.state import State

PROJECT = "provision"
SDK = {"aws": "pulumi_aws", "gcp": "pulumi_gcp", "azure": "pulumi_azure_native"}
# beside the SDK: what apply asks the cloud with before anything is made (capacity.py)
CLIENT = {"aws": ("boto3",), "gcp": (), "azure": ()}
PLUGIN = {"aws": "aws", "gcp": "gcp", "azure": "azure-native"}
PASSPHRASE = "pulumi.passphrase"
# the stack's output (a secret) of the credentials the heads' burst programs use where no head
# is an instance of the cloud (AWS: an IAM user's access key), kept in the cluster's secrets as
# <cloud>-burst-credentials, from where the burst role puts it on the heads
BURST_CREDENTIALS = "burst-credentials"
# the private key of the Azure heads' issuer (its public half is in the stack's key set)
AZURE_ISSUER_KEY = "azure-issuer-key.pem"
# Options: a remote backend (s3://, gs://, azblob://, https://api.pulumi.com) and a KMS secrets
# provider (awskms://..., gcpkms://..., azurekeyvault://...) instead of the local defaults
ENV_BACKEND = "PROVISION_PULUMI_BACKEND"
ENV_SECRETS = "PROVISION_PULUMI_SECRETS_PROVIDER"
# what apply asks GCP and Azure about capacity (capacity.py); the tests point them at fakes
GCE = "https://compute.googleapis.com/compute/v1"
ARM = "https://management.azure.com"
LOGIN = "https://login.microsoftonline.com"
ENV_GCP_ENDPOINT = "PROVISION_GCP_ENDPOINT"
ENV_AZURE_ENDPOINT = "PROVISION_AZURE_ENDPOINT"


def _home(*parts: str) -> Path:
    return Path.home().joinpath(*parts)


def credentials_problem(kind: str, env: dict[str, str] | None = None) -> str | None:
    """What is missing for this cloud's credentials, or None. Looks, does not call the cloud."""
    env = dict(os.environ) if env is None else env
    if kind == "aws":
        if (
            env.get("AWS_ACCESS_KEY_ID")
            or env.get("AWS_PROFILE")
            or env.get("AWS_WEB_IDENTITY_TOKEN_FILE")
        ):
            return None
        if _home(".aws", "credentials").exists() or _home(".aws", "config").exists():
            return None
        return "no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
    if kind == "gcp":
        project = env.get("GOOGLE_PROJECT") or env.get("CLOUDSDK_CORE_PROJECT")
        adc = _home(".config", "gcloud", "application_default_credentials.json")
        if not env.get("GOOGLE_APPLICATION_CREDENTIALS") and not adc.exists():
            return (
                "no GCP credentials: run `gcloud auth application-default login` or set "
                "GOOGLE_APPLICATION_CREDENTIALS"
            )
        if not project:
            return "no GCP project: set GOOGLE_PROJECT"
        return None
    if kind == "azure":
        if env.get("ARM_CLIENT_ID"):
            return (
                None
                if env.get("ARM_SUBSCRIPTION_ID")
                else "no Azure subscription: set ARM_SUBSCRIPTION_ID"
            )
        if _home(".azure", "azureProfile.json").exists():
            return None
        return (
            "no Azure credentials: run `az login` or set ARM_CLIENT_ID, ARM_CLIENT_SECRET and "
            "ARM_TENANT_ID"
        )
    raise ValueError(kind)


def missing_plugin(kind: str) -> str | None:
    """The resource plugin the cloud's SDK needs, if the Pulumi CLI does not have it."""
    import importlib.metadata
    import subprocess

    version = importlib.metadata.version(SDK[kind])
    try:
        listed = subprocess.run(
            ["pulumi", "plugin", "ls", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        plugins = json.loads(listed or "[]")
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        return f"`pulumi plugin ls` failed ({' '.join(str(exc).split())[:200]})"
    if any(
        p.get("kind") == "resource"
        and p.get("name") == PLUGIN[kind]
        and p.get("version") == version
        for p in plugins
    ):
        return None
    return (
        f"the Pulumi {PLUGIN[kind]} plugin {version} is missing: "
        f"pulumi plugin install resource {PLUGIN[kind]} {version}"
    )


def check_ready(kind: str, env: dict[str, str] | None = None) -> None:
    """Raise one clear error for the first thing missing: SDK, CLI, credentials."""
    for module in ("pulumi", SDK[kind], *CLIENT[kind]):
        try:
            importlib.import_module(module)
        except ImportError:
            raise OperationError(
                f"the {kind} pools need Pulumi's Python SDK ({module}): "
                f"pip install 'gpu-provision[{kind}]'"
            ) from None
    if shutil.which("pulumi") is None:
        raise OperationError(
            f"the {kind} pools need the Pulumi CLI, which is not on PATH: install it "
            "(https://www.pulumi.com/docs/install/) and run again"
        )
    plugin_problem = missing_plugin(kind)
    if plugin_problem:
        raise OperationError(plugin_problem)
    problem = credentials_problem(kind, env)
    if problem:
        raise OperationError(f"the {kind} pools: {problem}")


def _cli_output(argv: list[str]) -> str | None:
    """What a cloud's own CLI prints (a token), or None where it is missing or fails."""
    import subprocess

    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (subprocess.SubprocessError, OSError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def _getter(base: str, token: str) -> Callable[[str], Any]:
    """GET below `base` with the token: the JSON answer, or None for 404."""
    from provision.burst import rest

    def get(path: str) -> Any:
        try:
            return rest.request(
                "GET", f"{base}/{path}", headers={"Authorization": f"Bearer {token}"}
            )[1]
        except rest.HTTPError as exc:
            if exc.status == 404:
                return None
            raise

    return get


def _azure_token(env: dict[str, str]) -> tuple[str, str] | None:
    """(token, subscription) for Resource Manager: a service principal's (ARM_*), else the
    Azure CLI's; None where neither is at hand."""
    import urllib.parse

    from provision.burst import rest

    base = env.get(ENV_AZURE_ENDPOINT)
    if env.get("ARM_CLIENT_ID") and env.get("ARM_CLIENT_SECRET") and env.get("ARM_TENANT_ID"):
        form = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": env["ARM_CLIENT_ID"],
                "client_secret": env["ARM_CLIENT_SECRET"],
                "scope": f"{ARM}/.default",
            }
        )
        login = f"{base or LOGIN}/{env['ARM_TENANT_ID']}/oauth2/v2.0/token"
        return rest.form_token(login, form), env.get("ARM_SUBSCRIPTION_ID", "")
    answer = _cli_output(
        ["az", "account", "get-access-token", "--resource", f"{ARM}/", "--output", "json"]
    )
    if answer is None:
        return None
    try:
        doc = json.loads(answer)
    except ValueError:
        return None
    subscription = env.get("ARM_SUBSCRIPTION_ID") or doc.get("subscription", "")
    return (doc["accessToken"], subscription) if doc.get("accessToken") else None


def _capacity(kind: str, cluster: Cluster, env: dict[str, str]) -> Any:
    """What the cloud says of the pools (capacity.Findings), or a line on why it was not asked."""
    from provision.providers.cloud import capacity
    from provision.providers.cloud.layout import AZURE_PLAN_OS, IMAGES

    if kind == "gcp":
        project = env.get("GOOGLE_PROJECT") or env.get("CLOUDSDK_CORE_PROJECT") or ""
        token = _cli_output(["gcloud", "auth", "application-default", "print-access-token"])
        if token is None:
            return (
                "its quotas were not checked: no token from `gcloud auth application-default "
                "print-access-token`"
            )
        base = env.get(ENV_GCP_ENDPOINT) or GCE
        return capacity.gcp_capacity(cluster, project, _getter(base, token))
    found = _azure_token(env)
    if found is None:
        return (
            "its quotas were not checked: no token (ARM_CLIENT_* or `az account get-access-token`)"
        )
    token, subscription = found
    os_name = cluster.spec.os
    urn = ":".join(IMAGES[os_name]["azure"]) if os_name in AZURE_PLAN_OS else None
    base = env.get(ENV_AZURE_ENDPOINT) or ARM
    return capacity.azure_capacity(cluster, subscription, _getter(base, token), urn)


def check_capacity(
    kind: str, cluster: Cluster, log: Callable[[str], None], env: dict[str, str] | None = None
) -> None:
    """Ask the cloud, read-only, whether it can give the pools what they need (capacity.py):
    one error naming every pool it would refuse; what is only worth knowing, logged."""
    env = dict(os.environ) if env is None else env
    if kind != "aws":
        from provision.burst.backend import BurstError

        try:
            answer = _capacity(kind, cluster, env)
        except BurstError as exc:  # an API it may not ask: said, not held against the apply
            log(f"{kind}: its quotas were not checked: {' '.join(str(exc).split())[:200]}")
            return
        if isinstance(answer, str):
            log(f"{kind}: {answer}")
            return
        for note in answer.notes:
            log(f"{kind}: {note}")
        if answer.problems:
            raise OperationError(f"{kind}: " + "; ".join(answer.problems))
        return
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from provision.providers.cloud.capacity import aws_capacity

    region = next(
        (v.pool.region for v in cluster.pools if v.pool.provider == kind and v.pool.region), None
    )
    session = boto3.session.Session(region_name=region)
    try:
        found = aws_capacity(cluster, session.client)
    except (ClientError, BotoCoreError) as exc:
        raise OperationError(
            f"aws: could not ask EC2 about the pools' instance types in {region} "
            f"({' '.join(str(exc).split())[:200]})"
        ) from None
    for note in found.notes:
        log(f"aws: {note}")
    if found.problems:
        raise OperationError("aws: " + "; ".join(found.problems))


def component(
    kind: str,
    cluster: Cluster,
    ssh_public_key: str,
    munge_key: bytes | None = None,
    tunnel_keys: dict[str, bytes] | None = None,
    images: dict[str, str] | None = None,
    issuer_key: dict[str, str] | None = None,
) -> Any:
    """Build the cloud's component in the current Pulumi program (or under test mocks). The
    munge key goes into the cloud's secret store where a pool is elastic, and a remote elastic
    pool's tunnel keys (pool -> joining.tunnel_keys_value) into a secret of the pool's (as
    Pulumi secrets: encrypted in the stack's state); images: an elastic pool's own image, which
    its template starts (images.py)."""
    from provision.providers.cloud.layout import layout

    shape = layout(cluster, kind, ssh_public_key, images)
    keys = tunnel_keys or {}
    if kind == "aws":
        from provision.providers.cloud.aws import AwsCluster

        return AwsCluster(shape, munge_key, tunnel_keys=keys)
    if kind == "gcp":
        from provision.providers.cloud.gcp import GcpCluster

        return GcpCluster(shape, munge_key, tunnel_keys=keys)
    from provision.providers.cloud.azure import AzureCluster

    return AzureCluster(shape, munge_key, tunnel_keys=keys, issuer_key=issuer_key)


def program(
    kind: str,
    cluster: Cluster,
    ssh_public_key: str,
    munge_key: bytes | None = None,
    tunnel_keys: dict[str, bytes] | None = None,
    images: dict[str, str] | None = None,
    issuer_key: dict[str, str] | None = None,
) -> Callable[[], None]:
    def run() -> None:
        import pulumi

        built = component(kind, cluster, ssh_public_key, munge_key, tunnel_keys, images, issuer_key)
        pulumi.export("nodes", built.nodes)
        pulumi.export("templates", built.templates)
        if kind == "aws":  # a running stack's subnets keep their ranges (refused_recarve)
            pulumi.export("subnets", built.subnets)
            pulumi.export("builder_subnets", built.builder_subnets)
        credentials = getattr(built, "burst_credentials", None)
        if credentials is not None:  # a Pulumi secret: apply keeps it apart (create)
            pulumi.export(BURST_CREDENTIALS, credentials)

    return run


def outputs_file(state: State, kind: str) -> Path:
    """Where apply keeps a cloud stack's outputs: node addresses and template IDs."""
    return state.dir / f"cloud-{kind}.json"


def saved_addresses(
    state: State, kind: str, which: str = "private"
) -> dict[str, ipaddress.IPv4Address]:
    """The node addresses of the last `pulumi up` of that cloud, or {} before any."""
    path = outputs_file(state, kind)
    return addresses_from(json.loads(path.read_text()), which) if path.exists() else {}


def addresses_from(
    outputs: dict[str, Any], which: str = "private"
) -> dict[str, ipaddress.IPv4Address]:
    """Node name -> its private address (the cluster's: the tunnel, Slurm, /etc/hosts), or
    its public one (where this machine logs in), for the nodes that have one."""
    out = {}
    for name, addrs in (outputs.get("nodes") or {}).items():
        if addrs.get(which):
            out[name] = ipaddress.IPv4Address(addrs[which])
    return out


def refuse_api_address(spec_path: Path, cluster: Cluster) -> None:
    """SpecError (exit 2, at kubernetes.api_address) where an HA control plane's heads are in a
    cloud whose load balancer cannot take the address: outside the heads' subnet, or one the
    cloud keeps for itself (validate, plan and apply say it before anything is made)."""
    from provision.providers.cloud.layout import api_address_problem, layout
    from provision.render.kubernetes import api_cloud
    from provision.spec.validation import issue_at
    from provision.spec.yamlfile import read_yaml

    cloud = api_cloud(cluster)
    if cloud is None:
        return
    problem = api_address_problem(layout(cluster, cloud, ""))
    if problem is not None:
        raise SpecError(
            [issue_at(read_yaml(spec_path), str(spec_path), ["kubernetes", "api_address"], problem)]
        )


def refuse_recarve(spec_path: Path, state: State, cluster: Cluster) -> None:
    """SpecError (exit 2, at the pool) where the spec would change the range of a subnet the
    running AWS stack has (a zone added, or the first pool of a private zone): plan and apply
    say it before anything is changed, as Pulumi would only fail midway (the new subnet
    overlaps the old one, which holds the instances)."""
    from provision.providers.cloud.layout import layout, refused_recarve
    from provision.spec.validation import issue_at
    from provision.spec.yamlfile import read_yaml

    path = outputs_file(state, "aws")
    pools = [i for i, p in enumerate(cluster.spec.pools) if p.provider == "aws"]
    if not pools or not path.exists():
        return
    saved = json.loads(path.read_text()).get("subnets") or {}
    shape = layout(cluster, "aws", "")
    changed = refused_recarve(shape, saved)
    if not changed:
        return
    private = {p.name for p in shape.pools if p.private}
    spec = cluster.spec
    at = next((i for i in pools if spec.pools[i].name in private), None)
    at = at if at is not None else next((i for i in pools if spec.pools[i].zone), pools[0])
    raise SpecError(
        [
            issue_at(
                read_yaml(spec_path),
                str(spec_path),
                ["pools", at],
                f"the running AWS stack's subnets would change range ({'; '.join(changed)}): "
                "EC2 cannot change a subnet's range, and a new subnet beside it would overlap "
                "it; keep the zones and the burst pools' types the stack was made with, or "
                "destroy the cluster and apply it anew",
            )
        ]
    )


def _munge_key(state: State) -> bytes | None:
    """The cluster's munge key (made before the nodes), for an elastic pool's secret."""
    path = state.secrets / MUNGE_KEY
    return path.read_bytes() if path.exists() else None


def _tunnel_keys(state: State, cluster: Cluster, kind: str) -> dict[str, bytes]:
    """Each remote elastic pool of this cloud -> its tunnel secret's value, from the keys
    apply made before the nodes (none before then: a preview plans the secrets alone)."""
    from provision.providers.cloud.joining import tunnel_keys_value

    out = {}
    for view in cluster.pools:
        pool = view.pool
        if pool.provider == kind and pool.elastic and pool.network is not None:
            value = tunnel_keys_value(cluster, view, state.secrets / TUNNEL_DIR)
            if value is not None:
                out[view.name] = value
    return out


def _issuer_key(state: State) -> Path:
    """The Azure heads' issuer's private key (RSA 2048, PEM, 0600), made once."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    def make() -> bytes:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    state.ensure()
    return create_once(state.secrets / AZURE_ISSUER_KEY, make, (64, 16 * 1024))


def issuer_jwk(pem: bytes) -> dict[str, str]:
    """The public JWK (RFC 7517) of the issuer's key, its kid the key's RFC 7638 thumbprint."""
    import base64
    import hashlib

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise OperationError("the Azure issuer's key is not an RSA key")
    numbers = key.public_key().public_numbers()

    def b64(value: int) -> str:
        data = value.to_bytes((value.bit_length() + 7) // 8, "big")
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    e, n = b64(numbers.e), b64(numbers.n)
    canonical = json.dumps({"e": e, "kty": "RSA", "n": n}, separators=(",", ":"))
    kid = base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest())
    return {
        "kty": "RSA",
        "alg": "RS256",
        "use": "sig",
        "kid": kid.rstrip(b"=").decode(),
        "n": n,
        "e": e,
    }


def keep_credentials(outputs: dict[str, Any], state: State, kind: str) -> dict[str, Any]:
    """The stack's outputs without the heads' burst credentials, which go to the cluster's
    secrets (0600) for the burst role; removed there when the stack has none any more. Azure's
    are the heads' identity and its issuer: the issuer's key joins them there."""
    path = state.secrets / f"{kind}-{BURST_CREDENTIALS}"
    credentials = outputs.pop(BURST_CREDENTIALS, None)
    if credentials and kind == "azure":
        doc = json.loads(str(credentials))
        doc["private_key"] = (state.secrets / AZURE_ISSUER_KEY).read_text()
        credentials = json.dumps(doc, sort_keys=True)
    if credentials:
        write_private(path, str(credentials).encode())
    else:
        path.unlink(missing_ok=True)
    return outputs


def _images(state: State, kind: str) -> dict[str, str]:
    """Each elastic pool of this cloud whose image was made -> that image."""
    from provision.providers.cloud.images import records

    return {pool: r.image for pool, r in records(state).items() if r.cloud == kind}


class CloudProvider(Defaults):
    """plan / create / destroy of one cloud's stack for one cluster."""

    def __init__(self, kind: str, spec: Spec, log: Callable[[str], None] | None = None) -> None:
        self.kind = kind
        self.spec = spec
        self.log = log or (lambda _m: None)

    def prepare(self, cluster: Cluster) -> None:
        """The SDK, CLI and credentials, then the capacity the pools ask for."""
        check_ready(self.kind)
        check_capacity(self.kind, cluster, self.log)

    def chosen(self, cluster: Cluster) -> list[Node]:
        # the stack also holds the templates its burst pools start from
        return [n for n in cluster.nodes if n.provider == self.kind]

    def login_addresses(self, state: State) -> dict[str, ipaddress.IPv4Address]:
        """The public addresses this machine logs in at."""
        return saved_addresses(state, self.kind, "public")

    def release(self, names: list[str], state: State) -> str:
        return f"{self.kind}: {compress(names)} destroyed by the stack's update"

    def plan(self, nodes: list[Node], state: State) -> ProviderPlan:
        """The resources from the spec; with the SDK, CLI and credentials, Pulumi's preview."""
        from provision.providers.cloud.layout import describe, layout

        planned = planned_only(self.kind, nodes)
        lines = describe(layout(Cluster(self.spec), self.kind, ssh_public_key=""))
        lines += self._image_lines(state)
        try:
            check_ready(self.kind)
        except OperationError as exc:
            lines.append(f"{self.kind}: from the spec only, no preview: {exc}")
            return replace(planned, resources=lines)

        stack = self._stack(state, Cluster(self.spec), public_key(self.spec, state))
        preview = stack.preview()
        counts = ", ".join(f"{n} {op}" for op, n in sorted(preview.change_summary.items()))
        lines.append(f"{self.kind}: pulumi preview: {counts or 'no changes'}")
        return replace(planned, resources=lines)

    def _image_lines(self, state: State) -> list[str]:
        """Each elastic pool's image: made, or to be made and how long it may take. The render
        is the one apply would write: with the addresses the clouds gave the lasting nodes."""
        from provision.providers.cloud.images import BUILDERS, elastic_pools, plan_lines
        from provision.render import render

        if self.kind not in BUILDERS or not elastic_pools(Cluster(self.spec), self.kind):
            return []
        private: dict[str, ipaddress.IPv4Address] = {}
        public: dict[str, ipaddress.IPv4Address] = {}
        for kind in SDK:
            private.update(saved_addresses(state, kind))
            public.update(saved_addresses(state, kind, "public"))
        cluster = Cluster(self.spec, private or None, public or None)
        return plan_lines(cluster, self.kind, render(cluster), state)

    def _stack(self, state: State, cluster: Cluster, key: str) -> Any:
        from pulumi import automation as auto

        backend = state.dir / "pulumi"
        backend.mkdir(parents=True, exist_ok=True, mode=0o700)
        state.ensure()
        passphrase = create_once(
            state.secrets / PASSPHRASE, lambda: secrets.token_urlsafe(32).encode()
        )
        url = os.environ.get(ENV_BACKEND) or backend.as_uri()
        settings = auto.ProjectSettings(
            name=PROJECT, runtime="python", backend=auto.ProjectBackend(url=url)
        )
        return auto.create_or_select_stack(
            stack_name=f"{self.spec.name}-{self.kind}",
            project_name=PROJECT,
            program=program(
                self.kind,
                cluster,
                key,
                _munge_key(state),
                _tunnel_keys(state, cluster, self.kind),
                _images(state, self.kind),
                self._issuer(state, cluster),
            ),
            opts=auto.LocalWorkspaceOptions(
                project_settings=settings,
                secrets_provider=os.environ.get(ENV_SECRETS) or "passphrase",
                env_vars={"PULUMI_CONFIG_PASSPHRASE": passphrase.read_text().strip()},
            ),
        )

    def _issuer(self, state: State, cluster: Cluster) -> dict[str, str] | None:
        """The public key of the Azure heads' issuer, where Azure pools burst."""
        if self.kind != "azure" or not any(
            v.pool.elastic and v.pool.provider == "azure" for v in cluster.pools
        ):
            return None
        return issuer_jwk(_issuer_key(state).read_bytes())

    def create(self, nodes: list[Node], state: State) -> dict[str, ipaddress.IPv4Address]:
        check_ready(self.kind)

        cluster = Cluster(self.spec)
        stack = self._stack(state, cluster, public_key(self.spec, state))
        self.log(f"nodes: {self.kind}: pulumi up (stack {self.spec.name}-{self.kind})")
        try:
            result = stack.up(on_output=self.log)
        except Exception as exc:  # the stack keeps what was made; a rerun continues it
            raise OperationError(
                f"{self.kind}: pulumi up failed ({' '.join(str(exc).split())[:300]}); "
                "run apply again to continue"
            ) from None
        outputs = keep_credentials(
            {k: v.value for k, v in result.outputs.items()}, state, self.kind
        )
        # node addresses and template IDs, for bursting and for people: no secrets in them
        outputs_file(state, self.kind).write_text(
            json.dumps(outputs, indent=1, sort_keys=True) + "\n"
        )
        return addresses_from(outputs)

    def image_builds(self, cluster: Cluster, state: State, pools: list[str] | None = None) -> Any:
        """Builder instances for the elastic pools whose image is missing or stale (or for
        `pools`): images.py. After the capture the stack runs again, so each pool's template
        starts its new image."""
        from provision.providers.cloud.images import BUILDERS, cloud_builds, elastic_pools

        if not elastic_pools(cluster, self.kind):
            return None
        if self.kind not in BUILDERS:  # the spec refuses their elastic pools until then
            raise OperationError(f"{self.kind}: pool images are not built yet")
        check_ready(self.kind)  # the SDK, the CLI (the stack runs again after) and credentials

        def refresh() -> None:
            self.create(self.chosen(cluster), state)

        return cloud_builds(cluster, state, self._builder(cluster, state), self.log, refresh, pools)

    def _builder(self, cluster: Cluster, state: State) -> Any:
        """This cloud's image builder (builders.py)."""
        from provision.providers.cloud.builders import AwsBuilder, AzureBuilder, GcpBuilder

        if self.kind == "gcp":
            return GcpBuilder(cluster)
        if self.kind == "azure":
            return AzureBuilder(cluster)
        path = outputs_file(state, self.kind)
        subnets = json.loads(path.read_text()).get("builder_subnets") if path.exists() else None
        return AwsBuilder(cluster, subnets=subnets)

    def destroy(self, nodes: list[Node], state: State) -> list[str]:
        if not (state.dir / "pulumi").exists():
            return []
        check_ready(self.kind)

        cluster = Cluster(self.spec)
        stack = self._stack(state, cluster, public_key(self.spec, state))
        stack.destroy(on_output=self.log)
        from provision.providers.cloud.images import BUILDERS, elastic_pools, remove_images

        if self.kind in BUILDERS and elastic_pools(cluster, self.kind):
            # the pools' images are not the stack's: removed here
            for image in remove_images(cluster, state, self._builder(cluster, state)):
                self.log(f"destroy: {self.kind}: image {image} and its snapshots removed")
        return [n.name for n in nodes if not n.elastic]
