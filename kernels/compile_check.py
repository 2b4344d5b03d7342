"""Compile the slot-move kernel for a GPU target on a machine without a GPU, and inspect the code.

``triton.compile`` runs the whole pipeline (TTIR -> TTGIR -> LLVM IR -> PTX -> cubin with the bundled
ptxas) without a driver. That catches what the CPU interpreter cannot: whether the accesses are 16-byte
vectors (``ld.global.v4`` / ``st.global.v4``), whether the address arithmetic is 64-bit (``arith.muli ... :
i64`` in TTIR), and whether ptxas accepts the code. See ``shared/reference/kernels.md`` §1.4.

The JIT specialises each launch on its arguments: pointers 16-byte aligned and integers divisible by 16 get
a ``tt.divisibility`` attribute, and that attribute is what lets the compiler emit vector accesses. This
module reproduces that specialisation from concrete shapes so the check compiles what a real launch of
:func:`mamba_radix_kernels.slot_move.move_slots_triton` would compile.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .slot_move import DEFAULT_BLOCK, DEFAULT_NUM_WARPS, MAX_TENSORS_PER_LAUNCH, triton_next_pow2

__all__ = ["STANDARD_CASES", "CompiledSlotMove", "compile_in_subprocess", "compile_slot_move", "summarize"]

_PTR_TYPE = {1: "*u8", 2: "*i16", 4: "*i32", 8: "*i64"}


@dataclass(frozen=True)
class CompiledSlotMove:
    """What one compile produced: the assembly texts and a few counts read from them."""

    ttir: str
    ptx: str
    block: int
    num_warps: int

    @property
    def i64_multiplies(self) -> int:
        """``arith.muli`` ops on i64 in TTIR: the 64-bit (layer, slot) x stride products."""
        return len(re.findall(r"arith\.muli .*: i64", self.ttir))

    @property
    def v4_loads(self) -> int:
        """16-byte vector loads (``ld.global....v4.b32``) in PTX."""
        return len(re.findall(r"ld\.global(?:\.[a-z0-9_]+)*\.v4\.b32", self.ptx))

    @property
    def v4_stores(self) -> int:
        """16-byte vector stores (``st.global....v4.b32``) in PTX."""
        return len(re.findall(r"st\.global(?:\.[a-z0-9_]+)*\.v4\.b32", self.ptx))

    @property
    def narrow_accesses(self) -> list[str]:
        """The opcodes of global loads/stores that are *not* 16-byte vectors, e.g. ``ld.global.b64``."""
        ops = re.findall(r"\b((?:ld|st)\.global(?:\.[a-z0-9_]+)*)\s", self.ptx)
        return [op for op in ops if ".v4." not in op + "."]

    @property
    def wide_address_adds(self) -> int:
        """64-bit address additions in PTX (``add.s64``): pointer + int64 offset."""
        return len(re.findall(r"\badd\.s64\b", self.ptx))


def compile_slot_move(
    inner_shapes: Sequence[Sequence[int]],
    dtypes: Sequence[torch.dtype],
    *,
    num_layers: int = 69,
    num_slots: int = 130,
    masked: bool = True,
    arch: int = 90,
    block: int | None = None,
    num_warps: int | None = None,
) -> CompiledSlotMove:
    """Compile the kernel as a ``copy``/``track`` launch on a ``[num_layers, num_slots, *inner]`` pool.

    ``inner_shapes``/``dtypes``: one entry per tensor (e.g. conv ``(3, 4608)`` bf16 and temporal
    ``(12, 128, 128)`` fp32); at most four. Strides are those of contiguous pool tensors. Raises whatever
    triton raises when the toolchain (ptxas) is missing. Cost: about 0.5 s for the first compile in a
    process, ~0.05-0.2 s after; no GPU, no side effects beyond Triton's on-disk cache.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import triton_slot_move as k

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError(
            "compile_slot_move cannot run with TRITON_INTERPRET=1 (triton.language itself is then decorated "
            "for the interpreter); use compile_in_subprocess() or `python -m mamba_radix_kernels.compile_check`"
        )
    if not 1 <= len(inner_shapes) <= MAX_TENSORS_PER_LAUNCH or len(inner_shapes) != len(dtypes):
        raise ValueError(f"need 1..{MAX_TENSORS_PER_LAUNCH} inner shapes with one dtype each")
    inner = [math.prod(s) for s in inner_shapes]
    blk = block or min(DEFAULT_BLOCK, max(16, triton_next_pow2(max(inner))))
    warps = num_warps or DEFAULT_NUM_WARPS

    fn = k.slot_move_kernel
    names = fn.arg_names
    signature: dict[str, str] = {}
    constexprs: dict[str, object] = {
        "NUM_TENSORS": len(inner),
        "SRC_MODE": k.INDEX_TENSOR,
        "DST_MODE": k.INDEX_TENSOR,
        "HAS_MASK": masked,
        "BLOCK": blk,
    }
    div16: list[int] = []

    def add(name: str, ty: str, value: int | None = None) -> None:
        signature[name] = ty
        # The JIT marks pointers (torch allocations are 256-byte aligned) and ints divisible by 16.
        if ty.startswith("*") or (value is not None and value % 16 == 0 and value != 0):
            div16.append(names.index(name))

    add("src_idx_ptr", "*i64")
    add("dst_idx_ptr", "*i64")
    add("mask_ptr", "*u8")
    signature["src_scalar"] = "i64"  # do_not_specialize
    add("num_layers", "i32", num_layers)
    for j in range(MAX_TENSORS_PER_LAUNCH):
        if j < len(inner):
            ty = _PTR_TYPE[torch.empty((), dtype=dtypes[j]).element_size()]
            layer_stride = num_slots * inner[j]
            vals = [inner[j], layer_stride, inner[j], layer_stride, inner[j]]
        else:
            ty, vals = "*i16", [0, 0, 0, 0, 0]
        add(f"s{j}", ty)
        add(f"d{j}", ty)
        for name, v in zip((f"n{j}", f"ssl{j}", f"sss{j}", f"dsl{j}", f"dss{j}"), vals, strict=True):
            add(name, "i64" if v >= 2**31 else "i32", v)
    for name in constexprs:
        signature[name] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i in div16}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    return CompiledSlotMove(ttir=ck.asm["ttir"], ptx=ck.asm["ptx"], block=blk, num_warps=warps)


