"""tests/helpers/anon_at_plan.py, which test_memory_peak_real.py runs specchat through: the baseline it
reports is read as the plan's line goes out, before the process allocates anything more."""

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import anon_at_plan
from helpers.anon_at_plan import AT_PLAN, PLANNED

HELPER = Path(anon_at_plan.__file__)  # run as a script, by path
BALLAST = 256 * 2**20
# Announces a plan as specchat does, then allocates BALLAST (written, so resident) and prints its
# own RssAnon: a baseline read any later than the plan's line would hold the ballast.
FAKE_RUN = f"""
import re, sys
from pathlib import Path
print("RAM under --ram-budget 2 GB: 1.00 GB planned (target 1.00 GB)", file=sys.stderr)
ballast = b"\\x01" * {BALLAST}
print(int(re.search(r"RssAnon:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024)
sys.exit(3)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_baseline_is_read_before_the_process_goes_on_allocating(tmp_path):
    (tmp_path / "fake_run.py").write_text(FAKE_RUN)
    result = subprocess.run([sys.executable, str(HELPER), "fake_run"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 3, result.stderr  # the module's own exit status
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and AT_PLAN.fullmatch(lines[0]) and PLANNED.search(lines[1]), result.stderr
    at_plan, after = int(AT_PLAN.fullmatch(lines[0]).group(1)), int(result.stdout)
    assert 0 < at_plan <= after - BALLAST
