#!/usr/bin/env bash
# The main job on the embedded default. Until the lab provider lands, it validates, renders and
# plans every example spec, which is everything that runs without nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
spec="${1:-examples/lab.yaml}"
P=.venv/bin/provision
for example in examples/*.yaml; do
  $P validate "$example"
done
$P render "$spec"
$P plan "$spec"
