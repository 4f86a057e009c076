"""Every spec value is data: never more than one line, never a template Ansible would run.

The fields come from the model, not from a list kept by hand: a text field added later is
changed here too, and tests/data/untrusted/every-field.yaml must give it a value.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel
from ruamel.yaml import YAML
from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

from provision.cluster import Cluster
from provision.errors import SpecError
from provision.render import render, write_render
from provision.render.yamldata import Template, _quoted, _resolves_to_other_type, yaml_value
from provision.spec import load_spec
from provision.spec.models import Spec

from .conftest import EXAMPLES, ROOT, load_rendered

EVERY_FIELD = ROOT / "tests" / "data" / "untrusted" / "every-field.yaml"
# the Kubernetes settings, which a Slurm cluster's spec cannot hold
EVERY_FIELD_K8S = ROOT / "tests" / "data" / "untrusted" / "every-field-k8s.yaml"
# each head's tunnel endpoint, which a spec of one head cannot hold
EVERY_FIELD_HA = ROOT / "tests" / "data" / "untrusted" / "every-field-ha.yaml"
# what each of the other files is for: the fields under these (every-field.yaml has the rest)
ONLY = {EVERY_FIELD_K8S: ("kubernetes",), EVERY_FIELD_HA: ("network", "tunnel", "endpoints")}
ANY_ITEM = "[*]"
ANY_KEY = "{key}"
ANY_VALUE = "{*}"
BREAKS = ("\nAuthType=auth/none", "\r\nInclude /tmp/x", "\u2028allow all", "\x00", "\x1b[2J")

Path_ = tuple[str, ...]


def text_fields(model: type[BaseModel], at: Path_ = ()) -> Iterator[Path_]:
    """Every place in the model that takes free text: (field, '[*]', '{key}', ...) paths."""
    for name, field in model.model_fields.items():
        yield from _text_in(field.annotation, (*at, name))


def _text_in(annotation: object, at: Path_) -> Iterator[Path_]:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        yield from _text_in(args[0], at)
    elif origin in (typing.Union, types.UnionType):
        found = {p for a in args for p in _text_in(a, at)}
        yield from sorted(found)
    elif origin is list:
        yield from _text_in(args[0], (*at, ANY_ITEM))
    elif origin is dict:
        yield from _text_in(args[0], (*at, ANY_KEY))
        yield from _text_in(args[1], (*at, ANY_VALUE))
    elif annotation is str:
        yield at
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield from text_fields(annotation, at)


def places(doc: object, path: Path_, at: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Concrete places in a document for an abstract path; a key place ends in ('{key}', key)."""
    if not path:
        return [at]
    head, rest = path[0], path[1:]
    if head == ANY_ITEM and isinstance(doc, list):
        return [p for i, item in enumerate(doc) for p in places(item, rest, (*at, i))]
    if head == ANY_KEY and isinstance(doc, dict):
        return [(*at, ANY_KEY, k) for k in doc]
    if head == ANY_VALUE and isinstance(doc, dict):
        return [p for k, v in doc.items() for p in places(v, rest, (*at, k))]
    if isinstance(doc, dict) and head in doc:
        return places(doc[head], rest, (*at, head))
    return []


def get(doc: object, place: tuple[object, ...]) -> str:
    if place[-2:-1] == (ANY_KEY,):
        return str(place[-1])
    for part in place:
        doc = doc[part]  # type: ignore[index]
    return str(doc)


def changed(doc: object, place: tuple[object, ...], value: str) -> object:
    """A copy of the document with the value (or the key) at `place` replaced."""
    new = copy.deepcopy(doc)
    parent = new
    key_place = place[-2:-1] == (ANY_KEY,)
    steps = place[:-2] if key_place else place[:-1]
    for part in steps:
        parent = parent[part]  # type: ignore[index]
    if key_place:
        assert isinstance(parent, dict)
        parent[value] = parent.pop(place[-1])
    else:
        parent[place[-1]] = value  # type: ignore[index]
    return new


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.width = 4096
    return yaml


