"""The one way a value reaches Ansible: YAML that Ansible can never template.

Every string the renderer writes into the inventory or group_vars is tagged `!unsafe`, so
Ansible treats it as data, never as a Jinja template, whatever a spec put in it (a string YAML
would read as a number, boolean or null stays a plain quoted string: the tag would change its
type, and such a string has no '{' to template). A renderer that
means a template says so with `Template(...)`; nothing else is ever templated. Values are written
in flow style from JSON's escaping, so a string is always one YAML scalar on one line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

import yaml

from provision.errors import NOT_ONE_LINE


class Template(str):
    """A string the renderer itself wrote as a Jinja template (never a spec value)."""


# Characters YAML would read as a line break or refuses in a stream (JSON leaves some as they
# are), and lone surrogates, which no UTF-8 file can hold.
_ESCAPE = re.compile(f"{NOT_ONE_LINE.pattern}|[\ud800-\udfff]")


def _quoted(text: str) -> str:
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'  # what JSON writes for it, in a tenth of the time
    quoted = json.dumps(text, ensure_ascii=False)
    if not _ESCAPE.search(quoted):
        return quoted
    return _ESCAPE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


_RESOLVER = yaml.resolver.Resolver()
_STR = "tag:yaml.org,2002:str"
# The resolver tries the patterns filed under a scalar's first character (and those for any
# character, and the path resolvers: PyYAML has none): a string starting with no such character
# is a string, without the call (a 10,000-node inventory writes 90,000 strings)
_STARTS = frozenset(k for k in _RESOLVER.yaml_implicit_resolvers if k)
_ONLY_BY_START = None not in _RESOLVER.yaml_implicit_resolvers and not _RESOLVER.yaml_path_resolvers
# and digits with two dots or more (addresses, networks, versions) are strings too: YAML 1.1's
# numbers have one dot at most, its timestamps dashes
_DOTTED = re.compile(r"[0-9]+(?:\.[0-9]+){2,}(?:/[0-9]+)?")


def _resolves_to_other_type(text: str) -> bool:
    """What Ansible's `!unsafe` constructor does: resolve the scalar's type as if it were plain
    (YAML 1.1's rules, PyYAML's resolver, which Ansible uses)."""
    if _ONLY_BY_START and text and (text[0] not in _STARTS or _DOTTED.fullmatch(text)):
        return False
    tag: str = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    return tag != _STR


def yaml_value(value: object) -> str:
    """One YAML flow value: strings `!unsafe`, Template strings plain, containers recursively."""
    if isinstance(value, Template):
        return _quoted(str(value))
    if isinstance(value, str):
        if _resolves_to_other_type(value):
            # `!unsafe` makes Ansible read the scalar as if plain ("12.4" -> 12.4): such a
            # string stays quoted and plain; it holds no '{', so it cannot be a template
            return _quoted(value)
        return "!unsafe " + _quoted(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, Mapping):
        items = (f"{yaml_value(str(k))}: {yaml_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    raise TypeError(f"no YAML form for {type(value).__name__}")


def yaml_mapping(values: Mapping[str, object], indent: int = 0) -> str:
    """`key: value` lines for variable names the renderer chose (identifiers, never spec data)."""
    pad = " " * indent
    lines = []
    for key, value in values.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{key!r} is not a variable name")
        lines.append(f"{pad}{key}: {yaml_value(value)}\n")
    return "".join(lines)
