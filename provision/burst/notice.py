"""A spot node's watch for its cloud's advance notice that it takes the instance back: EC2 posts
`spot/instance-action` in the instance's metadata two minutes before, Compute Engine sets
`instance/preempted` to TRUE about 30 seconds before, Azure schedules a `Preempt` event in its
Scheduled Events at least 30 seconds before (each cloud's spot guide has its node poll for it,
EC2's every 5 seconds). On the notice the node marks itself DOWN with the reason, so
Slurm requeues its jobs then, not when the instance is already gone; the reconciler's cooldown
returns the name to the pool (slurm.COOLDOWN_REASONS).

The join starts it on a spot instance only (its metadata says so: Metadata.spot), as a
transient systemd unit that ends with the instance:
`python3 -m provision.burst notice`. root alone reads the metadata service (the join's guard),
and root's `scontrol update` is the cluster's own (munge), from slurmd's cached configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from provision.burst import rest
from provision.burst.backend import BurstError, one_line
from provision.burst.join import Metadata
from provision.burst.slurm import NOTICE_REASON

POLL_S = 5  # EC2's advice: look every 5 seconds
GCP_WAIT_S = 60  # a GCP wait_for_change answers at the latest then
# where a configless slurmd keeps the configuration it fetched (client commands read it there)
CONF_CACHES = (Path("/run/slurm/conf/slurm.conf"), Path("/var/spool/slurmd/conf-cache/slurm.conf"))


def notice(metadata: Metadata, node: str = "") -> str | None:
    """The cloud's notice, if it gave one: what it will do, as a reason's words; else None.
    GCP's look waits (wait_for_change) until the value changes or a minute passes."""
    if metadata.cloud == "azure":
        return _azure_notice(metadata, node)
    if metadata.cloud == "aws":
        status, value = metadata.aws("spot/instance-action")
        if status == 404:
            return None
        if status != 200:
            raise BurstError(f"spot/instance-action: HTTP {status}")
        try:
            doc = json.loads(value)
            return f"EC2 will {doc['action']} the instance at {doc['time']}"
        except (ValueError, KeyError, TypeError):
            return "EC2 takes the instance back"
    status, value = rest.text(
        f"{metadata.base}/instance/preempted?wait_for_change=true&timeout_sec={GCP_WAIT_S}",
        {"Metadata-Flavor": "Google"},
        timeout=GCP_WAIT_S + 10,
    )
    if status != 200:
        raise BurstError(f"instance/preempted: HTTP {status}")
    return "Compute Engine is preempting the VM" if value.strip().upper() == "TRUE" else None


def _azure_notice(metadata: Metadata, node: str) -> str | None:
    """A `Preempt` event of this VM in Azure's Scheduled Events (the first look turns the
    service on for the VM; an event names the VMs it concerns)."""
    status, value = rest.text(
        f"{metadata.base}/metadata/scheduledevents?api-version=2020-07-01",
        {"Metadata": "true"},
        timeout=30,
    )
    if status != 200:
        raise BurstError(f"scheduledevents: HTTP {status}")
    try:
        events = json.loads(value).get("Events") or []
    except (ValueError, AttributeError):
        raise BurstError("scheduledevents: not JSON") from None
    for event in events:
        if not isinstance(event, dict) or event.get("EventType") != "Preempt":
            continue
        resources = event.get("Resources") or []
        if node and resources and node not in resources:
            continue
        when = event.get("NotBefore")
        return f"Azure evicts the spot VM{f' at {when}' if when else ''}"
    return None


def mark_self_down(node: str, why: str) -> None:
    """DOWN with the notice as its reason: Slurm requeues the node's jobs now."""
    env = dict(os.environ)
    cached = next((p for p in CONF_CACHES if p.exists()), None)
    if cached is not None and "SLURM_CONF" not in env:
        env["SLURM_CONF"] = str(cached)
    reason = " ".join(f"{NOTICE_REASON} ({why})".split())[:200]
    done = subprocess.run(
        ["scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={reason}"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise BurstError(f"scontrol update: {one_line(Exception(done.stderr or done.stdout))}")


def watch(
    metadata: Metadata,
    node: str,
    say: Callable[[str], None],
    poll_s: float = POLL_S,
    mark: Callable[[str, str], None] = mark_self_down,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Until the cloud's notice: then the node is marked down; the notice's words. A look that
    fails is said and tried again at the next poll (the metadata service hiccups)."""
    while True:
        try:
            why = notice(metadata, node)
        except (BurstError, OSError) as exc:
            say(f"notice: {one_line(exc)}; looking again")
            sleep(poll_s)
            continue
        if why is not None:
            say(f"notice: {why}: {node} marked down, its jobs requeued")
            mark(node, why)
            return why
        if metadata.cloud != "gcp":  # GCP's look waited already
            sleep(poll_s)
