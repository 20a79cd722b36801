"""`specchat serve`: bind, load the models once, build the engines, print the URL, serve."""

import logging
import sys
from dataclasses import dataclass

from specchat.decoding.events import Engine
from specchat.errors import SpecchatError
from specchat.limits import DEFAULT_POOLING, POOLINGS, SLOTS
from specchat.loader import load_models
from specchat.engine_options import EngineOptions
from specchat.plan import AUTO_SLOTS
from specchat.runtime import Models, live_settings_of
from specchat.serve.app import build_app
from specchat.serve.endpoint import ServeConfig
from specchat.serve.fim import fim_tokens
from specchat.serve.listen import bind, is_loopback, server_for, url_of
from specchat.serve.scheduler import Scheduler
from specchat.serve.schema import Defaults


@dataclass(frozen=True)
class Serving:
    host: str
    port: int
    api_key: str | None
    max_queue: int  # requests waiting beyond the one decoding; past it, 429
    slots: int | None  # engines, each keeping one conversation's caches; None: auto (plan/conversations.py)
    log_prompts: bool
    pooling: str = DEFAULT_POOLING  # how embeddings pool the target's rows


def check_serving(serving: Serving) -> None:
    if not 0 <= serving.port <= 65535:
        raise SpecchatError(f"--port must be between 0 and 65535 (got {serving.port})")
    if serving.max_queue < 0:
        raise SpecchatError(f"--max-queue must be >= 0 (got {serving.max_queue})")
    if serving.slots is not None:
        SLOTS.check("--slots", serving.slots)
    if serving.pooling not in POOLINGS:
        raise SpecchatError(f"--pooling must be one of {', '.join(POOLINGS)} (got {serving.pooling!r})")
    if serving.api_key is not None and not serving.api_key.strip():
        raise SpecchatError("--api-key is empty: give a key, or leave the option out")


def slot_count(models: Models, asked: int | None) -> int:
    """The engines to build: as many conversations as the plan keeps KV room for (auto's choice,
    where none was asked); dsi's Ray actors plan their own memory, so there what was asked."""
    if models.memory is not None:
        return models.memory.conversations
    return asked or AUTO_SLOTS


def check_kept(sampling: Defaults, engine: Engine) -> None:
    """The server's penalties and mirostat need an engine that applies them as each token is emitted."""
    if sampling.penalizes and not engine.keeps_forms:
        raise SpecchatError(f"--engine {engine.name} cannot penalize repeats: serve with specexec or autoregressive, "
                            "or leave out --repeat-penalty, --presence-penalty, --frequency-penalty and "
                            "--dry-multiplier")
    if sampling.mirostat and not engine.keeps_forms:
        raise SpecchatError(f"--engine {engine.name} cannot sample by mirostat: serve with specexec or "
                            "autoregressive, or leave out --mirostat")


def exposure_warning(serving: Serving) -> str | None:
    """A warning when other machines can reach a server that asks no key."""
    if serving.api_key is None and not is_loopback(serving.host):
        return (f"warning: listening on {serving.host} without an API key: anyone who can reach this address "
                "can use the server (set --api-key or SPECCHAT_API_KEY)")
    return None


def show_request_log() -> None:
    """The request lines on stderr, with their time; other libraries' logs stay quiet."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger = logging.getLogger("specchat.serve")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def run_server(options: EngineOptions, serving: Serving, sampling: Defaults) -> None:
    check_serving(serving)
    if warning := exposure_warning(serving):
        print(warning, file=sys.stderr)
    sock = bind(serving.host, serving.port)
    try:
        models = load_models(options, conversations=serving.slots)  # each slot keeps its KV caches
        try:
            slots = slot_count(models, serving.slots)
            engines = [models.engine(options.engine, live_settings_of(options)) for _ in range(slots)]
            check_kept(sampling, engines[0])
            config = ServeConfig(model=options.target, tokenizer=models.tokenizer, stop_ids=models.stop_ids,
                                 context=models.context, sampling=sampling, api_key=serving.api_key,
                                 log_prompts=serving.log_prompts, grammars=models.grammars,
                                 fim=fim_tokens(models.tokenizer), pooling=serving.pooling)
            app = build_app(config, Scheduler(engines, serving.max_queue))
            show_request_log()
            kept = f"{slots} slot{'s' * (slots > 1)}"
            print(f"serving {options.target} ({options.engine}, {kept}) at {url_of(sock)}/v1 ; Ctrl+C stops",
                  flush=True)
            try:
                server_for(app).run(sockets=[sock])
            except KeyboardInterrupt:  # uvicorn re-raises the Ctrl+C it shut down on: the way to stop
                print("stopped", file=sys.stderr)
        finally:
            models.close()
    finally:
        sock.close()
