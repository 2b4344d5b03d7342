"""Trace-driven simulator: replays request traces through the real cache and pools.

- :mod:`~mamba_radix.sim.traces`: block (Mooncake) and token trace formats, streaming loaders;
- :mod:`~mamba_radix.sim.synthetic`: seeded workloads (chat, shared system prompt, agent loop, tree);
- :mod:`~mamba_radix.sim.ideal`: the infinite-capacity longest-prefix ideal;
- :mod:`~mamba_radix.sim.budget`: per-rank memory budget -> (KV tokens, state slots), via
  :mod:`mamba_radix.capacity`;
- :mod:`~mamba_radix.sim.engine`: the scheduler/engine loop (SGLang's rules, timed and sequential modes);
- :mod:`~mamba_radix.sim.metrics`: per-run metrics and the JSON-lines record;
- :mod:`~mamba_radix.sim.sweep`: one run, parallel sweeps, experiment definitions;
- :mod:`~mamba_radix.sim.report`: markdown tables and PNG plots from results files.

Submodules are imported on demand (the engine pulls in torch and the cache).
"""
