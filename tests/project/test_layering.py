"""The package's rooms and who may import whom, read from the source with `ast` (nothing is
imported): a module imports only from its own layer or the layers below it."""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "specchat"

# Bottom to top; a room is a top-level module or subpackage of specchat. A new room must be
# placed here before the test passes.
LAYERS: list[set[str]] = [
    {"__init__", "errors", "paths", "progress", "textstream", "transfer", "limits", "diskspace", "memory_room",
     "corpora", "chat_template", "device_clock", "heap_trim", "machine_choices", "machine_links", "schema_file",
     "alignment", "stopwatch", "capture_gate", "cuda_graph", "bounded_attention", "cuda_device", "dtypes", "version",
     "tracing", "trace_summary", "quoted_code", "triton_support", "host_pull"},  # base
    {"quant"},
    {"checkpoint"},  # model assembly: skeletons, checkpoint sources, tensor names, layer layouts
    {"decoding", "offload"},  # siblings: neither imports the other
    {"models"},  # may import offload and quant
    {"plan"},  # the memory plan: may import models, offload and quant; offload never imports it
    {"dsi"},
    {"runtime", "engine_options", "loader", "probe_cache", "reply_loop"},
    {"summary", "tui", "serve", "bench", "simulate", "doctor", "cli", "cli_options", "cli_generate",
     "__main__"},  # front ends
]
MAX_MODULE_LINES = 300  # the house rule: past it, a module is split by what it does
SIBLINGS = [("decoding", "offload")]  # rooms of one layer that must not import each other
FRONT_ENDS_SEEING_ONLY_THE_PROTOCOL = ("tui", "serve")
# The Engine protocol and event types, and what SamplingParams carries for one reply: its grammar
# (guide.py: compiled from a schema, started per reply), its token log (token_log.py), its
# penalties (penalties.py: a request's, started per reply from its prompt, and its DRY: dry.py, the
# breakers as the tokenizer writes them), and the reply's sampling built from the settings the
# front ends name alike (reply_sampling.py: its mirostat started per reply), and its predicted
# output (prediction.py: its cursor, started per reply).
TUI_MAY_IMPORT_FROM_DECODING = {"specchat.decoding.events", "specchat.decoding.guide", "specchat.decoding.token_log",
                                "specchat.decoding.penalties", "specchat.decoding.dry",
                                "specchat.decoding.reply_sampling", "specchat.decoding.prediction"}
# What the plan reads of the streaming: the alignment of what it stores, the Placement it hands over,
# whether a layer file already holds its bytes, the GPU's free memory. Model assembly (skeletons,
# sources, tensor names, layouts, the layer file's name) it takes from checkpoint/.
PLAN_MAY_IMPORT_FROM_OFFLOAD = {"specchat.offload.direct_io", "specchat.offload.placement", "specchat.offload.storage",
                                "specchat.offload.cuda", "specchat.offload.pinned_chunks"}
CLI = ("cli", "cli_options", "cli_generate", "__main__")

LAYER_OF = {room: index for index, rooms in enumerate(LAYERS) for room in rooms}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    """specchat.offload.build -> offload; specchat -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def resolve_relative(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(path: Path) -> Iterator[tuple[str, int]]:
    """(imported specchat name, line) for every import in `path`, lazy ones in functions too."""
    module = module_name(path)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = resolve_relative(node, module, path.name == "__init__.py") if node.level else node.module
            names = [f"{source}.{alias.name}" for alias in node.names]  # y of `from x import y` may be a module
        else:
            continue
        for name in names:
            if name == "specchat" or name.startswith("specchat."):
                yield name, node.lineno


def edges() -> list[tuple[str, str, str]]:
    """(importer "path:line", importer module, imported name) across src/specchat."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for imported, line in imports_of(path):
            found.append((f"{path.relative_to(PACKAGE.parent)}:{line}", module_name(path), imported))
    return found


EDGES = edges()


