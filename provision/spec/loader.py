"""Load a cluster spec: read, validate, cross-check, reporting every problem on one line each."""

from __future__ import annotations

from pathlib import Path

from provision.errors import Issue, SpecError
from provision.spec.checks import check_spec
from provision.spec.checks.advice import advise
from provision.spec.models import Spec
from provision.spec.unbuilt import check_unbuilt
from provision.spec.validation import issue_at, validate_document
from provision.spec.yamlfile import read_yaml


def load_spec(
    path: Path | str, *, unbuilt: bool = False, warnings: list[Issue] | None = None
) -> Spec:
    """Read, validate and cross-check a cluster spec. Raises SpecError listing every issue.

    Fields whose feature is not built yet are refused unless `unbuilt` (tests of the parts
    written so far; see spec/unbuilt.py). With `warnings`, what is legal but unwise
    (spec/checks/advice.py) is added to it, each located as an error would be."""
    path = Path(path)
    doc = read_yaml(path)
    spec = validate_document(doc, Spec, str(path), {"spec_dir": path.absolute().parent})
    problems = ([] if unbuilt else check_unbuilt(spec)) + check_spec(spec)
    if problems:
        raise SpecError([issue_at(doc, str(path), loc, msg) for loc, msg in problems])
    if warnings is not None:
        warnings += [issue_at(doc, str(path), loc, msg) for loc, msg in advise(spec)]
    return spec