# name -> (inner shapes, dtype names, masked, num_layers, num_slots): the Kimi-K3-like per-rank pool
# (69 KDA layers, conv 3 x 4608 bf16, temporal 12 x 128 x 128 in bf16 or fp32), as a masked track launch and
# as an unmasked copy, plus an odd inner size that cannot be vectorised (a control for the detector).
STANDARD_CASES: dict[str, tuple[list[tuple[int, ...]], list[str], bool, int, int]] = {
    "kimi-bf16-track": ([(3, 4608), (12, 128, 128)], ["bfloat16", "bfloat16"], True, 69, 130),
    "kimi-bf16-copy": ([(3, 4608), (12, 128, 128)], ["bfloat16", "bfloat16"], False, 69, 130),
    "kimi-fp32-track": ([(3, 4608), (12, 128, 128)], ["bfloat16", "float32"], True, 69, 130),
    "kimi-fp32-copy": ([(3, 4608), (12, 128, 128)], ["bfloat16", "float32"], False, 69, 130),
    "kimi-fp8-copy": ([(3, 4608), (12, 128, 128)], ["bfloat16", "float8_e4m3fn"], False, 69, 130),
    "odd-bf16-copy": ([(3, 7)], ["bfloat16"], False, 2, 5),
}


def summarize(ck: CompiledSlotMove) -> dict[str, object]:
    """The numbers the checks assert on, as plain JSON-able values."""
    return {
        "block": ck.block,
        "num_warps": ck.num_warps,
        "i64_multiplies": ck.i64_multiplies,
        "v4_loads": ck.v4_loads,
        "v4_stores": ck.v4_stores,
        "narrow_accesses": ck.narrow_accesses,
        "add_s64": ck.wide_address_adds,
    }


def _run_cases(names: Sequence[str], arch: int) -> dict[str, dict[str, object]]:
    out = {}
    for name in names:
        shapes, dtypes, masked, layers, slots = STANDARD_CASES[name]
        ck = compile_slot_move(
            shapes,
            [getattr(torch, d) for d in dtypes],
            num_layers=layers,
            num_slots=slots,
            masked=masked,
            arch=arch,
        )
        out[name] = summarize(ck)
    return out


def compile_in_subprocess(
    names: Sequence[str] | None = None, arch: int = 90, timeout: float = 300.0
) -> dict[str, dict[str, object]]:
    """Compile :data:`STANDARD_CASES` in a fresh Python without ``TRITON_INTERPRET`` and return summaries.

    A process running the interpreter cannot compile (Triton decorates ``triton.language`` itself for the
    interpreter at import), so tests call this. Cost: one interpreter start (~3 s) plus ~0.2 s per case.
    Raises ``RuntimeError`` with the child's stderr if it fails.
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silences a warning of newer tritons
    # Make the package importable in the child the way it is in this process (editable install or a
    # PYTHONPATH shim), whatever the child's working directory.
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), *sys.path) if p)
    cmd = [sys.executable, "-m", f"{__package__}.compile_check", "--arch", str(arch), "--json"]
    cmd += list(names or STANDARD_CASES)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=pkg_parent)
    if res.returncode != 0:
        raise RuntimeError(f"compile check failed (exit {res.returncode}):\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: compile the standard cases for ``--arch`` and print a table (or one JSON line with ``--json``)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"case names (default: all of {', '.join(STANDARD_CASES)})")
    parser.add_argument(
        "--arch", type=int, default=90, help="CUDA compute capability x10 (default 90: H100/H200)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases if c not in STANDARD_CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(STANDARD_CASES)}")
    results = _run_cases(args.cases or list(STANDARD_CASES), args.arch)
    if args.json:
        print(json.dumps(results))
    else:
        for name, r in results.items():
            print(
                f"{name:18s} block={r['block']:5d} warps={r['num_warps']} i64_muls={r['i64_multiplies']} "
                f"v4_ld={r['v4_loads']} v4_st={r['v4_stores']} narrow={r['narrow_accesses']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
