"""scripts/gpu_lease.sh: a lease's plan runs each part's commands, a failed part does not stop the
next, and the closing lines say which failed (the script's exit status too)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fake_python(tmp_path: Path, fails: str) -> Path:
    """A stand-in interpreter that logs its arguments, imports specchat, and fails any script
    whose path holds `fails` with status 3."""
    python = tmp_path / "python"
    python.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {tmp_path}/calls
[[ "$1" == -c ]] && exit 0
[[ "$*" == *{fails}* ]] && exit 3
exit 0
""")
    python.chmod(0o755)
    return python


def lease(tmp_path: Path, *args: str, fails: str = "no-such-script") -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(fake_python(tmp_path, fails))}
    return subprocess.run(["bash", "scripts/gpu_lease.sh", *args, str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def calls(tmp_path: Path) -> list[str]:
    return [line for line in (tmp_path / "calls").read_text().splitlines() if not line.startswith("-c")]


def test_a_dry_run_runs_the_three_benches_the_pair_ab_traced_and_the_cuda_tests(tmp_path):
    done = lease(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    assert calls(tmp_path) == [
        "scripts/bench_copy_contention.py --dry-run",
        "scripts/bench_copy_contention.py --dry-run --rows 256",
        "scripts/bench_copy_contention.py --dry-run --no-inputs",
        f"scripts/gpu_check.py --pair --dry-run --only llama-3.1-70b-awq --budgets 1024 --also --resident-layers 0 "
        f"--trace {out}",
        "-m pytest -q -rA -p no:cacheprovider -o addopts= tests/scripts/test_gpu_checks_on_cuda.py -m cuda",
    ]
    assert [line.split(":")[0] for line in done.stdout.splitlines()[-3:]] == ["PASS bench", "PASS pair", "PASS cuda"]
    assert {path.name for path in out.iterdir()} == {"bench.log", "pair.log", "cuda.log"}


def test_a_failed_part_is_reported_and_the_next_part_still_runs(tmp_path):
    done = lease(tmp_path, "--parts", "bench,cuda", fails="bench_copy_contention")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-2].startswith("FAIL bench: exit 3")
    assert done.stdout.splitlines()[-1].startswith("PASS cuda: exit 0")
    assert calls(tmp_path)[-1].startswith("-m pytest")  # the bench's first failure skipped its other two
    assert len(calls(tmp_path)) == 2


def test_an_unknown_part_is_refused_in_one_line_before_anything_runs(tmp_path):
    done = lease(tmp_path, "--parts", "bench,scale")
    assert done.returncode == 2
    assert done.stderr.strip() == "gpu_lease.sh: no part named 'scale' (bench, pair, cuda)"
    assert not (tmp_path / "calls").exists()
