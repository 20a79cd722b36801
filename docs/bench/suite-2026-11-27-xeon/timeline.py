"""Per-test start/end wall time and xdist worker, to a JSONL."""
import json, os, time
import pytest
OUT = os.environ.get("TIMELINE_OUT", "timeline.jsonl")

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    s = time.time()
    yield
    with open(OUT, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "w": os.environ.get("PYTEST_XDIST_WORKER", "-"),
                            "start": round(s, 2), "end": round(time.time(), 2)}) + "\n")
