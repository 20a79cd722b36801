"""The ChatBackend over real models: a loaded `specchat.runtime.Runtime` and its tokenizer."""

from dataclasses import replace

from transformers import PreTrainedTokenizerBase

from specchat.decoding.events import Engine
from specchat.decoding.specexec import SpecExecEngine
from specchat.errors import SpecchatError
from specchat.runtime import DRAFTED_ENGINES, ENGINES, EngineOptions, Runtime, build_runtime, make_engine
from specchat.textstream import TextStream
from specchat.tui.backend import Loader, Progress
from specchat.tui.settings import DecodingSettings


def transfer_label(device_type: str, offload: str) -> str:
    """Where offloaded weights travel from, as the panels name it; "" when nothing is offloaded."""
    if offload == "none":
        return ""
    return "PCIe" if device_type == "cuda" else {"ram": "RAM", "disk": "disk"}[offload]


def engines_of(engine: Engine) -> dict[str, Engine]:
    """The engines /engine can switch between: with a draft loaded, every engine over the same
    models (the one running first); the target alone otherwise."""
    if not isinstance(engine, SpecExecEngine):  # SpecInfer and chain SD derive from it too
        return {engine.name: engine}
    # dsi needs target workers, which only `run --engine dsi` starts
    others = {name: make_engine(name, engine.target, engine.draft, engine.stop_ids, engine.shape)
              for name in ENGINES if name not in (engine.name, "dsi")}
    return {engine.name: engine, **others}


def live_settings_of(engine: Engine) -> dict[str, int]:
    """The DecodingSettings fields `engine` reads while decoding, as it holds them now."""
    shape = getattr(engine, "shape", None)  # only tree engines have one
    if shape is not None:
        return {"budget": shape.budget, "depth": shape.max_depth}
    lookahead = getattr(engine, "lookahead", None)  # only dsi has one
    return {"lookahead": lookahead} if lookahead is not None else {}


class RuntimeBackend:
    def __init__(
        self, runtime: Runtime, name: str, settings: DecodingSettings, context_tokens: int, transfer_label: str
    ) -> None:
        if runtime.tokenizer.chat_template is None:
            raise SpecchatError(f"{name} has no chat template: `specchat run` needs a chat (instruct) model")
        self.tokenizer: PreTrainedTokenizerBase = runtime.tokenizer
        self.engines = engines_of(runtime.engine)
        self.engine_names = tuple(self.engines)
        self.engine = runtime.engine
        self.name = name
        self.context_tokens = context_tokens
        self.transfer_label = transfer_label
        self.settings = replace(settings, engine=runtime.engine.name, **live_settings_of(runtime.engine))

    def encode(self, messages: list[dict]) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"])

    def new_text_stream(self) -> TextStream:
        return TextStream(self.tokenizer)

    def use_engine(self, name: str) -> Engine:
        self.engine = self.engines[name]
        return self.engine


def runtime_loader(options: EngineOptions, settings: DecodingSettings) -> Loader:
    """A loader for SpecchatApp that builds the runtime for `options` behind the loading screen."""

    name = f"{options.target} + {options.draft}" if options.engine in DRAFTED_ENGINES else options.target

    def load(progress: Progress) -> RuntimeBackend:
        # Steps go to the loading screen only: bars on stderr would land in the middle of the app.
        runtime = build_runtime(options, progress=False, report=progress)
        return RuntimeBackend(
            runtime, name, settings,
            context_tokens=runtime.context_tokens,
            transfer_label=transfer_label(runtime.device.type, options.offload),
        )

    return load
