"""Run SGLang's own unit tests of its hybrid cache against :mod:`mamba_radix.compat.sglang` (issue 27, item 5).

SGLang's test files are Apache-2.0 and never stored in this repository: this tool reads them at run time
from a public SGLang source snapshot (a bare git directory, e.g. the one the session's ``fetch`` tool gives
for ``github:zcnrex/sglang``, read with ``git show REV:PATH``), writes them into a temporary directory with
their ``sglang.`` imports rewritten to a shim package generated there, runs them with pytest in a fresh
interpreter and prints each test's outcome and the first line of its failure. Nothing it writes is kept.

The shim maps SGLang's cache modules onto the compat layer (``MambaRadixCache``, the parameter records,
``Req``, the pools, ``RadixKey``, ``available_and_evictable_str``) and stands in for the modules a unit
test needs only for set-up (``ServerArgs``, ``SamplingParams``, ``envs``, ``Mamba2CacheParams`` with its
state shapes scaled down to a few bytes per slot, ``get_device`` as the CPU, the CI registration calls as
no-ops, the KV event classes as empty records). What the compat layer does not map fails as it would for
an engine developer, and is counted.

Use::

    python benchmarks/sglang_unittests.py --git-dir /work/.mirror/zcnrex+sglang/repo \\
        --rev HEAD --rev 814202704        # test_mamba_unittest.py of 2026-08-13 and of 2026-03-23
    python benchmarks/sglang_unittests.py --git-dir /work/.mirror/zcnrex+sglang/repo \
        --unified --rev fc96edd29         # the unified suite of 2026-06-29, its FULL + MAMBA classes

Exit status 0 whatever the outcomes (a report, not a gate); 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

DEFAULT_TESTS = ("test/registered/unit/mem_cache/test_mamba_unittest.py",)
UNIFIED_SUITE = "test/registered/unit/mem_cache/test_unified_radix_cache_unittest.py"
# the unified suite's FULL + MAMBA configurations (its other classes test SWA, HiCache, component internals)
UNIFIED_SELECT = "FULL_MAMBA_ps"
SHIM = "sglang_compat_shim"

# Every shim module ends with this: a name the shim does not map imports as a placeholder class that
# refuses to be built, so that a test file imports whole and each test that needs it fails on its own.
_FALLBACK = textwrap.dedent(
    """


    class _Unmapped(type):
        def __getattr__(cls, attr):  # EvictLayer.DEVICE and the like, read at class definition
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _placeholder(f"{cls.__name__}.{attr}")


    def _placeholder(name):
        def refuse(*args, **kwargs):
            raise NotImplementedError(f"{name} is not mapped by mamba_radix.compat")

        return _Unmapped(name, (), {"__init__": refuse})


    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)
    """
)

# module of SGLang -> source of the shim module standing in for it (our own code: re-exports of the
# compat layer, or set-up records of our own)
_REEXPORT = "from mamba_radix.compat.sglang import *  # noqa: F401,F403\n"
_SHIM_MODULES: dict[str, str] = {
    "srt/mem_cache/mamba_radix_cache.py": _REEXPORT,
    "srt/mem_cache/base_prefix_cache.py": "from mamba_radix.compat.sglang_params import *  # noqa: F401,F403\n",
    "srt/mem_cache/cache_init_params.py": "from mamba_radix.compat.sglang_params import CacheInitParams  # noqa: F401\n",
    "srt/mem_cache/common.py": "from mamba_radix.compat.sglang import available_and_evictable_str  # noqa: F401\n",
    "srt/mem_cache/radix_cache.py": "from mamba_radix import RadixKey  # noqa: F401\n",
    "srt/mem_cache/allocator/__init__.py": (
        "from mamba_radix.compat.sglang_pools import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator  # noqa\n"
    ),
    "srt/mem_cache/memory_pool.py": (
        "from mamba_radix.compat.sglang_pools import HybridLinearKVPool, HybridReqToTokenPool, MambaPool  # noqa\n"
    ),
    "srt/managers/schedule_batch.py": "from mamba_radix.compat.sglang_req import Req  # noqa: F401\n",
    "srt/disaggregation/kv_events.py": "from mamba_radix.events import BlockRemoved, BlockStored  # noqa: F401\n",
    "srt/environ.py": textwrap.dedent(
        """
        import contextlib


        class _Env:
            @contextlib.contextmanager
            def override(self, value):
                yield


        class _Envs:
            def __getattr__(self, name):
                return _Env()


        envs = _Envs()
        """
    ),
    "srt/configs/mamba_utils.py": textwrap.dedent(
        """
        import torch
        from types import SimpleNamespace


        class Mamba2StateShape:
            # scaled down: the tests compare slots and copies, not model sizes
            @staticmethod
            def create(*, conv_kernel=4, **_):
                return SimpleNamespace(conv=[(conv_kernel - 1, 8)], temporal=(2, 4, 4))


        class Mamba2CacheParams:
            def __init__(self, shape, layers):
                self.shape, self.layers = shape, list(layers)
                self.dtype = SimpleNamespace(conv=torch.bfloat16, temporal=torch.float32)
        """
    ),
    "srt/sampling/sampling_params.py": textwrap.dedent(
        """
        class SamplingParams:
            def __init__(self, **kwargs):
                self.__dict__.update(kwargs)
        """
    ),
    "srt/server_args.py": textwrap.dedent(
        """
        _current = []


        class ServerArgs:
            def __init__(self, **kwargs):
                self.__dict__.update(kwargs)

            @property
            def mamba_cache_chunk_size(self):
                return getattr(self, "_mamba_cache_chunk_size", 64)


        def set_global_server_args_for_scheduler(server_args):
            _current[:] = [server_args]


        def get_global_server_args():
            return _current[0] if _current else ServerArgs()
        """
    ),
    "srt/utils/__init__.py": "def get_device():\n    return 'cpu'\n",
    "kernels/ops/attention/fla/chunk_delta_h.py": "CHUNK_SIZE = 64\n",
    "srt/layers/attention/fla/chunk_delta_h.py": "CHUNK_SIZE = 64\n",
    "test/test_utils.py": "from unittest import TestCase as CustomTestCase  # noqa: F401\n",
    "srt/mem_cache/unified_cache_components/tree_component.py": textwrap.dedent(
        """
        import enum


        class ComponentType(enum.Enum):
            FULL = "full"
            SWA = "swa"
            MAMBA = "mamba"
        """
    ),
    "srt/mem_cache/unified_radix_cache.py": textwrap.dedent(
        """
        from mamba_radix.compat.sglang import MambaRadixCache

        from ..server_args import get_global_server_args


        class UnifiedRadixCache(MambaRadixCache):
            # the unified cache of FULL + MAMBA components: the compat cache (it refuses other components)

            def cache_finished_req(self, req, is_insert=True):
                # SGLang's strip_thinking_cache is a global server argument; the compat cache's is its own
                self.strip_thinking_cache = bool(getattr(get_global_server_args(), "strip_thinking_cache", False))
                return super().cache_finished_req(req, is_insert)
        """
    ),
    "test/ci/ci_register.py": (
        "def register_cuda_ci(*args, **kwargs):\n    pass\n\n\ndef register_amd_ci(*args, **kwargs):\n    pass\n"
    ),
}


def read_snapshot_file(git_dir: Path, rev: str, path: str) -> str:
    """``path`` at ``rev`` in the bare git directory ``git_dir`` (``git show``; read-only)."""
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{rev}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def commit_of(git_dir: Path, rev: str, path: str) -> str:
    """The short hash and date of the last commit at or before ``rev`` that changed ``path``."""
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "log", "-1", "--format=%h %ad", "--date=short", rev, "--", path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def rewrite_imports(source: str) -> str:
    """Point every ``sglang.`` import at the shim package. O(len)."""
    source = re.sub(r"\bfrom sglang\.", f"from {SHIM}.", source)
    return re.sub(r"\bimport sglang\.", f"import {SHIM}.", source)


def write_shim(root: Path, sources: list[str]) -> None:
    """Write the shim package under ``root``: every module in :data:`_SHIM_MODULES`, every other module the
    rewritten ``sources`` import from (placeholders only), ``__init__.py`` files on the way; each module
    ends with :data:`_FALLBACK`."""
    modules = dict(_SHIM_MODULES)
    for source in sources:
        for dotted in re.findall(rf"\b(?:from|import) {SHIM}\.([\w.]+)", source):
            rel = dotted.replace(".", "/")
            if f"{rel}.py" not in modules and f"{rel}/__init__.py" not in modules:
                modules[f"{rel}.py"] = ""
    for rel, text in modules.items():
        path = root / SHIM / rel
        if path.with_suffix("").is_dir() or any(m.startswith(rel[: -len(".py")] + "/") for m in modules):
            path = path.with_suffix("") / "__init__.py"  # a package as well as a module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + _FALLBACK)
    for folder in [root / SHIM, *(root / SHIM).rglob("*")]:
        if folder.is_dir() and not (folder / "__init__.py").exists():
            (folder / "__init__.py").write_text(_FALLBACK)


def run_tests(files: dict[str, str], timeout_s: int, select: str | None) -> list[tuple[str, str, str]]:
    """Run the rewritten test files with pytest in a fresh interpreter (``select``: a ``-k`` expression);
    return ``(test, outcome, why)`` per test case (outcome: passed, failed, error or skipped; why: the
    failure's first line)."""
    with tempfile.TemporaryDirectory(prefix="sglang_unittests_") as tmp:
        root = Path(tmp)
        rewritten = {name: rewrite_imports(source) for name, source in files.items()}
        write_shim(root, list(rewritten.values()))
        for name, source in rewritten.items():
            (root / name).write_text(source)
        report = root / "report.xml"
        k = ["-k", select] if select else []
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={report}",
                *k,
                *files,
            ],
            cwd=root,
            timeout=timeout_s,
            capture_output=True,
            text=True,
        )
        return parse_junit(report)


