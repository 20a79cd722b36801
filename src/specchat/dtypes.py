"""--dtype's names as torch dtypes (limits.DTYPE_NAMES stays torch-free for the command line)."""

import torch

from specchat.limits import DTYPE_NAMES

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
