"""Regenerate the spec reference between the markers in README.md from the models."""

from __future__ import annotations

from pathlib import Path

from provision.spec.reference import markdown

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- spec-reference:start -->\n", "<!-- spec-reference:end -->"

text = README.read_text()
head, rest = text.split(START, 1)
_, tail = rest.split(END, 1)
README.write_text(head + START + markdown() + END + tail)
print(f"updated the spec reference in {README.name}")
