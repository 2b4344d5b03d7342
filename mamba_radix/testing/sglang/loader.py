"""Fetch an SGLang wheel from PyPI and import its prefix cache in an isolated module namespace.

SGLang's code (Apache-2.0) is never copied into this repository: :func:`load_sglang` downloads the wheel
for a version with ``python -m pip download sglang==X --no-deps`` into a cache folder, extracts only the
``.py`` files the cache needs, and imports them with small stand-in modules (:mod:`.standins`) in place of
the heavy ones (CUDA kernels, distributed groups, server arguments, metrics). The result is a
:class:`SGLangModules` handle: the real cache classes plus a context manager that puts the version's
modules into ``sys.modules`` while its code runs (SGLang imports a few modules lazily, inside functions).

Cache folder: ``$MAMBA_RADIX_SGLANG_CACHE/<version>`` (default ``~/.cache/mamba_radix/sglang/<version>``),
holding the wheel and an ``src/`` tree of the extracted files. A second call reuses both; concurrent
fetches are safe (each writes to a temporary name and renames).

Test and benchmark tooling, never reached by a user command (``pyproject.toml`` [tool.importlinter]
holds that), installed with the ``sglang-tools`` extra (``pip install "mamba-radix[sglang-tools]"``): the
download runs ``python -m pip``, which an environment made by uv or a slim image may lack; without it
:func:`fetch_wheel` raises :class:`SGLangToolsMissingError`, one line naming the extra, before it runs
anything. A wheel already in the cache folder needs no pip.

Use::

    sg = load_sglang("0.5.20")                 # SGLangUnavailableError if the wheel cannot be had
    with sg.activated():
        cache = sg.MambaRadixCache(params)      # see mamba_radix.testing.sglang.replay for the set-up
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from mamba_radix.errors import MambaRadixError

__all__ = [
    "SUPPORTED_VERSIONS",
    "SGLangError",
    "SGLangLoadError",
    "SGLangModules",
    "SGLangToolsMissingError",
    "SGLangUnavailableError",
    "cache_dir",
    "fetch_wheel",
    "load_sglang",
]

CACHE_ENV = "MAMBA_RADIX_SGLANG_CACHE"
# the extra that installs what this tooling needs beyond the library (pyproject.toml
# [project.optional-dependencies]); error messages name it
EXTRA = "sglang-tools"
INSTALL_HINT = f'pip install "mamba-radix[{EXTRA}]"'
_PIP_NOISE = "is ignored: it is neither a file nor a directory"
_PIP_TIMEOUT_S = 600


class SGLangError(MambaRadixError):
    """Base class of the SGLang loader's errors."""


class SGLangUnavailableError(SGLangError):
    """The wheel for a version could not be fetched (no network, no such version, pip failed)."""


class SGLangToolsMissingError(SGLangUnavailableError):
    """The SGLang tooling is not installed: a wheel must be downloaded and this environment has no pip.
    A kind of :class:`SGLangUnavailableError` (the wheel cannot be had), so callers that skip or report
    an unavailable SGLang keep doing so; the message names the extra to install."""


class SGLangLoadError(SGLangError):
    """The wheel was fetched but its cache could not be imported (a file missing, an import we do not
    stand in for): the version's layout differs from what this loader knows."""


# ------------------------------------------------------------------------------------ what to extract
_MEM = "sglang/srt/mem_cache/"
_FILES_0_5_20 = (
    _MEM + "mamba_radix_cache.py",
    _MEM + "base_prefix_cache.py",
    _MEM + "radix_cache.py",
    _MEM + "cache_init_params.py",
    _MEM + "unified_cache/component_type.py",
)
_UC = _MEM + "unified_cache/"
_FILES_0_5_23 = (
    _MEM + "unified_radix_cache.py",
    _MEM + "base_prefix_cache.py",
    _MEM + "radix_cache.py",
    _MEM + "cache_init_params.py",
    _UC + "component_type.py",
    _UC + "cache_action.py",
    _UC + "unified_tree_core.py",
    _UC + "unified_tree_core_interface.py",
    _UC + "tree_core_registry.py",
    _UC + "components/__init__.py",
    _UC + "components/base.py",
    _UC + "components/full.py",
    _UC + "components/mamba.py",
    _UC + "components/swa.py",
    _UC + "session_ref_tracker.py",
    _UC + "storage_attachment.py",
    _UC + "unified_cache_linker.py",
    _MEM + "hicache_storage.py",
    _MEM + "evict_policy.py",
    "sglang/srt/environ.py",
)


