#!/usr/bin/env bash
# Every test in two lanes side by side, so that both cores work throughout: the unit tests are
# CPU-bound, the integration tests mostly wait on lab nodes and Slurm, Molecule's scenarios are
# Ansible runs. No two of them share containers, networks or addresses (each integration file
# and each scenario has its own).
#   lane 1: the unit tests, the bursting, two-head, VM storage and Kubernetes lab tests, then
#           all six Molecule scenarios (kubernetes, nvidia, common, slurm, storage, fabric)
#   lane 2: the lab, static-host, lab image and metal lab tests
# Each line is printed as it comes, marked with its lane's part; every part runs even after
# another failed, and the exit code is 1 if any did.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
PYTEST=(.venv/bin/pytest -q -p no:cacheprovider)
INTEGRATION_1=(tests/integration/test_burst.py tests/integration/test_ha.py
  tests/integration/test_vm_storage.py tests/integration/test_k8s_lab.py)
INTEGRATION_2=(tests/integration/test_lab.py tests/integration/test_static_apply.py
  tests/integration/test_lab_image_live.py tests/integration/test_metal.py)

# an integration file in no lane would never run: refuse to start without it in one
for file in tests/integration/test_*.py; do
  case " ${INTEGRATION_1[*]} ${INTEGRATION_2[*]} " in
    *" $file "*) ;;
    *) echo "scripts/test-lanes.sh: $file is in no lane: add it to INTEGRATION_1 or _2"; exit 1 ;;
  esac
done

mark() { sed -u "s/^/[$1] /"; }

part() {  # part NAME COMMAND...: run it, mark its lines, say how it ended and how long it took
  local name=$1 start rc
  shift
  start=$(date +%s)
  "$@" 2>&1 | mark "$name"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 5 ] && rc=0  # pytest's 5: nothing collected here, not a failure
  echo "[$name] exit $rc after $(( $(date +%s) - start ))s"
  return "$rc"
}

lane1() {
  local failed=0
  part unit "${PYTEST[@]}" --durations=10 --ignore=tests/integration || failed=1
  part integration-1 "${PYTEST[@]}" --durations=10 "${INTEGRATION_1[@]}" || failed=1
  part molecule scripts/molecule.sh kubernetes nvidia common slurm storage fabric || failed=1
  return "$failed"
}

lane2() {
  local failed=0
  part integration-2 "${PYTEST[@]}" --durations=15 "${INTEGRATION_2[@]}" || failed=1
  return "$failed"
}

lane1 & one=$!
lane2 & two=$!
status=0
wait "$one" || status=1
wait "$two" || status=1
exit "$status"