def parse_junit(report: Path) -> list[tuple[str, str, str]]:
    rows = []
    for case in ET.parse(report).getroot().iter("testcase"):
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = node.get("message") or (node.text or "")
                why = message.strip().splitlines()[0][:160] if message.strip() else ""
                break
        rows.append((test, outcome, why))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git-dir", type=Path, required=True, help="a bare git directory of SGLang's source")
    parser.add_argument("--rev", action="append", help="revisions to read the tests at (default HEAD)")
    parser.add_argument(
        "--test", action="append", help=f"test files in the snapshot (default {DEFAULT_TESTS})"
    )
    parser.add_argument(
        "--unified",
        action="store_true",
        help=f"run the unified radix cache suite's FULL + MAMBA classes (-k {UNIFIED_SELECT}) instead",
    )
    parser.add_argument("--timeout-s", type=int, default=600)
    args = parser.parse_args(argv)
    total: Counter[str] = Counter()
    for rev in args.rev or ["HEAD"]:
        files = {}
        tests = args.test or ([UNIFIED_SUITE] if args.unified else list(DEFAULT_TESTS))
        for i, path in enumerate(tests):
            try:
                source = read_snapshot_file(args.git_dir, rev, path)
                print(f"== {path} at {rev} (last changed {commit_of(args.git_dir, rev, path)})")
            except subprocess.CalledProcessError as exc:
                print(f"cannot read {path} at {rev}: {exc.stderr.strip()}", file=sys.stderr)
                return 2
            files[f"test_sglang_{i}_{Path(path).stem.removeprefix('test_')}.py"] = source
        rows = run_tests(files, args.timeout_s, UNIFIED_SELECT if args.unified else None)
        counts = Counter(outcome for _, outcome, _ in rows)
        total.update(counts)
        for test, outcome, why in rows:
            print(f"  {outcome:7s} {test}" + (f"  -- {why}" if why else ""))
        print(f"  {dict(sorted(counts.items()))}")
    print(f"total {dict(sorted(total.items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