def _write(doc: object, path: Path) -> Path:
    with path.open("w") as fh:
        _yaml().dump(doc, fh)
    ca = path.with_name("directory-ca.pem")  # what every-field.yaml's identity names beside it
    if not ca.exists():
        ca.write_bytes((EVERY_FIELD.parent / ca.name).read_bytes())
    return path


def _every_place(source: Path = EVERY_FIELD) -> list[tuple[Path_, tuple[object, ...]]]:
    doc = _yaml().load(source.read_text())
    out = []
    for field in text_fields(Spec):
        prefix = ONLY.get(source)
        if prefix is not None and field[: len(prefix)] != prefix:
            continue  # every-field.yaml has the rest
        found = places(doc, field)
        out.extend((field, p) for p in found[:1])
    return out


def _all_places() -> list[tuple[Path, Path_, tuple[object, ...]]]:
    return [(s, f, p) for s in (EVERY_FIELD, *ONLY) for f, p in _every_place(s)]


def test_the_model_has_text_fields_and_every_field_spec_sets_each() -> None:
    doc = _yaml().load(EVERY_FIELD.read_text())
    fields = list(text_fields(Spec))
    assert ("network", "management", "domain") in fields
    assert ("security", "admins", ANY_ITEM, "ssh_keys", ANY_ITEM) in fields
    assert ("slurm", "config", ANY_KEY) in fields
    others = [_yaml().load(path.read_text()) for path in ONLY]
    missing = [
        ".".join(f)
        for f in fields
        if not places(doc, f) and not any(places(other, f) for other in others)
    ]
    assert not missing, f"give these fields a value in {EVERY_FIELD.name}: {missing}"


@pytest.mark.parametrize(
    ("source", "field", "place"),
    _all_places(),
    ids=lambda v: v.stem if isinstance(v, Path) else ".".join(map(str, v)),
)
def test_a_line_break_in_any_text_field_is_refused_on_one_line(
    source: Path, field: Path_, place: tuple[object, ...], tmp_path: Path
) -> None:
    doc = _yaml().load(source.read_text())
    good = get(doc, place)
    for n, tail in enumerate(BREAKS):
        spec = _write(changed(doc, place, good + tail), tmp_path / f"s{n}.yaml")
        with pytest.raises(SpecError) as caught:
            load_spec(spec, unbuilt=True)
        assert caught.value.issues, place
        for issue in caught.value.issues:
            assert "\n" not in str(issue) and "\r" not in str(issue)
            assert issue.line is not None, str(issue)


