#!/usr/bin/python
"""Ansible module: a node's directories, files and links from one list, in one module run.

ansible.builtin.copy and template check each file in two module runs (a stat with the file's
checksum, then the file module for its owner and mode), ansible.builtin.file a directory in one,
and a loop runs them for every item: on this machine 7 to 9 ms of the controller's CPU a file
and host where nothing changes, whether a task each or a loop. The roles deliver a node's
rendered and templated files through this instead: its action reads each file and renders each
template on the controller, as those actions do, and one module run on the node compares,
writes and sets owners and modes for the whole list.

Text content only (a binary file, a large one: ansible.builtin.copy, which sends it only when
its checksum differs). A file is written whole or not at all: a temporary file beside it with
its owner and mode already set, checked by `validate` where given, then renamed over it.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import tempfile
from typing import Any

DOCUMENTATION = r"""
module: files
short_description: Directories, files and links from one list, in one module run
description:
  - Each entry of O(paths), in order, made as it says where it differs (a directory, created
    with any missing parents, a file with this content, or a symbolic link), then given its
    owner, group and mode.
  - A file is written to a temporary file in its directory, given its owner and mode, checked
    with O(paths[].validate) where set, and renamed over the old one. Its directory must exist
    (an earlier entry can make it).
  - Changed when any entry changed; C(paths) says which.
