# The two commands of the README: `make experiment` (the main job) and `make test` (the whole suite).
# Each one sets itself up first (scripts/bootstrap.sh is idempotent).
PY := .venv/bin/python

.PHONY: setup experiment reference test lint docs bench clean

setup:
	@bash scripts/bootstrap.sh

# The main job, the policy comparison (the bundled definition `default`): every registered policy, the
# offline oracle, the infinite-capacity line and the ideal, token hit rate against memory where state slots
# bind and where KV binds, on 2,000 Mooncake conversation requests and four synthetic workloads; about 400
# CPU-seconds of runs (211 s measured on 2 idle cores), one progress bar in requests. Writes a new folder
# experiments/results/default-<UTC time>/ (git-ignored); the report compares its numbers with the committed
# reference (experiments/reference/default/). The former default, SGLang's knobs one at a time in timed
# mode, is `mamba-radix experiment --definition sglang-knobs` (reference: experiments/reference/sglang-knobs/).
#
# Then the tier dimension (the bundled definition `host_tier`, issue 25): SGLang's write policies with the host
# pools at 0, 4x and 10x the device pools, SGLang's HiCache against our placement and split at equal bytes, and
# the tier-aware oracle; 134 runs, 86 s on 2 quiet cores (212 s on busy ones), into experiments/results/host_tier-<UTC time>/,
# its report compared with experiments/reference/host_tier/.
experiment: setup
	$(PY) -m mamba_radix.cli experiment --results-dir experiments/results --jobs 2
	$(PY) -m mamba_radix.cli experiment --definition host_tier --results-dir experiments/results --jobs 2

# Re-run the main job into experiments/reference/default/ (replacing it) and refresh the bundled
# mamba_radix/data/experiments/default.reference.jsonl; commit both.
reference: setup
	$(PY) experiments/policies.py --update-reference

# one pytest worker per core; worksteal rebalances when a worker is left with the long mutation controls
test: setup
	$(PY) -m pytest -q -n auto --dist worksteal

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports --no-cache

# The documentation site (mkdocs.yml, docs/) into site/ (git-ignored); --strict fails on any warning, a
# broken link or a page missing from the nav included.
docs: setup
	$(PY) -m mkdocs build --strict --site-dir site

bench: setup
	$(PY) benchmarks/bench_pools.py
	$(PY) benchmarks/bench_tree.py
	$(PY) benchmarks/bench_sim.py --limit 2000
	$(PY) benchmarks/bench_kernels.py --dry-run

# The release stress of the request lifecycle (docs/stress.md): 1,000,000 seeded operations over 43
# configurations and tiny pools, misuses included; exit 1 with a replay command on the first violation.
# About 15 minutes on 2 shared cores. `$(PY) benchmarks/stress_lifecycle.py --quick` is a smoke test.
.PHONY: stress
stress: setup
	$(PY) benchmarks/stress_lifecycle.py

clean:
	rm -rf .venv .pytest_cache .hypothesis
