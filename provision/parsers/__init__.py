"""Parsers of the tools' output (nvidia-smi, ibstat, sinfo, stat, ...), standard library only.

`provision verify` runs them on the workstation over SSH output; the health checks run them on
the nodes themselves (provision.health, from this project's wheel), and scripts/*-check.py on a
bare host: nothing here may import beyond the standard library.
"""
