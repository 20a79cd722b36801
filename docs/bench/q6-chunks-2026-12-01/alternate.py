"""What this folder's scripts share: one call's seconds, and a module loaded from a file (the code
before, as `git show` wrote it) to time beside the checkout's."""
import importlib.util
import time
from types import ModuleType


def seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def module_from(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
