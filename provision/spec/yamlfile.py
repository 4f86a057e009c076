"""YAML reading that keeps line numbers, refuses duplicate keys and names the file on errors."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from provision.errors import Issue, SpecError


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    return yaml


# What a spec may ask of the parser. A 10,000-node cluster written with `count:` is a few KiB;
# 1 MiB holds some 20,000 explicit `hosts:` entries.
MAX_BYTES = 1024 * 1024
MAX_DEPTH = 32
MAX_NODES = 200_000  # values after every alias is expanded (a "billion laughs" stops here)


def read_yaml(path: Path, display: str | None = None) -> Any:
    """Parse a YAML file into ruamel's round-trip nodes, which carry their line numbers."""
    name = display or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise SpecError(
                [
                    Issue(
                        name, None, "", f"{size:,} bytes is more than a spec may be ({MAX_BYTES:,})"
                    )
                ]
            )
        with path.open(encoding="utf-8") as fh:
            text = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise SpecError([Issue(name, None, "", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([Issue(name, None, "", f"cannot read: {exc}")]) from None
    if len(text) > MAX_BYTES:  # a file that grew, or one with no size (a pipe)
        raise SpecError([Issue(name, None, "", f"more than a spec may be ({MAX_BYTES:,} bytes)")])
    _check_shape(text, name)
    try:
        doc = _yaml().load(text)
    except DuplicateKeyError as exc:
        mark = exc.problem_mark
        key = (exc.problem or "").split('"')[1] if '"' in (exc.problem or "") else "?"
        line = mark.line + 1 if mark else None
        raise SpecError(
            [Issue(name, line, key, "duplicate key: keep one of the two entries")]
        ) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = exc.problem or exc.context or "invalid YAML"
        raise SpecError([Issue(name, line, "", f"YAML syntax error: {what}")]) from None
    except YAMLError as exc:
        raise SpecError([Issue(name, None, "", f"YAML syntax error: {exc}")]) from None
    except RecursionError:
        raise SpecError([Issue(name, None, "", f"nested deeper than {MAX_DEPTH} levels")]) from None
    if doc is None:
        raise SpecError([Issue(name, None, "", "the file is empty")])
    return doc


def _check_shape(text: str, name: str) -> None:
    """Refuse, before the (slow, recursive) round-trip parser runs, a document nested too deep
    or one whose aliases expand past MAX_NODES values. libyaml's event stream is flat and fast,
    and its syntax errors name their line as the round-trip parser's do."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    sizes: dict[str, int] = {}  # anchor -> values under it, aliases expanded
    open_: list[list[Any]] = []  # [anchor, values so far, line] per open collection
    expanded = 0
    try:
        for event in yaml.parse(text, Loader=loader):
            line = event.start_mark.line + 1 if event.start_mark else None
            if isinstance(event, yaml.CollectionStartEvent):
                open_.append([event.anchor, 1, line])
                expanded += 1
                if len(open_) > MAX_DEPTH:
                    raise SpecError(
                        [Issue(name, line, "", f"nested deeper than {MAX_DEPTH} levels")]
                    )
                continue
            if isinstance(event, yaml.CollectionEndEvent):
                anchor, count, _ = open_.pop()
            elif isinstance(event, yaml.ScalarEvent):
                anchor, count = event.anchor, 1
                expanded += 1
            elif isinstance(event, yaml.AliasEvent):
                anchor, count = None, sizes.get(event.anchor or "", 1)
                expanded += count
            else:
                continue
            if anchor:
                sizes[anchor] = count
            if open_:
                open_[-1][1] += count
            if expanded > MAX_NODES:
                raise SpecError(
                    [
                        Issue(
                            name,
                            line,
                            "",
                            f"its aliases expand to more than {MAX_NODES:,} values: "
                            "write the values out, or use fewer aliases",
                        )
                    ]
                )
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "invalid YAML"
        raise SpecError(
            [Issue(name, mark.line + 1 if mark else None, "", f"YAML syntax error: {what}")]
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError([Issue(name, None, "", f"YAML syntax error: {exc}")]) from None


def plain(node: Any) -> Any:
    """Round-trip nodes to plain dicts, lists and scalars (what pydantic should see)."""
    if isinstance(node, CommentedMap):
        return {str(k): plain(v) for k, v in node.items()}
    if isinstance(node, CommentedSeq):
        return [plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def locate(doc: Any, loc: Sequence[str | int]) -> tuple[int | None, list[str | int]]:
    """Follow a key path into the parsed document.

    Returns the line of the deepest element found and the part of the path that exists in the
    document (pydantic adds type tags like 'function-after[...]' to its paths; those are
    dropped). A missing last key points at the line of its parent.
    """
    node = doc
    line: int | None = getattr(getattr(doc, "lc", None), "line", None)
    line = line + 1 if line is not None else None
    found: list[str | int] = []
    for part in loc:
        if isinstance(node, CommentedMap) and part in node:
            line = node.lc.key(part)[0] + 1
            node = node[part]
            found.append(part)
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
            line = node.lc.item(part)[0] + 1
            node = node[part]
            found.append(part)
        elif isinstance(part, str) and "[" not in part and isinstance(node, CommentedMap):
            # a key that should be there but is not: name it, keep the parent's line
            found.append(part)
            break
    return line, found


def format_path(parts: Sequence[str | int]) -> str:
    """('pools', 2, 'count') -> 'pools[2].count'"""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*", part):
            out += ("." if out else "") + part
        else:  # a key the spec made up (slurm.config, profiles): quoted, on one line
            out += f"[{part!r}]"
    return out
