"""scripts/bench_int4_linear.py prints a row of positive timings per shape and rows count."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_int4_linear.py"


def test_the_int4_bench_prints_a_row_per_shape_and_width():
    result = subprocess.run([sys.executable, str(SCRIPT), "--shapes", "64x64", "128x64", "--rows", "1", "4"],
                            capture_output=True, text=True, timeout=300, check=True)
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines() if line.startswith("| ") and "rows" not in line]
    assert [(row[0].strip(), int(row[1])) for row in rows] == [("64 x 64", 1), ("64 x 64", 4), ("128 x 64", 1),
                                                               ("128 x 64", 4)]
    assert all(float(cell.split()[0]) > 0 for row in rows for cell in row[2:])


def test_the_inductor_column_times_the_compiled_op_and_leaves_no_cache(tmp_path):
    """--inductor adds a column (torch.compile needs a C++ compiler, which the suite's machines have);
    its compile cache is a temporary folder of the script's, gone when it ends."""
    environment = os.environ | {"TMPDIR": str(tmp_path)}
    result = subprocess.run([sys.executable, str(SCRIPT), "--shapes", "64x64", "--rows", "4", "--inductor"],
                            capture_output=True, text=True, timeout=300, check=True, env=environment)
    header, _, row = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert header.split("|")[-2].strip() == "inductor int4 ms (/bf16)"
    assert len(row.split("|")) == len(header.split("|")) and float(row.split("|")[-2].split()[0]) > 0
    assert list(tmp_path.iterdir()) == []
