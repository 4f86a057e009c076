#!/usr/bin/env bash
# The Molecule scenarios. With scenario names: those, one after another. Without: all of them in
# two lanes side by side (each scenario has its own containers, network and addresses): about
# 40% less wall time than one after the other on 2 cores.
# Each scenario's log is .molecule-<scenario>.log; a failure's tail is printed, and the exit code
# is 1 if any scenario failed.
set -uo pipefail
# The collection's strategy, as apply runs the roles (plugins/strategy/lean.py): Mitogen's linear,
# through `podman exec` (mitogen_podman)
export ANSIBLE_STRATEGY=gpu_provision.cluster.lean
# and, as apply, facts only under ansible_facts (provision/run/ansible.cfg)
export ANSIBLE_INJECT_FACT_VARS=false
lane() {
  local failed=0
  for s in "$@"; do
    start=$(date +%s)
    if molecule test -s "$s" > ".molecule-$s.log" 2>&1; then
      echo "molecule: $s passed in $(( $(date +%s) - start ))s:" \
        "$(grep -h 'SCENARIO RECAP' -A1 ".molecule-$s.log" | tail -1 | xargs)"
    else
      tail -60 ".molecule-$s.log"
      echo "molecule: $s FAILED in $(( $(date +%s) - start ))s (full log: .molecule-$s.log)"
      failed=1
    fi
  done
  return "$failed"
}
if [ "$#" -gt 0 ]; then
  lane "$@"
  exit
fi
# the longest first in each lane; measured side by side under Mitogen in CI (s): kubernetes
# 624, nvidia 190, common 89 | slurm 551, storage 144, fabric 150: 934 s in all with common in
# the second lane (1,642 s under Ansible's own strategy). munge's and the firewall's checks run
# in the slurm and kubernetes scenarios
lane kubernetes nvidia common & a=$!
lane slurm storage fabric & b=$!
status=0
wait "$a" || status=1
wait "$b" || status=1
exit "$status"
