"""``python -m mamba_radix.cli``: the ``mamba-radix`` command."""

import sys

from mamba_radix.cli import main

sys.exit(main())
