"""Per-test wall and CPU seconds (this process + waited-for children), setup/call/teardown summed, to a JSONL."""
import json
import os
import resource
import time

import pytest

OUT = os.environ.get("CPUTIMES_OUT", "cputimes.jsonl")


def cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    w, c = time.perf_counter(), cpu()
    yield
    with open(OUT, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "wall": round(time.perf_counter() - w, 2),
                            "cpu": round(cpu() - c, 2)}) + "\n")
