"""The layer file a model's decoder layers are written to for streaming from disk: where it goes
and what its bytes depend on, so the plan (which reuses a file that holds its bytes) and the
offloading (which writes and reads it) name and check it alike."""

import re
from pathlib import Path

import torch

from specchat.checkpoint.sources import SafetensorsSource
from specchat.quant.int4_pack import layout_key


def layer_file(offload_dir: Path, name: str, dtype: torch.dtype) -> Path:
    stem = re.sub(r"[^\w.-]+", "_", name) + "-" + str(dtype).removeprefix("torch.")
    return offload_dir / f"{stem}.layers"


def fingerprint(source: SafetensorsSource, dtype: torch.dtype, device: torch.device) -> dict:
    """What the layer file's bytes depend on: the checkpoint, the dtype, and the layout the
    device's int4 kernel packs its 4-bit weights in."""
    return {**source.fingerprint(), "dtype": str(dtype), "int4 layout": layout_key(device.type)}
