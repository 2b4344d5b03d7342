"""Trace-driven simulator: replays request traces through the real cache and pools.

- :mod:`~mamba_radix.sim.traces`: block (Mooncake) and token trace formats, streaming loaders;
- :mod:`~mamba_radix.sim.synthetic`: seeded workloads (chat, shared system prompt, agent loop, tree);
- :mod:`~mamba_radix.sim.ideal`: the infinite-capacity longest-prefix ideal;
- :mod:`~mamba_radix.sim.budget`: per-rank memory budget -> (KV tokens, state slots), via
  :mod:`mamba_radix.capacity`;
- :mod:`~mamba_radix.sim.engine`: the scheduler/engine loop (SGLang's rules, timed and sequential modes);
- :mod:`~mamba_radix.sim.metrics`: per-run metrics and the JSON-lines record;
- :mod:`~mamba_radix.sim.sweep`: one run, sweeps (local processes or Ray), experiment definitions;
- :mod:`~mamba_radix.sim.ray_backend`: each run of a sweep as a Ray task (the ``[ray]`` extra);
- :mod:`~mamba_radix.sim.progress`: progress in requests across runs (rate, ETA; lines off a terminal);
- :mod:`~mamba_radix.sim.report`: markdown tables, PNG plots (the ``[experiments]`` extra) and the
  comparison with reference results, from results files.

Submodules are imported on demand (the engine pulls in torch and the cache).
"""
