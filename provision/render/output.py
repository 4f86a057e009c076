"""A render on disk: files written atomically into a build directory, with a manifest of what
the render owns, so a later render removes what it no longer makes and nothing else."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from provision.errors import UsageError

MANIFEST = ".provision-render.json"


def write_render(files: dict[str, str], out: Path) -> list[str]:
    """Write files under `out`; return the paths that changed. Files an earlier render wrote
    and this one does not are removed; files the render does not own are never touched."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} is a file: name a directory to render into")
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    previous = _manifest(out)
    changed = []
    digests = {}
    for rel, content in files.items():
        digest = hashlib.sha256(content.encode()).hexdigest()
        digests[rel] = digest
        target = out / rel
        if target.exists() and target.read_text(encoding="utf-8") == content:
            continue
        _atomic_write(target, content)
        changed.append(rel)
    for rel in sorted(set(previous) - set(files)):
        stale = out / rel
        if stale.is_file():
            stale.unlink()
            changed.append(rel)
    _atomic_write(manifest_path, json.dumps({"files": digests}, indent=1, sort_keys=True) + "\n")
    return changed


def _atomic_write(target: Path, content: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_render(directory: Path) -> dict[str, str]:
    """The files a render wrote into `directory` (by its manifest), or {} if none."""
    names = _manifest(directory)
    return {
        rel: (directory / rel).read_text() for rel in sorted(names) if (directory / rel).is_file()
    }


def _manifest(directory: Path) -> dict[str, str]:
    """The files an earlier render recorded in `directory`: each a plain relative path that
    stays inside it (a manifest is a file anyone could edit; render deletes what it names)."""
    path = directory / MANIFEST
    if not path.exists():
        return {}
    try:
        names = json.loads(path.read_text()).get("files", {})
        assert isinstance(names, dict)
    except (ValueError, AttributeError, AssertionError):
        raise UsageError(f"{path} is damaged: remove it (render writes it again)") from None
    root = directory.resolve()
    for rel in names:
        parts = Path(rel).parts
        inside = (directory / rel).resolve().is_relative_to(root)
        if not parts or Path(rel).is_absolute() or ".." in parts or not inside:
            raise UsageError(
                f"{path} names {rel!r}, outside {directory}: remove the manifest (render writes it "
                "again) and look at who wrote that"
            )
    return {str(k): str(v) for k, v in names.items()}
