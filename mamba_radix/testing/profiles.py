"""Hypothesis profiles for the invariant suite, shipped with it so another project's tests use the same
budgets: ``ci`` (bounded: our whole stateful suite in about 90 s on 2 cores), ``dev`` (a quick local loop)
and ``thorough`` (deep runs, 100,000+ steps in total).

Use, in a ``conftest.py``::

    from mamba_radix.testing.profiles import load_profile
    load_profile()          # the profile named by $MAMBA_RADIX_HYPOTHESIS_PROFILE, default "ci"

Side effects: registers the three profiles with Hypothesis (idempotent) and loads one.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from mamba_radix.errors import ConfigError

__all__ = ["PROFILES", "PROFILE_ENV", "load_profile", "register_profiles"]

PROFILE_ENV = "MAMBA_RADIX_HYPOTHESIS_PROFILE"
PROFILES: tuple[str, ...] = ("ci", "dev", "thorough")

# too_slow: a stateful example is slow by design; data_too_large: 50-100 steps of draws;
# filter_too_much: an engine's known failure discards its example (mamba_radix.testing.known)
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def register_profiles() -> None:
    """Register ``ci``, ``dev`` and ``thorough`` with Hypothesis (re-registering is harmless)."""
    settings.register_profile(
        "ci",
        max_examples=100,
        stateful_step_count=50,
        deadline=None,
        derandomize=True,
        print_blob=True,
        suppress_health_check=_QUIET,
    )
    settings.register_profile(
        "dev",
        max_examples=15,
        stateful_step_count=25,
        deadline=None,
        print_blob=True,
        suppress_health_check=_QUIET,
    )
    settings.register_profile(
        "thorough",
        max_examples=2_000,
        stateful_step_count=100,
        deadline=None,
        print_blob=True,
        suppress_health_check=_QUIET,
    )


def load_profile(name: str | None = None) -> str:
    """Register the profiles and load ``name`` (default: ``$MAMBA_RADIX_HYPOTHESIS_PROFILE`` or ``ci``).
    Returns the name loaded. Raises :class:`~mamba_radix.errors.ConfigError` naming the choices for an unknown name."""
    register_profiles()
    chosen = name or os.environ.get(PROFILE_ENV) or "ci"
    if chosen not in PROFILES:
        raise ConfigError(f"{PROFILE_ENV}={chosen!r} is not a profile; use one of {', '.join(PROFILES)}")
    settings.load_profile(chosen)
    return chosen
