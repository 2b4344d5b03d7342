"""Package discovery that pyproject.toml alone cannot express (the rest of the metadata is there).

Every package under ``mamba_radix/`` (``mamba_radix*``) is found automatically, so a new subpackage ships
without editing a list; ``kernels/`` and its subpackages are installed as ``mamba_radix_kernels``
(``package-dir`` in pyproject.toml).
"""

from setuptools import find_packages, setup


def packages_found() -> list[str]:
    """``mamba_radix`` and all its subpackages, plus ``kernels*`` renamed to ``mamba_radix_kernels*``."""
    ours = find_packages(include=["mamba_radix", "mamba_radix.*"])
    kernels = [
        "mamba_radix_kernels" + name[len("kernels") :]
        for name in find_packages(include=["kernels", "kernels.*"])
    ]
    return ours + kernels


setup(packages=packages_found())