@dataclass(frozen=True)
class _Recipe:
    files: tuple[str, ...]
    targets: dict[str, tuple[str, str]]  # handle attribute -> (module, attribute)
    standins: str  # name of the builder in .standins


_RECIPES: dict[str, _Recipe] = {
    "0.5.20": _Recipe(
        _FILES_0_5_20,
        {
            "MambaRadixCache": ("sglang.srt.mem_cache.mamba_radix_cache", "MambaRadixCache"),
            "TreeNode": ("sglang.srt.mem_cache.mamba_radix_cache", "TreeNode"),
            "RadixKey": ("sglang.srt.mem_cache.radix_cache", "RadixKey"),
            "CacheInitParams": ("sglang.srt.mem_cache.cache_init_params", "CacheInitParams"),
            "MatchPrefixParams": ("sglang.srt.mem_cache.base_prefix_cache", "MatchPrefixParams"),
            "EvictParams": ("sglang.srt.mem_cache.base_prefix_cache", "EvictParams"),
        },
        "build_0_5_20",
    ),
    "0.5.23": _Recipe(
        _FILES_0_5_23,
        {
            "UnifiedRadixCache": ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache"),
            "RadixKey": ("sglang.srt.mem_cache.radix_cache", "RadixKey"),
            "CacheInitParams": ("sglang.srt.mem_cache.cache_init_params", "CacheInitParams"),
            "MatchPrefixParams": ("sglang.srt.mem_cache.base_prefix_cache", "MatchPrefixParams"),
            "EvictParams": ("sglang.srt.mem_cache.base_prefix_cache", "EvictParams"),
            "ComponentType": ("sglang.srt.mem_cache.unified_cache.component_type", "ComponentType"),
        },
        "build_0_5_23",
    ),
}
SUPPORTED_VERSIONS: tuple[str, ...] = tuple(_RECIPES)


