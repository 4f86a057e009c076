"""JWTs signed RS256 with a PEM key, for the token endpoints that take one in place of a secret
(Google's OAuth 2.0 for server-to-server applications; Microsoft Entra's federated credentials).
The standard library has no RSA: openssl signs, the key handed over a pipe, never a file."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from typing import Any

from provision.burst.backend import BurstError


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed(claims: dict[str, Any], pem: str, kid: str | None = None) -> str:
    """The compact JWT of `claims`, RS256 under the PEM key (`kid` names the key in its
    header, where the verifier finds it in a key set)."""
    header: dict[str, str] = {"alg": "RS256", "typ": "JWT"}
    if kid:
        header["kid"] = kid
    text = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    return f"{text}.{b64url(sign_rs256(text.encode(), pem))}"


def sign_rs256(data: bytes, pem: str) -> bytes:
    """RSASSA-PKCS1-v1_5 with SHA-256 of `data` under the PEM key, by openssl, the key handed
    over a pipe (never a file)."""
    read, write = os.pipe()
    try:
        os.write(write, pem.encode())  # a key is far below a pipe's buffer
        os.close(write)
        write = -1
        done = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", f"/dev/fd/{read}"],
            input=data,
            capture_output=True,
            pass_fds=(read,),
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BurstError(f"openssl could not sign the token request: {exc}") from None
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)
    if done.returncode != 0 or not done.stdout:
        why = (done.stderr.decode(errors="replace").strip().splitlines() or ["no signature"])[0]
        raise BurstError(f"openssl could not sign the token request: {why[:200]}")
    return done.stdout
