"""What one draft step costs in a form the plan may give the draft, measured on this machine before
anything loads: the plan weighs a form's speed against the bytes it leaves to stream
(plan/choice.py), so a 4-bit draft that frees room for resident target layers but steps slower is
taken only where the iteration it predicts is shorter.

A step is timed as its decoder layers run it: PROBE_LAYERS layers built from the draft's config
with random weights on the device, in the form (models/draft_approx.py prepares them as a loading
draft's), run over one token and over `wide` tokens, scaled to the draft's layer count. Its
embedding, head and attention over the context are left out: the forms differ in the decoder's
linears alone (an int8 head aside), so the figure compares forms and understates a step by the
head's share. On CUDA each width's layers are captured in a graph and replayed, as a loaded draft's
step is (decoding/static_step.py): timed eagerly they carried each form's launches, and fp8's
(its activations scaled and cast before every product) read 25.1 ms a step at 86 tokens of
Llama-3.1-8B on an H200 where its captured step took ~9, so auto never weighed fp8 as it runs
(2026-11-30). Measured once per machine and kept (machine_choices.remembered), as quant's choices are; a form
only bitsandbytes runs (nf4) is not measured here. A draft stored in 4 bits is timed as its dense
config's, packed (rounded to 4 bits) or expanded (full weights): `timed_form`.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.initialization import no_init_weights

from specchat.checkpoint.skeleton import without_quantization
from specchat.cuda_graph import replayed
from specchat.machine_choices import Kept, measured, remembered, write_kept
from specchat.models.configs import read_config
from specchat.models.draft import DraftQuant, approximation
from specchat.quant.timing import best_seconds
from specchat.quant.widths import arguments

# Distinct layers timed in turn: a single one would sit in a CPU's last-level cache (a 0.5B's
# layer is 30 MB in bf16) and flatter the dense form.
PROBE_LAYERS = 4
MEASURED_KINDS = ("none", "int8", "int4", "fp8")
CHOICE = "draft step"  # its name among the kept choices


@dataclass(frozen=True)
class StepCost:
    """A draft step's seconds over one token and over `wide` tokens."""

    one_s: float
    wide_s: float
    wide: int

    def seconds(self, tokens: int) -> float:
        """A step over `tokens` tokens, linear between (and past) the two widths measured."""
        if self.wide == 1:
            return self.one_s
        return self.one_s + (self.wide_s - self.one_s) * (tokens - 1) / (self.wide - 1)


def step_cost(draft: str, quant: DraftQuant, dtype: torch.dtype, device: torch.device, wide: int) -> StepCost | None:
    """The draft `draft` (an alias or a checkpoint, read for its config) in `quant`: its step's
    cost on `device`, as kept for this machine or measured now; None for a form not measured here."""
    if timed_form(read_config(draft), quant)[1].kind not in MEASURED_KINDS:
        return None
    # "replayed": an eager figure kept before CUDA's steps were timed replayed is not reused
    key = {"draft": draft, "quant": quant.kind, "dense_above": quant.dense_above, "dtype": str(dtype), "wide": wide,
           "replayed": device.type == "cuda"}
    one_s, wide_s = remembered(CHOICE, key, device, lambda: measure_kept(key, device))
    return StepCost(one_s, wide_s, wide)


def measure_again(kept: Kept) -> Kept:
    """A kept step cost measured now and kept, whatever the load (`specchat doctor --measure-again`)."""
    fresh = measured(kept.choice, kept.key, torch.device(kept.device), lambda: measure_kept(kept.key, kept.device))
    write_kept(fresh)
    return fresh


def measure_kept(key: dict, device: torch.device | str) -> list[float]:
    """`measure_step` of what a kept step cost's `key` names."""
    named = arguments(key)  # its dtype by name in the file
    return measure_step(read_config(named["draft"]), DraftQuant(named["quant"], named["dense_above"]), named["dtype"],
                        torch.device(device), named["wide"])


def measure_step(config: PretrainedConfig, quant: DraftQuant, dtype: torch.dtype, device: torch.device,
                 wide: int) -> list[float]:
    """[seconds over one token, over `wide` tokens] of a step of the draft of `config` in `quant`."""
    model = probe_model(*timed_form(config, quant), dtype, device)
    scale = config.num_hidden_layers / len(model.model.layers)
    seconds = timed_layers(model, (1, wide), dtype, device)
    del model
    if device.type == "cuda":  # the probe's memory back to the device before the plan measures its free room
        torch.cuda.empty_cache()
    return [each * scale for each in seconds]


def timed_form(config: PretrainedConfig, quant: DraftQuant) -> tuple[PretrainedConfig, DraftQuant]:
    """The config and form a step is timed in: a draft stored in 4 bits (GPTQ, AWQ) as the dense
    model of its config, its packed form (none) rounded to 4 bits in groups of 128, as GPTQ and AWQ
    store them (the same Int4Linears and kernels; random weights either way), its expanded form
    (dense) in full weights, its fp8 form as fp8."""
    if getattr(config, "quantization_config", None) is None:
        return config, quant
    return without_quantization(config), DraftQuant({"dense": "none", "fp8": "fp8"}.get(quant.kind, "int4"))


@torch.inference_mode()
def timed_layers(model: nn.Module, widths: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> list[float]:
    """The fastest of the probe's trials of the decoder layers over each of `widths` tokens, in
    turns; on CUDA each width replayed from a graph captured once (cuda_graph.replayed), as the
    draft's step runs."""
    runs = []
    for tokens in widths:
        hidden, rotary = layer_inputs(model, tokens, dtype, device)
        runs.append(replayed(lambda hidden=hidden, rotary=rotary: run_layers(model, hidden, rotary), device))
    return best_seconds(runs, device)


def probe_model(config: PretrainedConfig, quant: DraftQuant, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """A few of the draft's decoder layers with random weights on `device`, prepared in `quant`."""
    fields = config.to_dict()
    fields["num_hidden_layers"] = layers = min(PROBE_LAYERS, config.num_hidden_layers)
    if fields.get("layer_types"):  # one entry a layer (sliding or full attention): the first layers'
        fields["layer_types"] = fields["layer_types"][:layers]
    probe = config.__class__.from_dict(fields)
    # Random weights for the timed layers only: the embedding and the head, never run here, stay
    # unwritten (drawing a 0.5B draft's 136M-row vocabulary took ~5 s of a 6 s probe on 2 cores).
    with torch.device(device), no_init_weights():
        model = AutoModelForCausalLM.from_config(probe, dtype=dtype).eval()
    model.model.layers.apply(model._init_weights)  # as transformers initializes them
    approximation(quant, None, dtype, device).prepared(model)  # as the draft's own layers run
    return model


def layer_inputs(model: nn.Module, tokens: int, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Random hidden states of `tokens` new tokens at positions from 0, and their rotary angles:
    made once a width, outside what a graph captures."""
    hidden = torch.randn(1, tokens, model.config.hidden_size, dtype=dtype, device=device)
    positions = torch.arange(tokens, device=device)[None]
    return hidden, model.model.rotary_emb(hidden, positions)


def run_layers(model: nn.Module, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The decoder layers over `hidden`'s tokens (causal, no cache)."""
    for layer in model.model.layers:
        hidden = layer(hidden, position_embeddings=rotary)  # transformers 5's layers return the tensor
    return hidden
