"""``mamba-radix plan``: the capacity planner, mounted from :mod:`mamba_radix.capacity.cli`.

Sizes the full-KV and state pools of a hybrid model as SGLang does and recommends a split of the GPU
memory between KV and state slots; ``python -m mamba_radix.capacity.cli`` runs the same planner alone.
"""

from __future__ import annotations

import argparse
from typing import Any

from mamba_radix.cli._common import add_command

EXAMPLES = """examples:
  mamba-radix plan --model kimi-k3 --memory-budget-gb 27.25
  mamba-radix plan --model kimi-k3 --memory-budget-gb 27.25 --input-len 12000 --output-len 300
  mamba-radix plan --model qwen3-next-80b-a3b --gpu-memory-gb 80 --weights-gb 40 --tp-size 2"""


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = add_command(
        sub,
        "plan",
        help="capacity planner: split GPU memory between KV and state slots",
        description="Size the full-KV and state pools of a hybrid model as SGLang does, and recommend a split.",
        examples=EXAMPLES,
    )
    from mamba_radix.capacity.cli import add_plan_arguments

    add_plan_arguments(p)


def run(args: argparse.Namespace) -> int:
    from mamba_radix.capacity.cli import run_plan

    return run_plan(args)
