"""A YAML document validated against a model, every problem on one line with its file, line
and key (the spec's, a profile file's)."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from provision.errors import Issue, SpecError
from provision.spec.yamlfile import format_path, locate, plain

M = TypeVar("M", bound=BaseModel)


def validate_document(
    doc: Any, model: type[M], file: str, context: dict[str, Any] | None = None
) -> M:
    """`context`: what validators may ask (spec_dir, for the workstation's files)."""
    if not isinstance(doc, dict):
        raise SpecError([Issue(file, 1, "", "the top level must be a mapping of keys to values")])
    try:
        return model.model_validate(plain(doc), context=context)
    except ValidationError as exc:
        issues = [_issue_from_error(doc, file, model, err) for err in exc.errors()]
        raise SpecError(_dedupe(issues)) from None


def issue_at(doc: Any, file: str, loc: Sequence[str | int], message: str) -> Issue:
    line, found = locate(doc, loc)
    return Issue(file, line, format_path(found) or format_path(loc), message)


def _dedupe(issues: list[Issue]) -> list[Issue]:
    seen: set[tuple[int | None, str]] = set()
    out = []
    for issue in issues:
        # a value failing every member of a union yields one error per member: keep the first
        key = (issue.line, issue.path)
        if key not in seen:
            seen.add(key)
            out.append(issue)
    return out


def _issue_from_error(doc: Any, file: str, model: type[BaseModel], err: ErrorDetails) -> Issue:
    loc = list(err["loc"])
    line, found = locate(doc, loc)
    path = format_path(found) or format_path([p for p in loc if "[" not in str(p)])
    return Issue(file, line, path, _describe(err, model, found))


def _describe(err: ErrorDetails, root: type[BaseModel], found: list[str | int]) -> str:
    kind = err["type"]
    got = err.get("input")
    if kind == "missing":
        field = str(found[-1]) if found else "?"
        parent = _model_at(root, found[:-1])
        desc = ""
        if parent is not None and field in parent.model_fields:
            desc = parent.model_fields[field].description or ""
        return f"required key '{field}' is missing: add it" + (f" ({desc})" if desc else "")
    if kind == "extra_forbidden":
        key = str(found[-1]) if found else "?"
        parent = _model_at(root, found[:-1])
        allowed = sorted(parent.model_fields) if parent is not None else []
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "allowed keys: " + ", ".join(allowed)
        return f"unknown key '{key}': remove it or fix the spelling; {hint}"
    if kind == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"{got!r} is not allowed: use one of {expected}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"{got!r} is not a whole number: write digits only, like 4"
    if kind in ("bool_parsing", "bool_type"):
        return f"{got!r} is not a boolean: write true or false"
    if kind in ("string_type",):
        return f"{got!r} is not text: quote it"
    if kind in ("list_type",):
        return "expected a list (YAML '- item' lines or [a, b])"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "expected a mapping of keys to values"
    if kind.startswith("ip_v4"):
        hint = ""
        if kind == "ip_v4_network" and isinstance(got, str) and "/" in got:
            try:
                import ipaddress

                hint = f"; did you mean {ipaddress.ip_network(got, strict=False)}?"
            except ValueError:
                pass
        what = "network like 10.0.0.0/24" if "network" in kind else "address like 10.0.0.5"
        return f"{got!r} is not an IPv4 {what}{hint}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return f"{got!r}: {err['msg'].lower()}"
    if kind in ("too_short", "too_long"):
        return f"{err['msg'].lower()}"
    return f"{err['msg']} (got {got!r})"


def _model_at(root: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class that describes the mapping at `path` (for listing allowed keys)."""
    current: Any = root
    for part in path:
        if isinstance(part, int):
            current = _unwrap(current, list)
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            current = _unwrap(current, dict)
            continue
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = _unwrap(field.annotation, None)
    current = _unwrap(current, None)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any, container: type | None) -> Any:
    """Strip Optional/Annotated and, when asked, one list or dict level from an annotation."""
    for _ in range(6):
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin is typing.Annotated:
            annotation = args[0]
        elif origin in (typing.Union, types.UnionType):
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            containers = [a for a in args if typing.get_origin(a) in (list, dict)]
            annotation = (models or containers or [a for a in args if a is not type(None)])[0]
        elif container is list and origin is list:
            return args[0]
        elif container is dict and origin is dict:
            return args[1]
        else:
            return annotation
    return annotation
