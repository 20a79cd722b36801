"""Freed heap memory goes back to the OS after loading (glibc keeps it otherwise)."""

import ctypes
import subprocess
import sys

import pytest

from specchat.heap_trim import release_free_heap

# Runs in a fresh process. glibc is told to serve 8 MB blocks from the heap (an mmap threshold of
# 64 MB: its dynamic one rises so once loading frees large blocks) and never to trim on
# its own; forty 8 MB tensors are freed below a small one that keeps the heap's top in place.
SCENARIO = """
import ctypes
import torch
from pathlib import Path
from specchat.heap_trim import release_free_heap
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
libc = ctypes.CDLL(None)
libc.mallopt(M_MMAP_THRESHOLD, 64 << 20)
libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
def anon_mb():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("RssAnon"))
    return int(line.split()[1]) / 1e3
blocks = [torch.ones(8_000_000 // 4) for _ in range(40)]
pin = torch.ones(1000)
del blocks
before = anon_mb()
trimmed = release_free_heap()
print(trimmed, before - anon_mb())
"""


GLIBC = sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "malloc_trim")


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc_trim and Linux's /proc are what this reads")
def test_freed_heap_pages_are_returned():
    out = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "True" and float(out[1]) > 300  # of the 320 MB freed on the heap


def test_without_malloc_trim_it_says_so(monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())
    assert release_free_heap() is False
