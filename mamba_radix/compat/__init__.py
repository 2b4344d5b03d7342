"""Other engines' call forms mapped onto the core (DESIGN.md §2): :mod:`mamba_radix.compat.sglang`.

A compat module maps names, constructor forms, parameter objects and ownership conventions; it never
reimplements the cache. It sits above the core (it imports the cache, the lifecycle and the pools) and
below nothing: no core module imports it.
"""
