"""provision: build, run and verify GPU clusters from one declarative spec."""

from pathlib import Path

__version__ = "0.1.0"

# The checkout that holds playbooks/, roles/ and templates/ beside this package.
REPO_ROOT = Path(__file__).resolve().parent.parent
