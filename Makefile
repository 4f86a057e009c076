# The two commands of README.md: `make demo` (the main job) and `make test` (every gate).
.PHONY: setup demo test lint typecheck unit integration molecule image docs goldens bench clean \
	constraints wheel collection

VENV := .venv/bin
export PATH := $(CURDIR)/.venv/bin:$(PATH)
# podman settings for lab nodes and Molecule (runc, ulimits this host allows)
export CONTAINERS_CONF := $(CURDIR)/provision/providers/lab/containers.conf
SPEC ?= examples/lab.yaml

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh $(SPEC)

# lint, the type check and the lab image side by side (each waits on nothing of the others)
test: setup
	@$(MAKE) --no-print-directory -j3 lint typecheck image
	@scripts/test-lanes.sh

lint: setup
	$(VENV)/ruff check provision tests bench scripts
	$(VENV)/ruff format --check provision tests bench scripts
	$(VENV)/yamllint -s .
	$(VENV)/ansible-lint -q
	NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs build --strict

typecheck: setup
	$(VENV)/mypy provision

unit: setup
	$(VENV)/pytest -q --ignore=tests/integration

integration: setup
	PROVISION_REQUIRE_INTEGRATION=1 $(VENV)/pytest -q tests/integration

image: setup
	@$(VENV)/python -m provision.providers.lab

molecule: setup image
	@scripts/molecule.sh

docs: setup
	@$(VENV)/python scripts/update_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs build --strict

goldens: setup
	$(VENV)/pytest -q tests/test_render.py tests/test_nvidia_sources.py tests/test_nvidia_tasks.py \
	  tests/test_fabric_roles.py -k golden --update-goldens

constraints: setup
	@{ echo "# Exact versions the tests were last run with: scripts/setup.sh installs with -c this file."; \
	   echo "# Refresh after a deliberate upgrade: make constraints"; \
	   $(VENV)/pip freeze --exclude-editable | grep -v '^-e\|^gpu-provision' | LC_ALL=C sort -f; } > constraints.txt

wheel: setup
	$(VENV)/python -m pip wheel -q --no-deps -w dist .

collection: setup
	$(VENV)/ansible-galaxy collection build --force --output-path dist .

bench: setup image
	$(VENV)/python bench/render.py
	$(VENV)/python bench/render.py --kubernetes
	$(VENV)/python bench/apply.py
	$(VENV)/python bench/burst.py
	$(VENV)/python bench/burst_aws.py
	$(VENV)/python bench/scale.py
	$(VENV)/python bench/failover.py
	$(VENV)/python bench/monitoring.py
	$(VENV)/python bench/faults.py
	$(VENV)/python bench/users.py
	$(VENV)/python bench/metal.py
	$(VENV)/python bench/gpu_image.py

clean:
	rm -rf .venv .provision .pytest_cache .mypy_cache .ruff_cache .ansible dist .site .molecule-*.log