def test_every_room_has_a_layer():
    rooms = {room_of(module_name(path)) for path in PACKAGE.rglob("*.py")}
    unplaced = rooms - set(LAYER_OF)
    assert not unplaced, f"place these rooms in LAYERS: {sorted(unplaced)}"


def test_no_import_runs_up_a_layer():
    upward = [
        f"{where}: {importer} imports {imported} ({room_of(imported)} is above {room_of(importer)})"
        for where, importer, imported in EDGES
        if LAYER_OF[room_of(imported)] > LAYER_OF[room_of(importer)]
    ]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize(("first", "second"), SIBLINGS)
def test_siblings_do_not_import_each_other(first, second):
    crossing = [
        f"{where}: {importer} imports {imported}"
        for where, importer, imported in EDGES
        if {room_of(importer), room_of(imported)} == {first, second}
    ]
    assert not crossing, "\n".join(crossing)


def test_offload_never_imports_models():
    reaching = [f"{where}: {importer} imports {imported}" for where, importer, imported in EDGES
                if room_of(importer) == "offload" and room_of(imported) == "models"]
    assert not reaching, "\n".join(reaching)


@pytest.mark.parametrize("front_end", FRONT_ENDS_SEEING_ONLY_THE_PROTOCOL)
def test_front_end_sees_only_the_engine_protocol_of_decoding(front_end):
    reaching = [
        f"{where}: {importer} imports {imported}"
        for where, importer, imported in EDGES
        if room_of(importer) == front_end and room_of(imported) == "decoding"
        and not any(imported == allowed or imported.startswith(allowed + ".") for allowed in TUI_MAY_IMPORT_FROM_DECODING)
    ]
    assert not reaching, "\n".join(reaching)


@pytest.mark.parametrize("front_end", FRONT_ENDS_SEEING_ONLY_THE_PROTOCOL)
def test_front_end_reaches_models_and_offload_only_through_runtime(front_end):
    """The chat and the server see placements, plans and models only as runtime hands them over."""
    reaching = [f"{where}: {importer} imports {imported}" for where, importer, imported in EDGES
                if room_of(importer) == front_end and room_of(imported) in ("offload", "quant")]
    assert not reaching, "\n".join(reaching)


def test_plan_imports_no_model_assembly_from_offload():
    reaching = [f"{where}: {importer} imports {imported}" for where, importer, imported in EDGES
                if room_of(importer) == "plan" and room_of(imported) == "offload"
                and not any(imported.startswith(allowed + ".") for allowed in PLAN_MAY_IMPORT_FROM_OFFLOAD)]
    assert not reaching, "\n".join(reaching)
    assert any(room_of(importer) == "plan" and room_of(imported) == "checkpoint" for _, importer, imported in EDGES)


def test_the_cli_meets_only_the_runtime_and_the_front_ends_it_fronts():
    """The CLI's modules import the runtime's layer (runtime, loader), the front ends it fronts
    (doctor, bench, the chat's screen, the server, simulate, summary) and base modules: what they
    need of decoding, dsi, models or the plan comes through the runtime's surface."""
    below_the_runtime = set().union(*LAYERS[1:LAYER_OF["runtime"]])
    reaching = [f"{where}: {importer} imports {imported}" for where, importer, imported in EDGES
                if room_of(importer) in CLI and room_of(imported) in below_the_runtime]
    assert not reaching, "\n".join(reaching)
    assert any(room_of(importer) == "cli" and room_of(imported) == "runtime" for _, importer, imported in EDGES)


