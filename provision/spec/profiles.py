"""The hardware profiles: the built-in catalogue (provision/profiles/*.yaml) and a spec's own."""

from __future__ import annotations

from pathlib import Path

from provision.spec.models import Profile
from provision.spec.validation import validate_document
from provision.spec.yamlfile import read_yaml

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"


def load_profiles(extra: dict[str, Profile] | None = None) -> dict[str, Profile]:
    """The built-in hardware profiles plus those a spec defines (the spec's win)."""
    profiles = dict(builtin_profiles())
    profiles.update(extra or {})
    return profiles


_BUILTIN: dict[str, Profile] | None = None


def builtin_profiles() -> dict[str, Profile]:
    global _BUILTIN
    if _BUILTIN is None:
        loaded = {}
        for file in sorted(PROFILE_DIR.glob("*.yaml")):
            loaded[file.stem] = validate_document(read_yaml(file), Profile, str(file))
        _BUILTIN = loaded
    return _BUILTIN