options:
  paths:
    description: What to make, in order.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: The absolute path.
        type: path
        required: true
      state:
        description: What it is.
        type: str
        choices: [file, directory, link]
        default: file
      content:
        description: A file's whole content (text).
        type: str
      source:
        description: >-
          A file on the controller whose text is the content, found as ansible.builtin.copy
          finds its src (the role's files/, or a path); read by the module's action.
        type: str
      template:
        description: >-
          A template on the controller rendered into the content as ansible.builtin.template
          renders one (the role's templates/); rendered by the module's action.
        type: str
      when:
        description: Where false, the entry is left out.
        type: bool
        default: true
      src:
        description: A link's target, as the link holds it.
        type: str
      owner:
        description: Its owner (a name); the module's O(owner) where not set.
        type: str
      group:
        description: Its group (a name); the module's O(group) where not set.
        type: str
      mode:
        description: Its mode (octal, a string); a new file gets 0644 and a new directory 0755.
        type: raw
      validate:
        description: A command that checks a new file before it replaces the old, C(%s) its path.
        type: str
  owner:
    description: The owner of entries that name none.
    type: str
  group:
    description: The group of entries that name none.
    type: str
author: provision
"""

EXAMPLES = r"""
- name: Install the rendered Slurm configuration
  gpu_provision.cluster.files:
    owner: root
    group: root
    paths:
      - {path: /etc/slurm, state: directory, mode: "0755"}
      - {path: /etc/slurm/slurm.conf, source: "{{ slurm_files_dir }}/slurm.conf", mode: "0644"}
      - {path: /etc/slurm/oci.conf, template: oci.conf.j2, mode: "0644"}
      - {path: /etc/slurm/plugstack.conf, content: "", when: "{{ pyxis | bool }}"}
  notify: Restart slurm daemons
"""

RETURN = r"""
paths:
  description: >-
    Each entry's path and whether it changed, in order; a file's also its content's SHA-1
    (C(checksum)), as ansible.builtin.copy returns it.
  type: list
  elements: dict
  returned: always
"""


class Refused(Exception):
    """An entry this module cannot make: the task fails naming it."""


def _ids(owner: str | None, group: str | None) -> tuple[int, int]:
    try:
        uid = pwd.getpwnam(owner).pw_uid if owner else -1
    except KeyError:
        raise Refused(f"no user {owner} on this node") from None
    try:
        gid = grp.getgrnam(group).gr_gid if group else -1
    except KeyError:
        raise Refused(f"no group {group} on this node") from None
    return uid, gid


def _mode(value: Any, default: int) -> int:
    if value is None or value == "":
        return default
    if isinstance(value, int):
        return value
    try:
        return int(str(value), 8)
    except ValueError:
        raise Refused(f"mode {value!r} is not octal") from None


def _asked_mode(entry: dict[str, Any]) -> int | None:
    """The mode the entry asks for; None where it names none."""
    value = entry.get("mode")
    return None if value is None or value == "" else _mode(value, 0)


def _attributes(path: str, uid: int, gid: int, mode: int | None, check: bool) -> bool:
    """Owner, group and mode (None: leave it) as asked; whether any differed."""
    st = os.lstat(path)
    changed = False
    if (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid):
        changed = True
        if not check:
            os.lchown(path, uid, gid)
    if mode is not None and (st.st_mode & 0o7777) != mode:
        changed = True
        if not check:
            os.chmod(path, mode)
    return changed


def _directory(entry: dict[str, Any], uid: int, gid: int, check: bool) -> bool:
    path = entry["path"]
    mode = _mode(entry.get("mode"), 0o755)
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isdir(path)):
        raise Refused("exists and is not a directory")
    if not os.path.isdir(path):
        if check:
            return True
        # another node may make it at the same moment on a shared file system (two heads'
        # Slurm state on its NFS or lab volume)
        os.makedirs(path, mode=0o755, exist_ok=True)
        _attributes(path, uid, gid, mode, check)
        return True
    return _attributes(path, uid, gid, _asked_mode(entry), check)


def _link(entry: dict[str, Any], uid: int, gid: int, check: bool) -> bool:
    path, src = entry["path"], entry.get("src")
    if not src:
        raise Refused("a link needs src")
    if os.path.islink(path) and os.readlink(path) == src:
        return _attributes(path, uid, gid, None, check)
    if os.path.isdir(path) and not os.path.islink(path):
        raise Refused("is a directory")
    if check:
        return True
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.provision")
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(src, temporary)
    if uid != -1 or gid != -1:
        os.lchown(temporary, uid, gid)
    os.replace(temporary, path)
    return True


def _file(module: Any, entry: dict[str, Any], uid: int, gid: int, check: bool) -> bool:
    path, content = entry["path"], entry.get("content")
    if content is None:
        raise Refused("a file needs content")
    data = content.encode("utf-8")
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
        raise Refused("exists and is not a regular file")
    if os.path.isfile(path) and os.path.getsize(path) == len(data):
        with open(path, "rb") as current:
            if current.read() == data:
                return _attributes(path, uid, gid, _asked_mode(entry), check)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise Refused(f"its directory {directory} does not exist")
    if check:
        return True
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        mode = _mode(entry.get("mode"), 0o644)
        os.chown(temporary, uid, gid)
        os.chmod(temporary, mode)
        if entry.get("validate"):
            command = entry["validate"]
            if "%s" not in command:
                raise Refused("validate must name the file as %s")
            rc, out, err = module.run_command(command % temporary)
            if rc != 0:
                raise Refused(f"failed its check ({command}): {(err or out).strip()}")
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    module.set_default_selinux_context(path, False)
    return True


def make(module: Any, paths: list[dict[str, Any]], owner: str | None, group: str | None,
         check: bool) -> list[dict[str, Any]]:  # fmt: skip
    """Each entry made in order; the list of what changed. Refused names the entry."""
    done = []
    for entry in paths:
        if entry.get("when") is False:
            continue
        path = entry["path"]
        try:
            if entry.get("source") is not None or entry.get("template") is not None:
                raise Refused("source and template are read on the controller, by the action")
            if not os.path.isabs(path):
                raise Refused("is not an absolute path")
            uid, gid = _ids(entry.get("owner") or owner, entry.get("group") or group)
            state = entry.get("state") or "file"
            if state == "directory":
                changed = _directory(entry, uid, gid, check)
            elif state == "link":
                changed = _link(entry, uid, gid, check)
            else:
                changed = _file(module, entry, uid, gid, check)
        except Refused as refusal:
            raise Refused(f"{path}: {refusal}") from None
        except OSError as error:
            raise Refused(f"{path}: {error.strerror or error}") from None
        result = {"path": path, "changed": changed}
        if state not in ("directory", "link"):
            # as copy and template return it: provision's record of what the roles left on the
            # node (converged.py) probes for drift with it
            result["checksum"] = hashlib.sha1(entry["content"].encode("utf-8")).hexdigest()
        done.append(result)
    return done


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    class Module(AnsibleModule):  # type: ignore[misc]
        def _log_invocation(self) -> None:
            """The node's journal gets the paths, not every file's content ("Invoked with ..."
            and the whole list, as AnsibleModule logs a module's arguments)."""
            paths = " ".join(str(e.get("path")) for e in self.params.get("paths") or [])
            self.log(f"Invoked with paths {paths}")

    entry = {
        "path": {"type": "path", "required": True},
        "state": {"type": "str", "choices": ["file", "directory", "link"], "default": "file"},
        "content": {"type": "str"},
        "source": {"type": "str"},
        "template": {"type": "str"},
        "when": {"type": "bool", "default": True},
        "src": {"type": "str"},
        "owner": {"type": "str"},
        "group": {"type": "str"},
        "mode": {"type": "raw"},
        "validate": {"type": "str"},
    }
    module = Module(
        argument_spec={
            "paths": {"type": "list", "elements": "dict", "required": True, "options": entry},
            "owner": {"type": "str"},
            "group": {"type": "str"},
        },
        supports_check_mode=True,
    )
    params = module.params
    # the invocation Ansible returns would repeat every file's content in the result, the run's
    # events and their record: the paths alone (a task with secrets in a file sets no_log)
    invocation = {"module_args": {"paths": [{"path": e["path"]} for e in params["paths"]]}}
    try:
        done = make(module, params["paths"], params["owner"], params["group"], module.check_mode)
    except Refused as refusal:
        module.fail_json(msg=str(refusal), invocation=invocation)
    module.exit_json(changed=any(d["changed"] for d in done), paths=done, invocation=invocation)


if __name__ == "__main__":
    main()
