"""What the chat app needs from a model runtime; the app depends on nothing else.

A real backend wraps the loaded models (see `runtime_backend`); tests use `fake.FakeBackend`.
"""

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from specchat.decoding.dry import Restarts
from specchat.decoding.events import Engine
from specchat.decoding.guide import Guide
from specchat.decoding.prediction import Prediction
from specchat.tui.settings import DecodingSettings


class ReplyStream(Protocol):
    """Incremental detokenization of one reply, like `specchat.textstream.TextStream`."""

    def push(self, token_ids: list[int]) -> str: ...

    def finish(self) -> str: ...


class ChatBackend(Protocol):
    name: str  # shown in the title, e.g. the model pair
    engine: Engine  # the engine used for the next reply
    engine_names: tuple[str, ...]  # what /engine accepts
    settings: DecodingSettings  # the starting settings (budget and depth as the engine has them)
    context: int  # the target's context window
    max_budget: int  # the largest draft tree the memory plan made room for
    transfer_label: str  # where offloaded weights come from: "PCIe", "RAM", "disk" or "" (none)

    def encode(self, messages: list[dict]) -> list[int]:
        """Prompt ids for chat `messages` ({"role", "content"}), ready for the assistant's turn."""
        ...

    def new_text_stream(self) -> ReplyStream: ...

    def guide(self, form: dict | str) -> Guide:
        """A reply's guide to JSON valid under `form`, a JSON schema, or to the language of `form`, a
        grammar's text (GBNF or Lark); SpecchatError in one line when it cannot be compiled."""
        ...

    def breakers(self) -> Restarts:
        """DRY's default sequence breakers as this tokenizer writes them (decoding/dry.py)."""
        ...

    def prediction(self, message: str) -> Prediction | None:
        """The predicted output of a reply to the user's `message`: the code it quotes, as this
        tokenizer writes it (decoding/prediction.py's quoted_prediction); None where it quotes none."""
        ...

    def use_engine(self, name: str) -> Engine:
        """Switch `engine` to the one called `name` (one of `engine_names`) and return it."""
        ...

    def close(self) -> None:
        """Release the models (loader thread, layer file, workers); called once, as the app exits."""
        ...


def settings_for(engine: Engine, settings: DecodingSettings) -> DecodingSettings:
    """`settings` for a backend starting on `engine`: its name, and the values it holds for the
    live settings it honours (budget and depth for tree engines, lookahead for dsi)."""
    live = engine.live_settings()
    values = {"budget": live.budget, "depth": live.depth, "lookahead": live.lookahead}
    honoured = {field: value for field, value in values.items() if value is not None}
    return replace(settings, engine=engine.name, **honoured)


Progress = Callable[[str, float | None], None]  # a step's description and, if known, the fraction done
Loader = Callable[[Progress], ChatBackend]  # runs in a worker thread while the loading screen shows
