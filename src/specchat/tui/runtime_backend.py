"""The ChatBackend over real models: the loaded `specchat.runtime.Models` and engines over them."""

from transformers import PreTrainedTokenizerBase

from specchat.chat_template import encode_chat
from specchat.decoding.dry import DEFAULT_BREAKERS, Restarts, restart_sequences
from specchat.decoding.events import Engine
from specchat.decoding.guide import Guide
from specchat.decoding.prediction import Prediction, quoted_prediction
from specchat.errors import SpecchatError
from specchat.loader import load_models
from specchat.engine_options import DRAFTED_ENGINES, EngineOptions
from specchat.runtime import Models, live_settings_of
from specchat.textstream import TextStream
from specchat.tui.backend import Loader, Progress, settings_for
from specchat.tui.settings import DecodingSettings


class RuntimeBackend:
    def __init__(self, models: Models, first: Engine, name: str, settings: DecodingSettings,
                 transfer_label: str) -> None:
        """`first` is the engine of the first reply; /engine offers every engine `models` runs."""
        if models.tokenizer.chat_template is None:
            raise SpecchatError(f"{name} has no chat template: `specchat run` needs a chat (instruct) model")
        self.models = models
        self.tokenizer: PreTrainedTokenizerBase = models.tokenizer
        others = {other: models.engine(other, first.live_settings())
                  for other in models.engine_names() if other != first.name}
        self.engines = {first.name: first, **others}
        self.engine_names = tuple(self.engines)
        self.engine = first
        self.name = name
        self.context = models.context
        self.max_budget = models.max_budget()
        self.transfer_label = transfer_label
        self.settings = settings_for(first, settings)

    def encode(self, messages: list[dict]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    def new_text_stream(self) -> TextStream:
        return TextStream(self.tokenizer)

    def guide(self, form: dict | str) -> Guide:
        grammars = self.models.grammars()
        return (grammars.json_schema(form) if isinstance(form, dict) else grammars.grammar(form)).start()

    def breakers(self) -> Restarts:
        return restart_sequences(self.tokenizer, DEFAULT_BREAKERS)

    def prediction(self, message: str) -> Prediction | None:
        return quoted_prediction(message, self.tokenizer)

    def use_engine(self, name: str) -> Engine:
        self.engine = self.engines[name]
        return self.engine

    def close(self) -> None:
        self.models.close()


def runtime_loader(options: EngineOptions, settings: DecodingSettings) -> Loader:
    """A loader for SpecchatApp that builds the runtime for `options` behind the loading screen."""

    name = f"{options.target} + {options.draft}" if options.engine in DRAFTED_ENGINES else options.target

    def load(progress: Progress) -> RuntimeBackend:
        # Steps go to the loading screen only: bars on stderr would land in the middle of the app.
        models = load_models(options, progress=False, report=progress)
        try:
            first = models.engine(options.engine, live_settings_of(options))
            return RuntimeBackend(models, first, name, settings, models.transfer_label())
        except BaseException:
            models.close()
            raise

    return load