def classes() -> dict[str, tuple[str, list[str], bool]]:
    """Classes of src/specchat: name -> (where, base names, defines `generate`)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base).split(".")[-1] for base in node.bases]
                generates = any(isinstance(item, ast.FunctionDef) and item.name == "generate" for item in node.body)
                found[node.name] = (f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", bases, generates)
    return found


def test_no_engine_subclasses_another_engine():
    """An engine defines `generate` (the `Engine` protocol itself aside); a subclass of an engine
    is an engine too, and a violation: engines share code by composition."""
    found = classes()
    engines = {name for name, (_, bases, generates) in found.items() if generates and "Protocol" not in bases}
    assert len(engines) >= 4  # the walk found the engines at all
    while grown := {name for name, (_, bases, _) in found.items() if set(bases) & engines} - engines:
        engines |= grown  # subclasses of subclasses
    subclassing = [f"{where}: {name} subclasses the engine {base}"
                   for name, (where, bases, _) in found.items() for base in bases if base in engines]
    assert not subclassing, "\n".join(subclassing)


def test_every_module_is_at_most_300_lines():
    lengths = {path: len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert len(lengths) > 100  # the walk found the package at all
    long = [f"{path.relative_to(PACKAGE.parent)}: {lines} lines" for path, lines in sorted(lengths.items())
            if lines > MAX_MODULE_LINES]
    assert not long, f"split these by what they do (at most {MAX_MODULE_LINES} lines):\n" + "\n".join(long)


def test_the_plan_has_one_room_that_loader_and_doctor_enter_through_plan_pair():
    """Planning lives in plan/: offload/ (below it) defines no planning function and never imports
    it, and `run` (loader) and `doctor` both make their plans through the one entry."""
    assert not [edge for edge in EDGES if room_of(edge[1]) == "offload" and room_of(edge[2]) == "plan"]
    planning = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
                for path in sorted((PACKAGE / "offload").rglob("*.py"))
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.FunctionDef) and node.name.startswith(("plan", "place", "measure_rooms"))]
    assert not planning, "planning belongs in plan/:\n" + "\n".join(planning)
    for caller in ("loader", "doctor.plan"):
        assert (f"specchat.{caller}", "specchat.plan.plan_pair") in {(e[1], e[2]) for e in EDGES}, caller


def test_the_plan_is_entered_through_its_front_door():
    """Outside plan/, its names come from `specchat.plan` (plan/__init__.py), never a module inside it."""
    modules = {path.stem for path in (PACKAGE / "plan").glob("*.py")} - {"__init__"}
    inside = [f"{where}: {importer} imports {imported}" for where, importer, imported in EDGES
              if room_of(importer) != "plan" and imported.split(".")[:2] == ["specchat", "plan"]
              and len(imported.split(".")) > 2 and imported.split(".")[2] in modules]
    assert not inside, "\n".join(inside)
    assert {edge[2] for edge in EDGES} >= {"specchat.plan.plan_pair"}  # the walk sees the door's imports


def text_tests(handler: ast.ExceptHandler) -> list[ast.Compare]:
    """Comparisons in an except clause that read the caught error's text: `str(error)`, or its `.args`."""
    def reads_text(node: ast.AST) -> bool:
        called = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" \
            and any(isinstance(arg, ast.Name) and arg.id == handler.name for arg in node.args)
        args = isinstance(node, ast.Attribute) and node.attr == "args" \
            and isinstance(node.value, ast.Name) and node.value.id == handler.name
        return called or args
    return [node for node in ast.walk(handler) if isinstance(node, ast.Compare)
            and any(reads_text(part) for part in ast.walk(node))]


def test_no_decision_reads_an_errors_words():
    """A refusal is a type with fields (errors.PlanRefusal: tier, bytes missing, the option that
    fits); no code decides by matching an error's message."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for path in sorted(PACKAGE.rglob("*.py"))
             for handler in ast.walk(ast.parse(path.read_text())) if isinstance(handler, ast.ExceptHandler)
             and handler.name for node in text_tests(handler)]
    assert not found, "\n".join(found)


def test_the_error_text_check_catches_a_match_on_words():
    source = "try:\n    f()\nexcept ValueError as error:\n    if 'short' in str(error):\n        pass\n"
    (handler,) = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ExceptHandler)]
    assert len(text_tests(handler)) == 1
