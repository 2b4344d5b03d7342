"""Keyword sets that make each synthetic generator's workload small (a dozen requests, a few hundred
tokens each): for tests that replay every generator under tight pools."""

from __future__ import annotations

from typing import Any

SMALL_SYNTHETIC: dict[str, dict[str, Any]] = {
    "chat": {"num_sessions": 3, "turns": 3, "system_prompt_len": 80, "user_len": 30, "output_len": 40},
    "system-prompt": {"num_requests": 12, "prompt_len": 120, "user_len": 20, "output_len": 10},
    "agent": {"num_agents": 2, "steps": 4, "context_len": 300, "observation_len": 50, "action_len": 20},
    "tree": {"num_trees": 1, "depth": 2, "fanout": 2, "root_len": 90, "segment_len": 30, "output_len": 12},
}
