"""Every script in scripts/ imports only what exists: each name it takes from the package, or from
the tests' helpers and GPU checks some of them put on the path, is there. Most benches need the
real models' time or a GPU, so nothing else in the suite runs them: a function moved or renamed in
src/ would break them unseen. The scripts are read, not run."""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
OURS = ("specchat", "helpers", "gpu_checks")  # the package, and the tests' folders scripts put on the path


def ours(module: str) -> bool:
    return module.split(".")[0] in OURS


def imported_names(script: Path) -> list[tuple[str, str | None]]:
    """(module, name) for each `from module import name` of ours in `script`, and (module, None)
    for each `import module` of ours."""
    names = []
    for node in ast.walk(ast.parse(script.read_text(), filename=str(script))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and ours(node.module):
            names += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [(alias.name, None) for alias in node.names if ours(alias.name)]
    return names


def missing(module: str, name: str | None) -> bool:
    if importlib.util.find_spec(module) is None:
        return True
    if name is None:
        return False
    found = importlib.import_module(module)
    if hasattr(found, name):
        return False
    return not hasattr(found, "__path__") or importlib.util.find_spec(f"{module}.{name}") is None  # a submodule


def test_the_check_reads_a_scripts_imports_and_finds_a_name_that_is_not_there():
    levers = imported_names(ROOT / "scripts" / "bench_draft_levers.py")
    assert ("specchat.models.draft_approx", "approximate_draft") in levers
    assert missing("specchat.models.draft_approx", "approximate_drafts") and missing("specchat.no_such_module", None)
    assert not missing("specchat.quant", "timing")  # a submodule no one imported yet is there too


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_a_script_imports_only_what_exists(script):
    absent = [f"{module}.{name}" if name else module for module, name in imported_names(script)
              if missing(module, name)]
    assert not absent, f"{script.name} imports what is not there: {', '.join(absent)}"