# ------------------------------------------------------------------------------------------ fetching
def cache_dir(version: str) -> Path:
    """The cache folder of ``version``: ``$MAMBA_RADIX_SGLANG_CACHE/<version>`` or
    ``~/.cache/mamba_radix/sglang/<version>``. Not created here."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "mamba_radix", "sglang"
    )
    return Path(base) / version


def _find_wheel(folder: Path, version: str) -> Path | None:
    found = sorted(folder.glob(f"sglang-{version}-*.whl")) if folder.is_dir() else []
    return found[0] if found else None


def _pip_available() -> bool:
    """Whether ``python -m pip`` can run in this interpreter (the ``sglang-tools`` extra installs pip).
    O(1): a module lookup, nothing imported."""
    return importlib.util.find_spec("pip") is not None


def require_sglang_tools(version: str) -> None:
    """Raise :class:`SGLangToolsMissingError` (one line, naming the extra) when downloading
    ``sglang==version`` cannot work because the ``sglang-tools`` extra is not installed. No side effects."""
    if not _pip_available():
        raise SGLangToolsMissingError(
            f"fetching sglang=={version} needs pip in this environment ({sys.executable} -m pip), which the "
            f'{EXTRA} extra installs: {INSTALL_HINT} (uv: uv pip install "mamba-radix[{EXTRA}]"), or put '
            f"the wheel in {cache_dir(version)}"
        )


def _pip_download(version: str, dest: Path, extra: list[str]) -> tuple[bool, str]:
    cmd = [sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps", "-q", "-d", str(dest)]
    try:
        proc = subprocess.run(
            cmd + extra, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, str(err)
    # This machine's pip configuration names local index folders that do not exist; pip warns about
    # each one. The warnings are noise, not the reason for a failure.
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and _PIP_NOISE not in ln]
    return proc.returncode == 0, (lines[-1] if lines else f"pip exited with {proc.returncode}")


def fetch_wheel(version: str) -> Path:
    """The wheel of ``sglang==version`` in its cache folder, downloaded if absent.

    Tries the wheel for this interpreter first, then the CPython 3.11 manylinux wheel (only ``.py`` files
    are read, so any platform's wheel will do). Side effects: creates the cache folder, runs pip (network).
    Raises :class:`SGLangToolsMissingError` before anything when a download is needed and pip is missing
    (the ``sglang-tools`` extra), :class:`SGLangUnavailableError` with pip's last line when neither
    download works.
    """
    folder = cache_dir(version)
    wheel = _find_wheel(folder, version)
    if wheel is not None:
        return wheel
    require_sglang_tools(version)
    folder.mkdir(parents=True, exist_ok=True)
    attempts = (
        [],
        ["--only-binary=:all:", "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64"],
    )
    reason = ""
    for extra in attempts:
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
            ok, reason = _pip_download(version, Path(tmp), extra)
            got = _find_wheel(Path(tmp), version)
            if ok and got is not None:
                target = folder / got.name
                os.replace(got, target)  # atomic: a concurrent fetch sees a whole wheel or none
                return target
    with contextlib.suppress(OSError):
        folder.rmdir()  # only if empty: a failed fetch leaves nothing behind
    raise SGLangUnavailableError(
        f"cannot fetch sglang=={version} from PyPI ({reason}); check the network or put the wheel in {folder}"
    )


def _extract(version: str, wheel: Path, files: tuple[str, ...]) -> Path:
    """Extract ``files`` from ``wheel`` into ``<cache>/<version>/src`` (once). Returns the src folder."""
    src = cache_dir(version) / "src"
    stamp = src / ".complete"
    if stamp.is_file() and stamp.read_text() == "\n".join(files):
        return src
    tmp = Path(tempfile.mkdtemp(dir=src.parent, prefix=".src-"))
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            missing = [f for f in files if f not in names]
            if missing:
                raise SGLangLoadError(
                    f"sglang=={version} wheel {wheel.name} lacks {missing[0]}; this loader knows "
                    f"versions {', '.join(SUPPORTED_VERSIONS)}"
                )
            for name in files:
                zf.extract(name, tmp)
        (tmp / ".complete").write_text("\n".join(files))
        if src.exists():
            shutil.rmtree(src, ignore_errors=True)
        try:
            os.replace(tmp, src)
        except OSError:  # a concurrent extraction won the rename: use its copy
            if not stamp.is_file():
                raise
    except zipfile.BadZipFile as err:
        raise SGLangLoadError(f"{wheel} is not a valid wheel ({err}); delete it and fetch again") from err
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return src


# ----------------------------------------------------------------------------- isolated module namespace
def _is_sglang(name: str) -> bool:
    return name == "sglang" or name.startswith("sglang.")


@dataclass
class SGLangModules:
    """One SGLang version's imported cache: ``version``, the classes named by its recipe as attributes
    (``MambaRadixCache`` for 0.5.20, ``UnifiedRadixCache`` for 0.5.23, and ``RadixKey``,
    ``CacheInitParams``, ``MatchPrefixParams``, ``EvictParams``), and ``standins``, the module of stand-ins
    the cache was imported against (the replay's pools come from it).

    SGLang's modules live under their own names (``sglang.srt...``) but only inside :meth:`activated`;
    outside it ``sys.modules`` holds no ``sglang`` entry, so two versions can be loaded in one process.
    """

    version: str
    src: Path
    modules: dict[str, ModuleType] = field(repr=False)
    classes: dict[str, Any] = field(repr=False)
    standins: ModuleType = field(repr=False)

    def __getattr__(self, name: str) -> Any:
        classes = self.__dict__.get("classes", {})
        if name in classes:
            return classes[name]
        raise AttributeError(f"SGLangModules({self.__dict__.get('version')!r}) has no attribute {name!r}")

    @contextlib.contextmanager
    def activated(self) -> Iterator[SGLangModules]:
        """Put this version's modules into ``sys.modules`` (hiding any others named ``sglang``) for the
        duration, so SGLang's function-level imports resolve to this version. Not thread-safe. O(modules)."""
        with _swapped_modules(self.modules):
            yield self


@contextlib.contextmanager
def _swapped_modules(modules: dict[str, ModuleType]) -> Iterator[None]:
    """``modules`` in ``sys.modules`` for the duration: every ``sglang*`` entry and every other name in
    ``modules`` (a stand-in for a third-party module SGLang needs, e.g. ``msgspec``) is swapped."""
    extra = {k for k in modules if not _is_sglang(k)}

    def ours(name: str) -> bool:
        return _is_sglang(name) or name in extra

    saved = {k: v for k, v in sys.modules.items() if ours(k)}
    for k in saved:
        del sys.modules[k]
    sys.modules.update(modules)
    try:
        yield
    finally:
        # keep what was imported meanwhile (lazy imports) with this version
        for k in [k for k in sys.modules if ours(k)]:
            modules[k] = sys.modules.pop(k)
        sys.modules.update(saved)


def _package(name: str, src: Path) -> ModuleType:
    mod = ModuleType(name)
    mod.__path__ = [str(src / name.replace(".", "/"))]  # type: ignore[attr-defined]
    mod.__package__ = name
    return mod


_LOADED: dict[str, SGLangModules] = {}


def load_sglang(version: str) -> SGLangModules:
    """Import SGLang ``version``'s prefix cache (fetching the wheel if needed); memoised per process.

    Raises :class:`SGLangUnavailableError` when the wheel cannot be fetched (its
    :class:`SGLangToolsMissingError` when the ``sglang-tools`` extra is missing) and :class:`SGLangLoadError`
    for an unknown version or an import the stand-ins do not cover. Side effects: network and disk on
    the first call per machine; imports torch.
    """
    if version in _LOADED:
        return _LOADED[version]
    recipe = _RECIPES.get(version)
    if recipe is None:
        raise SGLangLoadError(
            f"sglang version {version!r} is not known to this loader; use one of {', '.join(SUPPORTED_VERSIONS)}"
        )
    wheel = fetch_wheel(version)
    src = _extract(version, wheel, recipe.files)
    from mamba_radix.testing.sglang import standins

    modules: dict[str, ModuleType] = {}
    stand = getattr(standins, recipe.standins)()
    # every package above a real file is an empty package (its __init__ is not run: they import the
    # world); real files are then found through the packages' __path__
    for path in recipe.files:
        parts = path[: -len(".py")].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        for i in range(1, len(parts)):
            pkg = ".".join(parts[:i])
            modules.setdefault(pkg, _package(pkg, src))
    modules.update(stand.modules)
    for path in recipe.files:
        if path.endswith("/__init__.py"):  # a real package body: drop the empty one so the file runs
            modules.pop(path[: -len("/__init__.py")].replace("/", "."), None)
    classes: dict[str, Any] = {}
    with _swapped_modules(modules):
        try:
            for attr, (mod_name, obj) in recipe.targets.items():
                classes[attr] = getattr(importlib.import_module(mod_name), obj)
        except (ImportError, AttributeError) as err:
            raise SGLangLoadError(
                f"sglang=={version}: importing its cache failed ({type(err).__name__}: {err}); "
                "the stand-ins in mamba_radix/testing/sglang/standins.py do not cover this wheel"
            ) from err
    loaded = SGLangModules(version, src, modules, classes, stand.namespace)
    _LOADED[version] = loaded
    return loaded
