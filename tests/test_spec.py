"""Spec loading: the examples load, every broken spec gives the error line it must."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from provision.errors import SpecError
from provision.spec import Spec, load_spec
from provision.spec.nodes import expand_nodes
from provision.spec.profiles import builtin_profiles
from provision.spec.reference import markdown

from .conftest import EXAMPLES, ROOT, run_provision

BAD = sorted((Path(__file__).parent / "data" / "bad_specs").glob("*.yaml"))
LINE_RE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): (?:(?P<path>[^:]+): )?(?P<msg>.+)$")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_examples_load(example: Path) -> None:
    spec = load_spec(example)
    assert expand_nodes(spec)


def test_lab_is_the_small_default() -> None:
    spec = load_spec(ROOT / "examples" / "lab.yaml")
    nodes = expand_nodes(spec)
    assert [(n.name, n.role, str(n.address)) for n in nodes] == [
        ("head001", "head", "10.77.0.11"),
        ("compute001", "compute", "10.77.0.12"),
        ("compute002", "compute", "10.77.0.13"),
    ]


def test_superpod_shape() -> None:
    spec = load_spec(ROOT / "examples" / "dgx-superpod.yaml")
    nodes = expand_nodes(spec)
    gpu = [n for n in nodes if n.pool == "gpu"]
    assert len(gpu) == 32
    assert (gpu[0].name, str(gpu[0].address), str(gpu[0].bmc_address)) == (
        "gpu001",
        "10.10.1.1",
        "10.11.1.1",
    )
    assert (gpu[-1].name, str(gpu[-1].address)) == ("gpu032", "10.10.1.32")
    assert len([n for n in nodes if n.role == "head"]) == 1


def test_bad_corpus_is_big_enough() -> None:
    assert len(BAD) >= 25


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_spec_reports_expected_issue(path: Path) -> None:
    header = path.read_text().splitlines()[0]
    assert header.startswith("# expect: "), "each broken spec states the error it must produce"
    line, key, fragment = (part.strip() for part in header.removeprefix("# expect: ").split("|"))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    issues = caught.value.issues
    for issue in issues:  # one line each, file first
        assert "\n" not in str(issue)
        assert str(issue).startswith(f"{path}:")
    matches = [i for i in issues if i.line == int(line) and i.path == key and fragment in i.message]
    assert matches, f"expected line {line} {key!r} ~ {fragment!r}, got:\n" + "\n".join(
        str(i) for i in issues
    )


def test_every_issue_line_parses() -> None:
    assert BAD, "no broken spec found"
    for path in BAD:
        with pytest.raises(SpecError) as caught:  # every broken spec is refused
            load_spec(path)
        assert caught.value.issues, path
        for issue in caught.value.issues:
            assert LINE_RE.match(str(issue)), str(issue)


def test_missing_file() -> None:
    with pytest.raises(SpecError) as caught:
        load_spec("/nonexistent/cluster.yaml")
    assert str(caught.value) == "/nonexistent/cluster.yaml: file not found"


def test_all_model_errors_reported_at_once(tmp_path: Path) -> None:
    spec = tmp_path / "many.yaml"
    spec.write_text(
        "name: Bad_Name\nos: windows\nnetwork: {management: {cidr: 10.0.0.0/24}}\n"
        "pools: []\nsecurity: {admin_cidrs: [10.0.0.0/8]}\nfoo: 1\n"
    )
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    got = {(i.line, i.path) for i in caught.value.issues}
    assert {(1, "name"), (2, "os"), (4, "pools"), (6, "foo")} <= got


def test_json_schema_is_complete() -> None:
    schema = Spec.model_json_schema()
    json.dumps(schema)
    assert schema["additionalProperties"] is False
    assert {"name", "os", "network", "pools", "security"} <= set(schema["required"])
    pool = schema["$defs"]["Pool"]
    assert pool["additionalProperties"] is False
    assert "elastic" in pool["properties"]


REQUIRED_PROFILES = {
    "dgx-h100",
    "dgx-h200",
    "dgx-a100",
    "hgx-h100-8gpu",
    "l40s-pcie",
    "cpu-node",
    "lab-container",
    "aws-p5.48xlarge",
    "aws-p4d.24xlarge",
    "gcp-a3-highgpu-8g",
    "gcp-a2-highgpu-8g",
    "azure-nd-h100-v5",
    "azure-nd-a100-v4",
}


def test_profile_catalogue() -> None:
    profiles = builtin_profiles()
    assert set(profiles) >= REQUIRED_PROFILES
    for name, prof in profiles.items():
        cloud = set(prof.providers) & {"aws", "gcp", "azure"}
        if cloud:
            assert prof.instance_type and prof.price, name
            assert prof.price.source.startswith("https://"), name
    assert profiles["aws-p5.48xlarge"].hcas[0].count == 32  # EFA interfaces
    assert profiles["aws-p4d.24xlarge"].hcas[0].count == 4
    assert profiles["dgx-h100"].gpu is not None and profiles["dgx-h100"].gpu.nvswitch


def test_the_spec_reference_is_current() -> None:
    page = (ROOT / "docs" / "spec.md").read_text()
    start = page.index("<!-- spec-reference:start -->") + len("<!-- spec-reference:start -->\n")
    end = page.index("<!-- spec-reference:end -->")
    assert page[start:end] == markdown(), "run `make docs` to regenerate the spec reference"


def test_gpu_nodes_without_health_checks_are_a_warning_not_an_error(tmp_path: Path) -> None:
    superpod = ROOT / "examples" / "dgx-superpod.yaml"
    warnings: list[object] = []
    load_spec(superpod, warnings=warnings)
    assert [str(w) for w in warnings] == [
        f"{superpod}:40: pools[2].profile: GPU pool(s) gpu, mig without health checks: a node "
        "whose GPU or fabric port fails keeps taking jobs until drained by hand; add "
        "`health: {}` (Slurm drains it, naming the failure)"
    ]
    checked = tmp_path / "checked.yaml"
    checked.write_text(superpod.read_text() + "health: {}\n")
    load_spec(checked, warnings=(none := []))
    assert none == []
    load_spec(ROOT / "examples" / "lab.yaml", warnings=(lab := []))
    assert lab == []  # no GPU
    load_spec(ROOT / "examples" / "k8s.yaml", warnings=(k8s := []))
    assert k8s == []  # health checks are Slurm's


def test_validate_says_a_warning_on_stderr_and_succeeds(tmp_path: Path) -> None:
    spec = ROOT / "examples" / "roce.yaml"
    done = run_provision("validate", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{spec}: valid: cluster 'roce'")
    assert done.stderr.startswith(f"warning: {spec}:26: pools[1].profile: GPU pool(s) gpu ")
    assert done.stderr.count("\n") == 1
