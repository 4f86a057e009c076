"""Action for gpu_provision.cluster.files: each entry's content read or rendered on the
controller, as ansible.builtin.copy and template do, then one module run on the node for the
whole list. An entry whose `when` is false is left out (the list stays one literal in the task).

An entry's `source` is a file found as copy finds its `src` (the role's files/, or a path), read
as text; its `template` is a template found and rendered as the template action renders one
(the task's variables with `ansible_managed` and the template_* names, blocks trimmed, the
role's templates/ searched for includes). Either becomes the entry's `content`.
"""

from __future__ import annotations

import os
from typing import Any

from ansible._internal._templating import _template_vars
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template

MODULE = "gpu_provision.cluster.files"


class ActionModule(ActionBase):  # type: ignore[misc]
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset({"paths", "owner", "group"})

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result: dict[str, Any] = super().run(tmp, task_vars)
        paths = self._task.args.get("paths")
        if not isinstance(paths, list) or not all(isinstance(e, dict) for e in paths):
            raise AnsibleActionFail("paths must be a list of entries (dictionaries)")
        entries = []
        for entry in paths:
            entry = dict(entry)
            try:
                if not boolean(entry.pop("when", True), strict=True):
                    continue
            except TypeError:
                raise AnsibleActionFail(f"{entry.get('path')}: when is not true or false") from None
            given = [key for key in ("content", "source", "template") if key in entry]
            if len(given) > 1:
                raise AnsibleActionFail(f"{entry.get('path')}: {' and '.join(given)}: name one")
            try:
                if "source" in entry:
                    found = self._find_needle("files", str(entry.pop("source")))
                    entry["content"] = self._loader.get_text_file_contents(found)
                elif "template" in entry:
                    name = str(entry.pop("template"))
                    found = self._find_needle("templates", name)
                    entry["content"] = self._render(name, found, str(entry.get("path")), task_vars)
            except AnsibleError as error:
                raise AnsibleActionFail(f"{entry.get('path')}: {error.message}") from None
            entries.append(entry)
        args = {**self._task.args, "paths": entries}
        try:
            result.update(self._execute_module(MODULE, module_args=args, task_vars=task_vars))
        finally:  # the node's temporary directory, where a connection without pipelining made one
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _render(self, name: str, source: str, dest: str, task_vars: dict[str, Any]) -> str:
        """The template as ansible.builtin.template renders it with its defaults."""
        searchpath = list(task_vars.get("ansible_search_path", []))
        searchpath.extend([self._loader._basedir, os.path.dirname(source)])
        searchpath = [p for base in searchpath for p in (os.path.join(base, "templates"), base)]
        variables = task_vars.copy()
        variables.update(
            _template_vars.generate_ansible_template_vars(
                path=name,
                fullpath=source,
                dest_path=dest,
                include_ansible_managed="ansible_managed" not in variables,
            )
        )
        templar = self._templar.copy_with_new_env(
            searchpath=searchpath, available_variables=variables
        )
        text = templar.template(
            trust_as_template(self._loader.get_text_file_contents(source)),
            escape_backslashes=False,
            overrides={"trim_blocks": True},
        )
        return "" if text is None else str(text)
