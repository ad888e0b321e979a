"""``python -m humming.triton_kernels [--arch 90] [--only NAME]``: the ahead-of-time compile check (JSON)."""

import sys

from .registry import main

sys.exit(main())
