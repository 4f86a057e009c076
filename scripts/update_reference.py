"""Regenerate the spec reference between the markers in docs/spec.md from the models."""

from __future__ import annotations

from pathlib import Path

from provision.spec.reference import markdown

PAGE = Path(__file__).resolve().parent.parent / "docs" / "spec.md"
START, END = "<!-- spec-reference:start -->\n", "<!-- spec-reference:end -->"

text = PAGE.read_text()
head, rest = text.split(START, 1)
_, tail = rest.split(END, 1)
PAGE.write_text(head + START + markdown() + END + tail)
print(f"updated the spec reference in docs/{PAGE.name}")
