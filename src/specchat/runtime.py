"""The options' checks against this machine, and the loaded models (one `Models` bundle, made by
`loader.load_models`) -> engines over them. The CLI's heavy surface: what it needs of decoding,
dsi, models or the plan once a command runs it imports from here (marked "for the CLI"), never
from those rooms; the options themselves, torch-free, are engine_options.py's."""

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from specchat.chat_template import encode_chat
from specchat.cuda_device import cuda_usable, unused_gpu
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.autosize import AutoSizer, Costs
from specchat.decoding.events import AUTO, Engine, LiveSettings, SamplingParams  # SamplingParams: for the CLI
from specchat.decoding.probe import Done, probe_costs
from specchat.decoding.forward import CausalLM
from specchat.decoding.guide import Grammars
from specchat.decoding.dry import DEFAULT_BREAKERS, restart_sequences  # for the CLI
from specchat.decoding.penalties import Penalties, counted_from, settings_penalties  # for the CLI
from specchat.decoding.reply_sampling import reply_sampling  # for the CLI
from specchat.decoding.prediction import quoted_prediction  # for the CLI
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.specinfer import SPECINFER
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.dsi.build import default_workers  # for the CLI
from specchat.dsi.engine import DSIEngine
from specchat.dsi.remote import import_ray
from specchat.dsi.workers import WorkerPool, parse_devices
from specchat.engine_options import EngineOptions, check_named_models, check_values
from specchat.errors import SpecchatError
from specchat.limits import BUDGET, DEFAULT_LOOKAHEAD, DEFAULT_MAX_DEPTH, auto_cap, default_budget
from specchat.models.loading import has_int4
from specchat.models.spec import resolve
from specchat.plan import Machine, MemoryPlan  # Machine: for the CLI
from specchat.offload.build import Offload
from specchat.offload.placement import Placement
from specchat.probe_cache import probe_path, probed_costs

@dataclass
class Models:
    """Everything one run loads, once: used by run, generate, bench and serve, which build their
    engines from it and never load anything themselves."""

    tokenizer: PreTrainedTokenizerBase
    stop_ids: frozenset[int]
    device: torch.device
    context: int  # the KV room the plan reserved: prompt and reply together
    target: CausalLM | None  # None when dsi's Ray actors hold the target
    draft: CausalLM | None = None  # None when no engine to run drafts
    offload: Offload | None = None
    placement: Placement | None = None  # where the target's layers went (None: --offload none)
    workers: WorkerPool | None = None  # dsi's target workers
    identity: dict = field(default_factory=dict)  # what was loaded and how: the cost probe's key
    costs: Costs | None = None  # --budget auto's measured costs, once probed
    memory: MemoryPlan | None = None  # every byte the run holds (None: dsi's Ray actors plan their own)
    compiler: Grammars | None = None  # grammars(): built once, when a reply first asks for a form

    def grammars(self) -> Grammars:
        """The compiler of grammars over this target's tokenizer and vocabulary (built at first use: ~1 s)."""
        if self.compiler is None:
            vocab = self.target.model.config.vocab_size if self.target is not None else len(self.tokenizer)
            self.compiler = Grammars(self.tokenizer, vocab, self.stop_ids)
        return self.compiler

    def engine_names(self) -> tuple[str, ...]:
        """The engines these models can run."""
        with_target = ("autoregressive",) if self.target is not None else ()
        trees = ("specexec", "sd", "specinfer") if self.target is not None and self.draft is not None else ()
        dsi = ("dsi",) if self.workers is not None and self.draft is not None else ()
        return with_target + trees + dsi

    def engine(self, name: str, settings: LiveSettings = LiveSettings()) -> Engine:
        """A new engine `name` over these models, with `settings` (None fields: the defaults)."""
        if name not in self.engine_names():
            raise SpecchatError(f"engine '{name}' cannot run on the loaded models: choose one of "
                                f"{', '.join(self.engine_names())}")
        if name == "autoregressive":
            return AutoregressiveEngine(self.target, self.stop_ids)
        if name == "dsi":
            lookahead = settings.lookahead if settings.lookahead is not None else DEFAULT_LOOKAHEAD
            return DSIEngine(self.draft, self.workers, self.stop_ids, lookahead)
        cuda, offloaded = self.device.type == "cuda", self.offload is not None
        depth = settings.depth if settings.depth is not None else DEFAULT_MAX_DEPTH
        budget = AUTO if settings.budget is None else settings.budget  # SpecExec sizes its trees by default
        ranked = bool(settings.ranked_tree)
        if name != "specexec":  # only SpecExec sizes its own trees: the others take the device's default
            budget = default_budget(cuda, offloaded) if budget == AUTO else budget
            return TreeEngine(TREE_STRATEGIES[name], self.target, self.draft, self.stop_ids,
                              TreeShape(budget=budget, max_depth=depth, ranked_tree=ranked))
        sizer = self.sizer() if budget == AUTO or self.costs is not None else None
        shape = TreeShape(budget=sizer.cap, max_depth=depth, sizer=sizer, ranked_tree=ranked) if budget == AUTO else \
            TreeShape(budget=budget, max_depth=depth, ranked_tree=ranked)
        return TreeEngine(SPECEXEC, self.target, self.draft, self.stop_ids, shape, sizer)

    def sizer(self, done: Done = lambda share: None) -> AutoSizer:
        """A fresh --budget auto sizer over this pair's costs, probed on first use (and kept in
        the user cache for the next run on this machine; probed again at a quiet startup when
        they were probed under load); `done` hears how far a probe has got."""
        if self.costs is None:
            self.costs = probed_costs(probe_path(self.device, self.identity),
                                      lambda: probe_costs(self.target, self.draft, self.auto_cap(), done))
        return AutoSizer(self.costs, self.auto_cap())

    def auto_cap(self) -> int:
        """auto's largest tree: the device's cap, or the smaller tree the memory plan made room for."""
        return min(auto_cap(cuda=self.device.type == "cuda", offloaded=self.offload is not None), self.max_budget())

    def max_budget(self) -> int:
        """The largest draft tree the memory plan made room for (its pass scores the root too)."""
        return BUDGET.high if self.memory is None else int(self.memory.tree_tokens) - 1

    def transfer_label(self) -> str:
        return transfer_label(self.device.type, self.placement)

    def close(self) -> None:
        """Stop the weight streamer's loader thread and close the layer file; stop DSI's workers."""
        if self.offload is not None:
            self.offload.close()
        if self.workers is not None:
            self.workers.close()


