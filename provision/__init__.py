"""provision: build, run and verify GPU clusters from one declarative spec."""

__version__ = "0.1.0"
