# The two commands of README.md: `make demo` (the main job) and `make test` (every gate).
.PHONY: setup demo test lint typecheck unit integration docs goldens bench clean

VENV := .venv/bin
export PATH := $(CURDIR)/.venv/bin:$(PATH)
SPEC ?= examples/lab.yaml

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh $(SPEC)

test: setup lint typecheck
	$(VENV)/pytest -q

lint: setup
	$(VENV)/ruff check provision tests bench
	$(VENV)/ruff format --check provision
	$(VENV)/yamllint -s .
	$(VENV)/ansible-lint -q

typecheck: setup
	$(VENV)/mypy provision

unit: setup
	$(VENV)/pytest -q --ignore=tests/integration

integration: setup
	PROVISION_REQUIRE_INTEGRATION=1 $(VENV)/pytest -q tests/integration

docs: setup
	@$(VENV)/python scripts/update_readme.py

goldens: setup
	$(VENV)/pytest -q tests/test_render.py -k golden --update-goldens

bench: setup
	$(VENV)/python bench/render.py

clean:
	rm -rf .venv .provision .pytest_cache .mypy_cache .ruff_cache
