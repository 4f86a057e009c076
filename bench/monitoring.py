"""Monitoring and health on examples/lab.yaml: how soon an alert reaches a webhook, how soon a
sick node is drained and resumed, and what Prometheus costs.

Prints: seconds from a node's exporter stopping to NodeDown reaching a webhook receiver on this
machine (median of 3); seconds from /dev/shm filling to the node drained and from freeing it to
the node resumed (health every 15 s; median of 3); Prometheus' resident memory, its scrape
durations, its series, the series of one lab node, and an estimate for GPU nodes from the DCGM
exporter's field list (roles/dcgm/files/counters.csv) for one node and for 1,000.

Run as root with podman (make bench). It makes and destroys its own cluster (benchmon, on
10.70.0.0/24); about 10 minutes. `--keep` leaves it up.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import ROOT, provision
from failover import on, until

NAME = "benchmon"
RUNS = 3
COUNTERS = ROOT / "roles/dcgm/files/counters.csv"


class Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # the standard library's name for it
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        server = self.server
        assert isinstance(server, Receiver)
        for alert in body.get("alerts", []):
            server.seen.append((time.monotonic(), alert["status"], alert["labels"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.seen: list[tuple[float, str, dict[str, str]]] = []
        super().__init__(("0.0.0.0", 0), Hook)

    def first(self, name: str, node: str, status: str, after: float, limit: float) -> float:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            for at, state, labels in list(self.seen):
                if (
                    at > after
                    and state == status
                    and labels.get("alertname") == name
                    and labels.get("node") == node
                ):
                    return at - after
            time.sleep(0.2)
        raise SystemExit(f"no {status} {name} for {node} within {limit:.0f}s")


def query(spec: Path, work: Path, expr: str) -> list[dict]:  # type: ignore[type-arg]
    """Prometheus answers the head's loopback alone: asked there, over SSH."""
    url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    fetch = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())"
    code, out = on(spec, work, "head001", f"python3 -c {shlex.quote(fetch)} {shlex.quote(url)}")
    if code != 0:
        raise SystemExit(f"Prometheus on head001 did not answer {expr!r}")
    return json.loads(out)["data"]["result"]  # type: ignore[no-any-return]


def dcgm_fields() -> int:
    lines = COUNTERS.read_text().splitlines()
    return sum(1 for ln in lines if ln.strip() and not ln.startswith("#"))


def main() -> int:
    keep = "--keep" in sys.argv
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    hook = f"http://10.70.0.1:{receiver.server_address[1]}/alerts"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = work / "lab.yaml"
        text = (ROOT / "examples" / "lab.yaml").read_text()
        spec.write_text(
            text.replace("name: lab", f"name: {NAME}")
            .replace("10.77.0.", "10.70.0.")
            .replace(
                "\nmonitoring: {}",
                f"\nmonitoring: {{receivers: [{{name: bench, webhook: '{hook}'}}]}}",
            )
            .replace("\n  interval: 60\n", "\n  interval: 15\n")
        )
        env = dict(os.environ)
        try:
            wall, _ = provision(["apply", str(spec), "--no-verify"], work, env)
            print(f"cold apply with monitoring and health, 3 nodes: {wall:.0f}s")
            until(spec, work, "head001", "sinfo -h -n compute001 -o %T", "idle", 120)
            alert = []
            for _ in range(RUNS):
                on(spec, work, "compute001", "systemctl stop prometheus-node-exporter")
                stopped = time.monotonic()
                alert.append(receiver.first("NodeDown", "compute001", "firing", stopped, 300))
                on(spec, work, "compute001", "systemctl start prometheus-node-exporter")
                receiver.first("NodeDown", "compute001", "resolved", stopped, 300)
            median = statistics.median(alert)
            print(
                f"exporter stopped -> NodeDown at the webhook: median {median:.0f}s"
                f" ({', '.join(f'{a:.0f}' for a in alert)}; scrape 15 s, for 1m, group_wait 10 s)"
            )
            drained, resumed = [], []
            state = "sinfo -h -n compute002 -o %T"
            for _ in range(RUNS):
                on(spec, work, "compute002", "head -c 56M /dev/zero > /dev/shm/bench")
                drained.append(until(spec, work, "head001", state, "drain", 120))
                on(spec, work, "compute002", "rm -f /dev/shm/bench")
                resumed.append(until(spec, work, "head001", state, "idle", 120))
            print(
                f"/dev/shm filled -> compute002 drained: median {statistics.median(drained):.0f}s;"
                f" freed -> resumed: median {statistics.median(resumed):.0f}s"
                " (health.interval 15 s; polled every 0.5 s over SSH)"
            )
            rss = float(
                query(spec, work, 'process_resident_memory_bytes{job="prometheus"}')[0]["value"][1]
            )
            series = int(float(query(spec, work, "prometheus_tsdb_head_series")[0]["value"][1]))
            per_node = int(float(query(spec, work, 'count({node="compute001"})')[0]["value"][1]))
            scrape = {
                r["metric"]["job"]: float(r["value"][1])
                for r in query(spec, work, "max by (job) (scrape_duration_seconds)")
            }
            print(
                f"Prometheus: {rss / 2**20:.0f} MiB resident, {series} series in its head block;"
                " slowest scrape per job: "
                + ", ".join(f"{j} {s * 1000:.0f} ms" for j, s in sorted(scrape.items()))
            )
            gpu = dcgm_fields() * 8
            print(
                f"series: {per_node} for a lab node (node exporter and health); a GPU node adds "
                f"{dcgm_fields()} DCGM fields x 8 GPUs = {gpu}, so about {per_node + gpu} per "
                f"8-GPU node and {(per_node + gpu) * 1000 / 1e6:.1f} million for 1,000 such nodes"
                " (a real host's node exporter reports more devices and mounts than a container)"
            )
        finally:
            receiver.shutdown()
            if not keep:
                provision(["destroy", str(spec), "--yes"], work, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
