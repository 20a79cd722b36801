"""The block stored weights align to: a layer file's blobs and a MoE layer's expert units start on
it and are padded to it, so the streaming reads them with O_DIRECT and the plan counts them as
stored. Below both the layer's layout (checkpoint/layout.py) and the reads (offload/direct_io.py)."""

ALIGN = 4096  # O_DIRECT needs offsets, lengths and buffer addresses aligned to the logical block size


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
