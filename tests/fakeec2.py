"""EC2 for the bursting tests and bench: moto in server mode on 127.0.0.1, behind a small proxy
that counts the API calls by action and, when asked, answers an action with an EC2 error (the
XML EC2 sends, HTTP 500 as EC2 does for InsufficientInstanceCapacity) instead of passing it on.

boto3 reaches it through AWS_ENDPOINT_URL, exactly as it would reach EC2.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error></Errors><RequestID>{rid}</RequestID></Response>"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeEC2:
    """Use as a context manager; `url` is the endpoint, `calls` counts actions (`requests` keeps
    their parameters), `fail` maps an
    action to (code, message) to answer with instead, `rewrite` an action to (old, new): bytes
    of moto's answer replaced as EC2 would send them (what moto cannot make happen, such as EC2
    taking a spot instance back)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        # each action's requests as EC2 gets them (query parameters: what moto may not keep)
        self.requests: dict[str, list[dict[str, str]]] = {}
        self.fail: dict[str, tuple[str, str]] = {}
        self.rewrite: dict[str, tuple[bytes, bytes]] = {}
        self._moto_port = free_port()
        self._moto: subprocess.Popen[bytes] | None = None
        self._proxy: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._proxy is not None
        return f"http://127.0.0.1:{self._proxy.server_address[1]}"

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def __enter__(self) -> FakeEC2:
        self._moto = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self._moto_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self._moto_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self._moto.poll() is not None:
                    self.__exit__()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        fake = self

        class Proxy(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                params = dict(urllib.parse.parse_qsl(body.decode()))
                action = params.get("Action", "?")
                fake.calls[action] += 1
                fake.requests.setdefault(action, []).append(params)
                if action in fake.fail:
                    code, message = fake.fail[action]
                    reply = ERROR.format(code=code, message=message, rid=f"fake-{action}")
                    self._answer(500, reply.encode(), "text/xml")
                    return
                conn = http.client.HTTPConnection("127.0.0.1", fake._moto_port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request("POST", self.path, body, headers)
                answer = conn.getresponse()
                data = answer.read()
                conn.close()
                if action in fake.rewrite:
                    data = data.replace(*fake.rewrite[action])
                self._answer(answer.status, data, answer.getheader("Content-Type") or "text/xml")

            def _answer(self, status: int, data: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
        self._proxy.daemon_threads = True
        threading.Thread(target=self._proxy.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proxy is not None:
            self._proxy.shutdown()
            self._proxy.server_close()
        if self._moto is not None:
            self._moto.terminate()
            self._moto.wait(timeout=30)

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "ec2",
            region_name="us-east-1",
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def launch_template(self, name: str, instance_type: str, cards: int = 1) -> str:
        """What the cluster's stack makes for a pool: a VPC, a subnet, a launch template; with
        several network cards, an EFA on each (P5's: efa-only past the first), as aws.py lays
        them out. Returns the subnet."""
        ec2 = self.client()
        vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.128.0/20")["Subnet"]["SubnetId"]
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        interfaces: list[dict[str, Any]] = [{"DeviceIndex": 0, "SubnetId": subnet}]
        if cards > 1:
            interfaces = [
                {
                    "DeviceIndex": 0 if card == 0 else 1,
                    "NetworkCardIndex": card,
                    "InterfaceType": "efa" if card == 0 else "efa-only",
                    "SubnetId": subnet,
                    "DeleteOnTermination": True,
                }
                for card in range(cards)
            ]
        ec2.create_launch_template(
            LaunchTemplateName=name,
            LaunchTemplateData={
                "ImageId": image,
                "InstanceType": instance_type,
                "NetworkInterfaces": interfaces,
                "MetadataOptions": {"HttpTokens": "required"},
            },
        )
        return subnet


def with_env(fake: FakeEC2) -> dict[str, str]:
    return {**os.environ, **fake.env()}
