"""What each role of site.yml reads, from the collection's own text: the fingerprint of a node
is kept per role (converged.py), so that a change converges the roles it reaches alone.

Read once per collection, not declared by hand (a table would go stale the first time a role
read something new), and over-counted on purpose: a role's variables are every word of its
files (and of its condition in site.yml) that names a variable of the inventory, so a comment
that names one only makes the role run more often, never less. For each role:

- its files (with those of the roles it includes, and the defaults of the roles whose
  variables it reads);
- the words of those files and of its condition in site.yml (the variables it may read);
- the rendered files it reads under provision_files_dir (a pool's or a node's where the path
  names provision_pool or inventory_hostname; a folder is everything under it);
- the secrets it reads under provision_secrets_dir (a name with `{{ }}` in it is a pattern);
- whether it installs this package's wheel (the nodes' programs are this package's code);
- whether it reads the inventory's groups or other hosts (groups, hostvars, the play's hosts);
- the plays it is in (their hosts patterns); site.yml tags each role with its name, which is
  what a run of that role alone names.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provision import assets

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FILES = re.compile(r"provision_files_dir\s*\}\}((?:/(?:[\w.\-]|\{\{\s*\w+\s*\}\})*)+)")
# the expression form (nccl's default): provision_files_dir ~ '/nccl/' ~ provision_pool ~ '.conf'
_FILES_EXPR = re.compile(
    r"provision_files_dir\s*~\s*'([^']*)'\s*~\s*(provision_pool|inventory_hostname)"
    r"\s*~\s*'([^']*)'"
)
_SECRETS = re.compile(r"provision_secrets_dir\s*\}\}/((?:[\w.\-]|\{\{[^}]*\}\})+)")
_INCLUDES = re.compile(
    r"(?:include_role|import_role):\s*\n\s*name:\s*[\"']?(?:gpu_provision\.cluster\.)?(\w+)"
)
_PLACE = {"provision_pool": "{pool}", "inventory_hostname": "{host}"}
# how a role reads the inventory's groups or other nodes' variables
_INVENTORY = re.compile(r"\bgroups\s*[\[.]|\bhostvars\b|\bansible_play_(?:hosts|batch)")
_ALL = re.compile(r"""\bgroups\s*(?:\[\s*['"]all['"]\s*\]|\.all\b)""")


@dataclass(frozen=True)
class Role:
    name: str
    digest: str  # of its files and those it draws on
    words: frozenset[str]
    files: tuple[str, ...]  # rendered paths ("{pool}", "{host}" in them), a file or a folder
    secrets: tuple[str, ...]  # fnmatch patterns, relative to the secrets folder
    wheel: bool
    inventory: bool  # reads groups, hostvars or the play's hosts
    everyone: bool  # reads groups['all']
    hosts: tuple[str, ...]  # the hosts patterns of the plays it is in

    def reads_file(self, path: str, pool: str, members: Iterable[str]) -> bool:
        """Whether the role reads this rendered file on the nodes of this pool."""
        for pattern in self.files:
            if "{host}" in pattern:
                if any(_under(path, pattern.format(pool=pool, host=h)) for h in members):
                    return True
            elif _under(path, pattern.format(pool=pool, host="")):
                return True
        return False

    def claims_file(self, path: str) -> bool:
        """Whether the role reads this rendered file on some node."""
        return any(
            fnmatch.fnmatchcase(path, p.format(pool="*", host="*"))
            or path.startswith(p.format(pool="*", host="*") + "/")
            for p in self.files
        )

    def reads_secret(self, name: str) -> bool:
        return any(
            fnmatch.fnmatchcase(name, p) or name.startswith(p.rstrip("/") + "/")
            for p in self.secrets
        )


def _under(path: str, pattern: str) -> bool:
    """The file itself (a pattern where the path named another variable), or in the folder."""
    return fnmatch.fnmatchcase(path, pattern) or path.startswith(pattern + "/")


def words(text: str) -> set[str]:
    return set(_WORD.findall(text))


def _texts(directory: Path) -> list[tuple[str, str]]:
    return [
        (str(p.relative_to(directory.parent)), p.read_text(encoding="utf-8", errors="replace"))
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and "molecule" not in p.parts
    ]


def _defaults(text: str) -> set[str]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return set()
    return {str(k) for k in doc} if isinstance(doc, dict) else set()


@functools.lru_cache(maxsize=2)
def _site(root: Path) -> dict[str, tuple[list[str], list[str], str]]:
    """Role -> (its tags, its plays' hosts patterns, the text of its conditions) in site.yml."""
    found: dict[str, tuple[list[str], list[str], str]] = {}
    plays = yaml.safe_load((root / "playbooks" / "site.yml").read_text(encoding="utf-8")) or []
    for play in plays:
        entries = [(str(r["role"]), r) for r in play.get("roles") or [] if isinstance(r, dict)]
        for task in play.get("tasks") or []:
            if not isinstance(task, dict):
                continue
            include = task.get("ansible.builtin.include_role") or task.get(
                "ansible.builtin.import_role"
            )
            if isinstance(include, dict):
                entries.append((str(include["name"]), task))
        for qualified, entry in entries:
            name = qualified.rsplit(".", 1)[-1]
            tags, hosts, when = found.setdefault(name, ([], [], ""))
            tags += [t for t in entry.get("tags") or [] if t not in tags]
            if play["hosts"] not in hosts:
                hosts.append(str(play["hosts"]))
            found[name] = (tags, hosts, when + "\n" + str(entry.get("when", "")))
    return found


@functools.lru_cache(maxsize=2)
def _catalog(root: Path) -> dict[str, Role]:
    roles_dir = root / "roles"
    texts = {d.name: _texts(d) for d in sorted(roles_dir.iterdir()) if d.is_dir()}
    defaults = {
        name: _defaults((roles_dir / name / "defaults" / "main.yml").read_text(encoding="utf-8"))
        if (roles_dir / name / "defaults" / "main.yml").is_file()
        else set()
        for name in texts
    }
    site = _site(root)
    catalog = {}
    for name, (_tags, hosts, when) in site.items():
        if name not in texts:
            continue
        # the roles it includes, and theirs
        drawn, todo = [name], [name]
        while todo:
            for _, text in texts[todo.pop()]:
                for other in _INCLUDES.findall(text):
                    if other in texts and other not in drawn:
                        drawn.append(other)
                        todo.append(other)
        parts = [t for r in drawn for t in texts[r]]
        said = words("\n".join(text for _, text in parts) + "\n" + when)
        # another role's defaults it reads (its defaults are in the play where it runs first)
        for other, names in defaults.items():
            if other not in drawn and names & said:
                path = roles_dir / other / "defaults" / "main.yml"
                text = path.read_text(encoding="utf-8")
                parts.append((str(path.relative_to(roles_dir)), text))
                said |= words(text)
        h = hashlib.sha256()
        for label, text in parts:
            data = text.encode()
            h.update(f"{label} {len(data)}\n".encode())
            h.update(data)
        h.update(f"site.yml when {when}\n".encode())
        # what it reads by path: its own files' and those it includes (a borrowed default is
        # read by the role it belongs to)
        body = "\n".join(text for r in drawn for _, text in texts[r])
        files = {_placed(p) for p in _FILES.findall(body)}
        files |= {f"{a}{_PLACE[which]}{b}" for a, which, b in _FILES_EXPR.findall(body)}
        secrets = {re.sub(r"\{\{[^}]*\}\}", "*", s) for s in _SECRETS.findall(body)}
        catalog[name] = Role(
            name,
            h.hexdigest(),
            frozenset(said),
            tuple(sorted(f"files{p}" for p in files)),
            tuple(sorted(secrets)),
            "provision_wheel" in said,
            bool(_INVENTORY.search(body + when)),
            bool(_ALL.search(body + when)),
            tuple(hosts),
        )
    return catalog


def _placed(path: str) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: _PLACE.get(m.group(1), "*"), path)


def catalog() -> dict[str, Role]:
    """Each role site.yml runs, by name, as the installed collection has it."""
    return _catalog(assets.collection_dir())


def hosts_in(
    pattern: str, groups: Mapping[str, Iterable[str]], everyone: Iterable[str]
) -> set[str]:
    """The hosts of a play's pattern (a:b union, a:&b intersection, a:!b exclusion)."""
    chosen: set[str] = set()
    for term in pattern.split(":"):
        op, name = (term[0], term[1:]) if term[:1] in ("&", "!") else ("", term)
        members = set(everyone) if name in ("all", "*") else set(groups.get(name, ()))
        if op == "&":
            chosen &= members
        elif op == "!":
            chosen -= members
        else:
            chosen |= members
    return chosen


def value_words(value: Any) -> set[str]:
    """The words of a value's templates: the variables it may read."""
    text = value if isinstance(value, str) else repr(value)
    return words(text) if "{{" in text or "{%" in text else set()
