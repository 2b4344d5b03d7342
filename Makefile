# The two commands of the README: `make experiment` (the main job) and `make test` (the whole suite).
# Each one sets itself up first (scripts/bootstrap.sh is idempotent).
PY := .venv/bin/python

.PHONY: setup experiment test lint bench clean

setup:
	@bash scripts/bootstrap.sh

# Writes a new folder under experiments/results/ (git-ignored); the committed reference results are in
# experiments/reference/default/, and the report compares its numbers with them.
experiment: setup
	$(PY) -m mamba_radix.cli experiment --results-dir experiments/results

test: setup
	$(PY) -m pytest -q

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: setup
	$(PY) benchmarks/bench_pools.py
	$(PY) benchmarks/bench_tree.py
	$(PY) benchmarks/bench_sim.py --limit 2000
	$(PY) benchmarks/bench_kernels.py --dry-run

clean:
	rm -rf .venv .pytest_cache .hypothesis
