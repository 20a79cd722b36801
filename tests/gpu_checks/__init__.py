"""The GPU check's checks, one module each, shared by scripts/gpu_check.py (a table with a verdict
per line) and tests/scripts/test_gpu_checks_on_cuda.py (the same checks as tests marked `cuda`). Each takes the device
it runs on, so the parts that can run on a CPU are tested there too (tests/scripts/test_gpu_checks.py)."""