def test_the_cli_refuses_a_line_break_with_exit_2_and_one_line(tmp_path: Path) -> None:
    doc = _yaml().load(EVERY_FIELD.read_text())
    # without the fields the command line refuses as not supported yet (one line each)
    del doc["storage"], doc["software"]["slurm"], doc["pools"][2]["elastic"], doc["pools"][4]
    spec = _write(
        changed(doc, ("slurm", "config", ANY_KEY, "SchedulerType"), "SchedulerType\nAuthType"),
        tmp_path / "spec.yaml",
    )
    done = subprocess.run(
        [sys.executable, "-m", "provision", "validate", str(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "spec.yaml:8: slurm.config" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_templates_in_any_text_field_are_refused_or_stay_data(tmp_path: Path) -> None:
    """Each field gets a template that would run a command; whatever the spec accepts is
    rendered, and Ansible templating every variable of every host runs nothing."""
    doc = _yaml().load(EVERY_FIELD.read_text())
    accepted: list[str] = []
    combined = doc
    for n, (field, place) in enumerate(_every_place()):
        marker = tmp_path / f"ran-{n}"
        payload = "{{ lookup('pipe', 'touch " + str(marker) + "') }}"
        good = get(doc, place)
        for value in (payload, f"{good} {payload}", f"{good}{{{{ 7 * 7 }}}}"):
            try:
                load_spec(_write(changed(doc, place, value), tmp_path / "one.yaml"), unbuilt=True)
            except SpecError:
                continue
            combined = changed(combined, place, value)
            accepted.append(".".join(field))
            break
    # free text (key comments, models, descriptions, local paths) is accepted: as data
    assert "security.admins.[*].ssh_keys.[*]" in accepted
    # the Kubernetes settings' text (an exact release) and the heads' endpoints (host names)
    # take no template at all
    for source in ONLY:
        other = _yaml().load(source.read_text())
        for n, (_field, place) in enumerate(_every_place(source)):
            payload = "{{ lookup('pipe', 'touch " + str(tmp_path / f"k8s-{n}") + "') }}"
            for value in (payload, f"{get(other, place)} {payload}"):
                with pytest.raises(SpecError):
                    path = _write(changed(other, place, value), tmp_path / "one.yaml")
                    load_spec(path, unbuilt=True)
    spec = load_spec(_write(combined, tmp_path / "combined.yaml"), unbuilt=True)
    out = tmp_path / "build"
    files = render(Cluster(spec))
    write_render(files, out)
    ansible = Path(sys.executable).parent / "ansible"
    done = subprocess.run(
        [
            str(ansible),
            "all",
            "-i",
            str(out / "inventory" / "hosts.yml"),
            "-e",
            "ansible_connection=local",
            "-m",
            "ansible.builtin.debug",
            "-a",
            "msg={{ hostvars[inventory_hostname] | to_json }}",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "alice@example.org {{ lookup" in done.stdout  # the comment came through, as text
    assert not list(tmp_path.glob("ran-*")), "a spec value was run as a template"
    assert "49" not in "".join(v for v in files.values() if "{{ 7 * 7 }}" in v)


def _value_scalars(node: object, in_value: bool = True) -> Iterator[ScalarNode]:
    if isinstance(node, ScalarNode):
        if in_value:
            yield node
    elif isinstance(node, MappingNode):
        for key, value in node.value:
            yield from _value_scalars(key, False)
            yield from _value_scalars(value, True)
    elif isinstance(node, SequenceNode):
        for item in node.value:
            yield from _value_scalars(item, True)


@pytest.mark.parametrize("example", [*EXAMPLES, EVERY_FIELD, *ONLY], ids=lambda p: p.stem)
def test_every_rendered_string_is_unsafe_but_the_renderers_own_templates(example: Path) -> None:
    every = example in (EVERY_FIELD, *ONLY)
    files = render(Cluster(load_spec(example, unbuilt=every)))
    for rel in ("inventory/hosts.yml", "inventory/group_vars/all.yml"):
        root = YAML(typ="rt").compose(files[rel])
        scalars = list(_value_scalars(root))
        assert scalars, f"{rel}: no value to check"
        for scalar in scalars:
            if getattr(scalar.tag, "value", scalar.tag) == "!unsafe":
                continue
            if scalar.style == '"':  # quoted, untagged: the renderer's own template, or a
                # string YAML would type otherwise (no '{' in it: nothing to template)
                assert scalar.value == "{{ inventory_dir }}/../files" or (
                    "{" not in scalar.value and _resolves_to_other_type(scalar.value)
                ), (rel, scalar.value)
            else:  # plain: numbers, booleans and nothing else
                assert scalar.value in ("true", "false", "null", "") or scalar.value.isdigit(), (
                    rel,
                    scalar.value,
                )


def test_yaml_value_keeps_every_string_on_one_line_and_unsafe() -> None:
    nasty = 'a\nb\u2028c\x85d"e\\f{{ x }}'
    text = yaml_value({"k\n": [nasty, 1, True, None, Template("{{ t }}")]})
    assert "\n" not in text and "\u2028" not in text and "\x85" not in text
    assert text.count("!unsafe") == 2
    loaded = load_rendered("v: " + text)
    assert loaded == {"v": {"k\n": [nasty, 1, True, None, "{{ t }}"]}}


def _malformed() -> dict[str, str]:
    laughs = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        laughs.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return {
        "laughs": "\n".join(laughs) + "\n",
        "deep-flow": "name: " + "[" * 5000 + "]" * 5000 + "\n",
        "deep-flow-40": "name: " + "[" * 40 + "]" * 40 + "\n",
        "deep-block": "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v: 1\n",
        "unclosed": "name: " + "{a: " * 20000 + "\n",
        "huge": "name: x\npools:\n" + "  - name: p\n" * 200_000,
    }


@pytest.mark.parametrize("kind", list(_malformed()))
def test_malformed_yaml_is_refused_quickly_with_exit_2(kind: str, tmp_path: Path) -> None:
    spec = tmp_path / f"{kind}.yaml"
    spec.write_text(_malformed()[kind])
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert len(caught.value.issues) == 1
    message = str(caught.value.issues[0])
    assert any(
        w in message
        for w in ("nested deeper", "expand to more", "more than a spec", "YAML syntax error")
    ), message


def test_malformed_yaml_from_the_cli(tmp_path: Path) -> None:
    spec = tmp_path / "laughs.yaml"
    spec.write_text(_malformed()["laughs"])
    done = subprocess.run(
        [sys.executable, "-m", "provision", "validate", str(spec)],
        capture_output=True,
        text=True,
        check=False,
        timeout=20,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


def test_addresses_past_the_last_ipv4_address_are_a_spec_error(tmp_path: Path) -> None:
    doc = _yaml().load((ROOT / "examples" / "dgx-superpod.yaml").read_text())
    doc["pools"][2]["first_address"] = "255.255.255.250"
    with pytest.raises(SpecError) as caught:
        load_spec(_write(doc, tmp_path / "spec.yaml"))
    assert any("run past 255.255.255.255" in str(i) for i in caught.value.issues)


def test_render_into_a_file_is_a_usage_error(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep me\n")
    done = subprocess.run(
        [sys.executable, "-m", "provision", "render", "--out", str(target)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr
    assert "is a file" in done.stderr and target.read_text() == "keep me\n"


@pytest.mark.parametrize("name", ["../victim", "/tmp/victim-abs", "sub/../../victim"])
def test_a_manifest_naming_paths_outside_its_tree_is_refused(name: str, tmp_path: Path) -> None:
    import json

    from provision.errors import UsageError
    from provision.render import MANIFEST, read_render

    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "build"
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps({"files": {name: "0" * 64}}))
    files = render(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))
    with pytest.raises(UsageError, match="outside"):
        write_render(files, out)
    with pytest.raises(UsageError, match="outside"):
        read_render(out)
    assert victim.read_text() == "keep me\n"


@pytest.mark.parametrize(
    "text",
    [
        "535",
        "12.4",
        "550.90.07",
        "true",
        "no",
        "null",
        "~",
        "10.0.0.1",
        "2026-01-01",
        "1:20",
        "0x1F",
        ".inf",
        "",
        "{{ x }}",
        "12.4 {{ x }}",
        "{% if %}",
        "a\nb",
    ],
)
def test_ansible_reads_every_rendered_string_back_as_the_same_string(text: str) -> None:
    """`!unsafe` must not change a value's type: Ansible resolves a tagged scalar as if plain."""
    from ansible.parsing.yaml.loader import AnsibleLoader

    loaded = AnsibleLoader("k: " + yaml_value(text)).get_single_data()["k"]
    assert isinstance(loaded, str) and loaded == text
    if "{" in text:
        assert yaml_value(text).startswith("!unsafe ")


def test_the_renderers_shortcuts_resolve_as_pyyaml_does() -> None:
    """yaml_value decides without PyYAML's resolver for strings starting with a character no
    pattern is filed under, and for dotted digits, and quotes printable ASCII without JSON:
    each such answer is the resolver's, each quoted string JSON's."""
    import json
    import random
    import string

    import yaml

    resolver = yaml.resolver.Resolver()
    rng = random.Random(7)
    samples = [
        "10.0.0.1", "10.64.0.0/14", "550.90.07", "1.2", "1.2.3", "1.2.3e5", "1_0.2.3", "0.0.0.0",
        "12:30.5.1", "1.2.3-4", "gpu00001", "head", "", " 1.2.3", "+1.2.3", "1..2", "1.2.",
    ]  # fmt: skip
    for _ in range(3000):
        alphabet = rng.choice([string.digits + ".", string.digits + "./:-_eE+", string.printable])
        samples.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))))
    for text in samples:
        tag = resolver.resolve(yaml.ScalarNode, text, (True, False))
        assert _resolves_to_other_type(text) == (tag != "tag:yaml.org,2002:str"), text
        assert _quoted(text) == json.dumps(text, ensure_ascii=False) or not text.isprintable()