TREE_STRATEGIES = {strategy.name: strategy for strategy in (SPECEXEC, CHAIN_SD, SPECINFER)}


def transfer_label(device_type: str, placement: Placement | None) -> str:
    """Where streamed weights travel from, as the panels name it; "" when nothing streams."""
    if placement is None or not placement.streamed:
        return ""
    if device_type == "cuda":
        return "PCIe"
    return "disk" if placement.disk else "RAM"


def pick_device() -> torch.device:
    """The GPU where specchat's kernels run on it (cuda_device.py), else the CPU."""
    return torch.device("cuda" if cuda_usable() else "cpu")


def validate(options: EngineOptions) -> None:
    """Check what can be checked before loading anything; one clear line on failure: the values
    themselves (engine_options.check_values), then what they name on this machine."""
    check_values(options)
    if options.weights == "quantized" and not has_int4(resolve(options.target)):
        raise SpecchatError(f"--weights quantized runs a target from the 4-bit weights it stores, and {options.target} "
                            "stores none that specchat multiplies packed (GPTQ and AWQ checkpoints always run so): "
                            "use --weights dense or auto")
    if options.vram_budget is not None and not cuda_usable():
        why = unused_gpu() or "torch sees no GPU here"
        raise SpecchatError(f"--vram-budget caps GPU memory, and {why}: use --ram-budget")
    if options.engine == "dsi" and options.workers is not None:
        parse_devices(options.workers)
    if options.engine == "dsi" and options.ray_address is not None:
        import_ray()
    check_named_models(options)


def live_settings_of(options: EngineOptions) -> LiveSettings:
    """The engine settings named on the command line (a None budget: suited to the device)."""
    return LiveSettings(budget=options.budget, depth=options.max_depth, lookahead=options.lookahead,
                        ranked_tree=options.ranked_tree)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, raw: bool, system: str | None = None) -> list[int]:
    """Token ids of a single-turn chat (the model's chat template; `system` before the message), or
    of `prompt` as is."""
    if raw or tokenizer.chat_template is None:
        if system is not None:
            raise SpecchatError("--system goes into the chat template, which this prompt does not use (--raw, or a "
                                "target without one): drop it")
        ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    else:
        system_turn = [] if system is None else [{"role": "system", "content": system}]
        ids = encode_chat(tokenizer, [*system_turn, {"role": "user", "content": prompt}])
    if not ids:
        raise SpecchatError("the prompt is empty after tokenization: give some text")
    return ids
