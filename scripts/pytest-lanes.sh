#!/usr/bin/env bash
# The tests in two lanes side by side: the unit tests (CPU-bound, about 3 minutes) beside the
# integration tests (about 28 minutes, mostly waiting on lab nodes and Slurm), which no unit test
# shares anything with (no podman, no lab network). The integration tests print as they run; the
# unit tests' output follows them. Exit 1 if either lane failed.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
.venv/bin/pytest -q -p no:cacheprovider --durations=10 --ignore=tests/integration > "$log" 2>&1 &
unit=$!
.venv/bin/pytest -q --durations=25 tests/integration
integration=$?
wait "$unit"
units=$?
echo "--- the unit tests, run beside the integration tests (exit $units) ---"
cat "$log"
# pytest's 5: nothing collected (no integration test here): not a failure of this lane
[ "$integration" -eq 5 ] && integration=0
exit $(( integration != 0 || units != 0 ))
