#!/usr/bin/env bash
# pytest (unit and integration) and the Molecule lanes side by side: each has its own
# containers, networks and addresses, and most of their time is spent waiting on containers,
# so three streams on 2 cores take less wall time than pytest, then Molecule.
# Molecule's per-scenario logs are .molecule-<scenario>.log; exit 1 if either part failed.
set -uo pipefail
start=$(date +%s)
.venv/bin/pytest -q & pytest=$!
scripts/molecule.sh & molecule=$!
status=0
wait "$pytest" || { echo "test: pytest FAILED"; status=1; }
wait "$molecule" || { echo "test: molecule FAILED"; status=1; }
echo "test: pytest and Molecule done in $(( $(date +%s) - start ))s"
exit "$status"
