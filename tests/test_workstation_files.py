"""The workstation's files a spec names (spec/paths.py): only beside the spec, in a secrets
directory the user declared, or where that kind of file lives (~/.ssh, the certificate
directories); links and `..` followed before the check; relative paths are the spec's."""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from provision.errors import SpecError
from provision.spec import load_spec
from provision.spec.models import Spec

from .conftest import ROOT
from .conftest import run_provision as provision

LAB = ROOT / "examples" / "lab.yaml"
MAIL = (
    "\nmonitoring: {{receivers: [{{name: mail, email: {{to: a@example.org, "
    "sender: b@example.org, smarthost: 'smtp.example.org:587', username: alerts, "
    "password_file: '{path}'}}}}]}}"
)


def _spec(directory: Path, password_file: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    spec = directory / "lab.yaml"
    spec.write_text(LAB.read_text().replace("\nmonitoring: {}", MAIL.format(path=password_file)))
    return spec


def _password_file(spec: Path) -> str | None:
    monitoring = load_spec(spec).monitoring
    assert monitoring is not None and monitoring.receivers[0].email is not None
    return monitoring.receivers[0].email.password_file


def test_a_relative_path_is_the_specs_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(tmp_path / "site", "secrets/relay.password")
    monkeypatch.chdir(tmp_path)  # not where the spec is
    assert _password_file(spec) == str(tmp_path / "site" / "secrets" / "relay.password")


@pytest.mark.parametrize(
    "named",
    ["~/.vault-token", "/etc/shadow", "../other/.provision/c/secrets/munge.key", "link/token"],
)
def test_a_file_outside_the_specs_directory_is_refused(tmp_path: Path, named: str) -> None:
    spec = _spec(tmp_path / "site", named)
    (tmp_path / "site" / "link").symlink_to(tmp_path / "elsewhere")  # a link out of it
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    (issue,) = caught.value.issues
    assert issue.path == "monitoring.receivers[0].email.password_file"
    assert issue.message.startswith(f"{named}")
    assert "is outside the directories a spec may name files in" in issue.message
    if named == "link/token":
        assert f"(a link to {tmp_path / 'elsewhere' / 'token'})" in issue.message


def test_a_declared_secrets_directory_is_one_a_spec_may_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vault = tmp_path / "vault"
    spec = _spec(tmp_path / "site", str(vault / "relay.password"))
    monkeypatch.delenv("PROVISION_SECRETS_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    with pytest.raises(SpecError):
        load_spec(spec)
    monkeypatch.setenv("PROVISION_SECRETS_DIR", f"{tmp_path / 'other'}{os.pathsep}{vault}")
    assert _password_file(spec) == str(vault / "relay.password")
    # the default one: ${XDG_CONFIG_HOME:-~/.config}/provision
    monkeypatch.delenv("PROVISION_SECRETS_DIR")
    kept = tmp_path / "config" / "provision" / "relay.password"
    assert _password_file(_spec(tmp_path / "b", str(kept))) == str(kept)


def test_the_cli_refuses_it_in_one_line_before_reading_it(tmp_path: Path) -> None:
    secret = tmp_path / "home-token"
    secret.write_text("s3cr3t-token\n")
    secret.chmod(0o600)
    spec = _spec(tmp_path / "site", str(secret))
    for verb in (["validate"], ["apply", "--state-dir", str(tmp_path / "state")]):
        r = provision(*verb, str(spec), cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
        assert "password_file" in r.stderr and "s3cr3t" not in r.stdout + r.stderr
    assert not (tmp_path / "state").exists()  # nothing copied, nothing made


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> Iterator[type[BaseModel]]:
    if model in seen:
        return
    seen.add(model)
    yield model
    for field in model.model_fields.values():
        for inner in _types_in(field.annotation):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                yield from _models(inner, seen)


def _types_in(annotation: object) -> Iterator[object]:
    yield annotation
    for arg in typing.get_args(annotation):
        yield from _types_in(arg)


def test_every_file_field_of_the_spec_is_checked_as_a_workstation_file() -> None:
    """A path field added later (any `*_file`) must take one of the workstation-file types,
    and every bad spec of one is in tests/data/bad_specs."""
    fields = [
        (model.__name__, name, field)
        for model in _models(Spec, set())
        for name, field in model.model_fields.items()
        if name.endswith("_file")
    ]
    assert {(m, n) for m, n, _ in fields} == {
        ("BmcNetwork", "ca_file"), ("SshAccess", "private_key_file"),
        ("EmailReceiver", "password_file"), ("Identity", "ca_file"),
        ("Identity", "bind_password_file"),
    }  # fmt: skip
    for model, name, field in fields:
        checks = [
            m.func.__qualname__
            for t in _types_in(field.annotation)
            for m in getattr(t, "__metadata__", ())
            if hasattr(m, "func")
        ] + [  # a required field's own Annotated: pydantic keeps its validators here
            m.func.__qualname__ for m in field.metadata if hasattr(m, "func")
        ]
        assert any("_on_workstation" in c for c in checks), (model, name)
        bad = ROOT / "tests" / "data" / "bad_specs"
        assert any(
            f"{name} | " in p.read_text().splitlines()[0]
            and "is outside the directories" in p.read_text()
            for p in bad.glob("*.yaml")
        ), f"no broken spec names {model}.{name} outside its directories"
