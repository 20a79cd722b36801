"""The chat's decoding speed against `generate`'s, the same prompt, engine and reply length, in one
run: what drawing the reply costs the decoding beside it. On two cores torch's two threads fill the
CPU, and every redraw of the reply's markdown (parsed and rendered again, a code block highlighted
whole) is time the decoding waits.

    python scripts/bench_chat_redraw.py [--engines autoregressive,specexec] [--max-new-tokens 210]

`specchat run` is driven in a pseudo-terminal (rendered by pyte: pip install pyte), `/max-tokens`
and the prompt typed, the reply's end read from its store, then its figures from `/stats`;
`specchat generate --json` runs the same prompt. A row per engine: the chat's tokens/s,
generate's, their ratio, and each one's target seconds. Each run is its own process, the chat's
history in a temporary directory.
"""

import argparse
import fcntl
import json
import os
import pty
import re
import select
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

PROMPT = "Write a Python function that checks whether a number is prime."
SIZE = (120, 50)  # columns, rows
LOAD_S = 60  # the models load before the prompt is typed (they are converted already)
STATS = re.compile(r"last reply: (\d+) tokens in (\d+) iterations .*?, ([\d.]+) tokens/s;\s*draft ([\d.]+) s, "
                   r"target ([\d.]+) s")


def reply_figures(screen: str) -> dict | None:
    """`/stats`' last reply: new tokens, iterations, tokens/s, draft and target seconds."""
    match = STATS.search(" ".join(line.strip().rstrip("▏").strip() for line in screen.splitlines()))
    if match is None:
        return None
    tokens, iterations, rate, draft, target = match.groups()
    return {"new_tokens": int(tokens), "iterations": int(iterations), "tokens_per_s": float(rate),
            "draft_s": float(draft), "target_s": float(target)}


def chat_figures(engine: str, max_new_tokens: int, timeout_s: float) -> dict:
    """Type the prompt into `specchat run`, wait for the reply, ask /stats, read its figures."""
    import pyte  # only this script needs a terminal emulator

    screen = pyte.Screen(*SIZE)
    stream = pyte.ByteStream(screen)
    with tempfile.TemporaryDirectory() as data:
        pid, fd = pty.fork()
        if pid == 0:
            env = dict(os.environ, SPECCHAT_DATA_DIR=data, TERM="xterm-256color")
            os.execvpe("specchat", ["specchat", "run", "--engine", engine], env)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))

        def pump(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if select.select([fd], [], [], 0.2)[0]:
                    try:
                        stream.feed(os.read(fd, 65536))
                    except OSError as error:  # the chat exited: what it showed last says why
                        raise SystemExit(f"{engine}: the chat exited:\n" + "\n".join(screen.display)) from error

        try:
            pump(LOAD_S)
            os.write(fd, f"/max-tokens {max_new_tokens}\r".encode())
            pump(1)
            os.write(fd, PROMPT.encode())
            pump(0.5)
            os.write(fd, b"\r")
            deadline = time.monotonic() + timeout_s
            while not reply_ended(Path(data) / "history.sqlite3"):  # asked apart: /stats is drawn too
                if time.monotonic() > deadline:
                    raise SystemExit(f"{engine}: the reply did not end within {timeout_s:g} s")
                pump(2)
            os.write(fd, b"/stats\r")
            pump(2)
            figures = reply_figures("\n".join(screen.display))
            if figures is None:
                raise SystemExit(f"{engine}: /stats showed no reply's figures:\n" + "\n".join(screen.display))
            return figures
        finally:
            os.kill(pid, signal.SIGTERM)  # the chat keeps its history and exits (tui/signals.py)
            os.waitpid(pid, 0)


def reply_ended(history: Path) -> bool:
    """Whether the chat's store holds an ended reply: one is stored from its start marked cut, and
    unmarked as it ends."""
    if not history.exists():
        return False
    with sqlite3.connect(f"file:{history}?mode=ro", uri=True) as store:
        return store.execute("SELECT 1 FROM messages WHERE role = 'assistant' AND cut = 0").fetchone() is not None


def generate_figures(engine: str, max_new_tokens: int) -> dict:
    out = subprocess.run(["specchat", "generate", PROMPT, "--engine", engine, "--max-new-tokens", str(max_new_tokens),
                          "--json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["summary"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="autoregressive,specexec")
    parser.add_argument("--max-new-tokens", type=int, default=210)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a chat reply may take")
    args = parser.parse_args()
    print("| engine | chat tokens/s | generate tokens/s | chat / generate | chat target s | generate target s |")
    print("|---|---|---|---|---|---|")
    for engine in args.engines.split(","):
        chat = chat_figures(engine, args.max_new_tokens, args.timeout)
        alone = generate_figures(engine, args.max_new_tokens)
        ratio = chat["tokens_per_s"] / alone["tokens_per_s"]
        print(f"| {engine} | {chat['tokens_per_s']:.2f} | {alone['tokens_per_s']:.2f} | {ratio:.2f} | "
              f"{chat['target_s']:.2f} | {alone['target_s']:.2f} |", flush=True)
        print(f"  chat: {chat}\n  generate: {alone}", file=sys.stderr)


if __name__ == "__main__":
    main()
