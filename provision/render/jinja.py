"""The renderer's Jinja environment: templates/ beside this module, strict about undefined
names, never autoescaped (the files are configuration, not HTML). Only the renderer's own values
reach a template; spec text arrives as data (see yamldata)."""

from __future__ import annotations

from typing import Any

import jinja2

from provision.assets import templates_dir

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(templates_dir())),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


def template(name: str, **context: Any) -> str:
    return _ENV.get_template(name).render(**context)
