"""The suite's own shape (issue 49), read with `ast`: tests/ mirrors src/specchat/ (the tests of
src/specchat/X/y.py under tests/X/, of a top-level module in tests/ itself), what tests share lives
in tests/helpers/ and is imported by name, never from conftest or another test module, and the
modules of the real pair are in tests/real/."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = TESTS.parent / "src" / "specchat"
# Folders that mirror no package: the shared code and its tests, the GPU check's code, the modules
# of the real pair, the tests of scripts/ and those of the repository as a whole.
OWN_FOLDERS = {"helpers", "gpu_checks", "real", "scripts", "project"}
# Two real modules read the bf16 bounds where they are measured and argued (test_real_defaults.py).
IMPORTS_ALLOWED = {("real/test_real_compact.py", "test_real_defaults"),
                   ("real/test_moe_upcycled_real.py", "test_real_defaults")}


def all_test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def imported_modules(path: Path) -> set[str]:
    """The top-level names of every module `path` imports, wherever in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def is_real_module(path: Path) -> bool:
    """A module whose tests are all `real`: `pytestmark = pytest.mark.real` (alone or in a list), or
    each test function marked."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            if "mark.real" in ast.unparse(node.value):
                return True
    tests = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    return bool(tests) and all(any("mark.real" in ast.unparse(d) for d in test.decorator_list) for test in tests)


def test_every_test_folder_mirrors_a_package_or_is_the_suites_own():
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    folders = {path.relative_to(TESTS).parts[0] for path in all_test_files() if path.parent != TESTS}
    assert folders - packages - OWN_FOLDERS == set()


def test_every_package_has_a_test_folder():
    """A package's modules are tested in its own folder (the model-assembly package, checkpoint/,
    once had its tests spread over offload/ and quant/, and none of its own)."""
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    folders = {path.relative_to(TESTS).parts[0] for path in all_test_files() if path.parent != TESTS}
    assert packages - folders == set()


def test_no_test_at_the_top_names_a_package_or_a_module_in_one():
    """tests/test_<x>.py is for top-level modules: one named for a package (test_tui_...) or for a
    module inside one and none at the top belongs in that package's folder."""
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    top = {path.stem for path in PACKAGE.glob("*.py")}
    inner = {path.stem for path in PACKAGE.glob("*/*.py")} - top
    stray = [path.name for path in sorted(TESTS.glob("test_*.py"))
             if path.stem.removeprefix("test_") in inner
             or any(path.stem.removeprefix("test_").split("_")[0] == package for package in packages)]
    assert stray == []


def test_test_file_names_are_unique():
    """pytest's default import mode imports a test module by its file name alone."""
    names = [path.name for path in all_test_files()]
    assert sorted(name for name in set(names) if names.count(name) > 1) == []


def test_tests_import_nothing_from_conftest_or_another_test_module():
    found = {(path.relative_to(TESTS).as_posix(), module)
             for path in [*all_test_files(), *(TESTS / "helpers").glob("*.py"), *(TESTS / "gpu_checks").glob("*.py")]
             for module in imported_modules(path) if module == "conftest" or module.startswith("test_")}
    assert found - IMPORTS_ALLOWED == set()


def test_modules_of_the_real_pair_are_in_real():
    outside = [path.relative_to(TESTS).as_posix() for path in all_test_files()
               if is_real_module(path) and path.parent.name != "real"]
    assert outside == []
