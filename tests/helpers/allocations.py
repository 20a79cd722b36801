"""What a call allocates, counted from the buffers' own sizes: torch's allocating constructors
replaced by stand-ins that record the bytes of every tensor they make."""

import pytest
import torch


def record_allocations(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...] = ("empty",)) -> list[int]:
    """The bytes of each tensor torch.<name> makes from now on (until `monkeypatch` undoes it)."""
    sizes: list[int] = []

    def recording(real):
        def allocate(*args, **kwargs):
            tensor = real(*args, **kwargs)
            sizes.append(tensor.nbytes)
            return tensor
        return allocate

    for name in names:
        monkeypatch.setattr(torch, name, recording(getattr(torch, name)))
    return sizes
