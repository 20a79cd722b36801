"""Loading a checkpoint one decoder layer at a time, each prepared as it arrives
(models/layerwise.py): the model equals one loaded whole and prepared after, and no more than one
layer is ever dense beside the prepared ones."""

import torch
from helpers.tiny import build_tiny, perturbed
from torch import nn

from specchat.decoding.kvcache import new_cache
from specchat.models.draft_approx import DraftApprox, approximate_draft
from specchat.models.layerwise import load_layer_by_layer, prepare_loaded
from specchat.progress import Reporter

CPU = torch.device("cpu")


class CharTokenizer:
    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(char) % 50 for char in text]}


class Watching(DraftApprox):
    """A DraftApprox that records, as each layer is handed over, how many layers hold dense linears."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dense_layers: list[int] = []
        self.model: nn.Module | None = None

    def prepare_head(self, model, tokenizer, directory) -> None:
        self.model = model
        super().prepare_head(model, tokenizer, directory)

    def prepare_layer(self, layer: nn.Module) -> None:
        layers = self.model.get_decoder().layers
        self.dense_layers.append(sum(any(type(m) is nn.Linear and not m.weight.is_meta for m in each.modules())
                                     for each in layers))
        super().prepare_layer(layer)


def saved_draft(tmp_path):
    draft = perturbed(build_tiny(0, dtype=torch.float32), 0.3, seed=1)
    draft.model.save_pretrained(tmp_path / "model")
    return draft, tmp_path / "model"


def logits(model, tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor(tokens)
    with torch.inference_mode():
        return model.logits(model.hidden(ids, torch.arange(len(tokens)), new_cache()))


def test_a_model_prepared_as_it_loads_equals_one_prepared_after(tmp_path):
    draft, directory = saved_draft(tmp_path)
    approx = Watching(True, 20, stop_ids=frozenset({49}))
    loaded = load_layer_by_layer(directory, CharTokenizer(), torch.float32, CPU, approx, Reporter(False))
    layered = approx.draft(loaded)
    whole = approximate_draft(draft.model, CharTokenizer(), directory, True, 20, frozenset({49}))
    assert torch.equal(layered.vocab, whole.vocab)
    assert torch.equal(logits(layered, [1, 5, 9, 2]), logits(whole, [1, 5, 9, 2]))
    # each layer is the only dense one when it is handed over: the ones before it are int8, the
    # ones after it not loaded yet
    assert approx.dense_layers == [1, 1]
    assert not any(type(m) is nn.Linear for m in loaded.get_decoder().modules())


class Keeping:
    """A preparation that maps the token embedding and keeps it as the file holds it, recording what
    it is handed: the embedding's dtype at the head, then each layer."""

    EMBEDDING = "model.embed_tokens.weight"

    def __init__(self) -> None:
        self.head_dtypes: list[torch.dtype] = []
        self.layers: list[nn.Module] = []

    def mapped(self, model) -> frozenset[str]:
        return frozenset({self.EMBEDDING})

    def on_host(self, model) -> frozenset[str]:
        return frozenset()

    def prepare_head(self, model, tokenizer, directory) -> None:
        self.head_dtypes.append(model.get_parameter(self.EMBEDDING).dtype)

    def prepare_layer(self, layer: nn.Module) -> None:
        self.layers.append(layer)


def test_a_mapped_parameter_the_preparation_keeps_is_copied_in_the_models_dtype_as_each_layer_is_reported(tmp_path):
    draft, directory = saved_draft(tmp_path)  # a float32 file
    keeping, steps = Keeping(), []
    reporter = Reporter(False, lambda text, fraction: steps.append((text, fraction)))
    loaded = load_layer_by_layer(directory, CharTokenizer(), torch.bfloat16, CPU, keeping, reporter)
    assert steps == [("loading and preparing layer 1/2", 0.5), ("loading and preparing layer 2/2", 1.0)]
    assert keeping.head_dtypes == [torch.float32]  # the file's tensor, memory-mapped, at the head
    embedding = loaded.get_parameter(Keeping.EMBEDDING)
    assert embedding.dtype == torch.bfloat16
    assert torch.equal(embedding, draft.model.get_parameter(Keeping.EMBEDDING).to(torch.bfloat16))
    assert keeping.layers == list(loaded.get_decoder().layers)  # every layer, in order, once
    assert not any(parameter.requires_grad for parameter in loaded.parameters())  # inference only


def test_the_checkpoints_stop_tokens_are_read_as_from_pretrained_reads_them(tmp_path):
    draft = build_tiny(0, dtype=torch.float32)
    draft.model.generation_config.eos_token_id = [7, 9]
    draft.model.save_pretrained(tmp_path / "model")
    loaded = load_layer_by_layer(tmp_path / "model", CharTokenizer(), torch.float32, CPU, Keeping(), Reporter(False))
    assert loaded.generation_config.eos_token_id == [7, 9]


def test_a_model_loaded_whole_is_prepared_at_its_head_and_every_layer():
    model = build_tiny(0, dtype=torch.float32).model
    keeping = Keeping()
    prepare_loaded(model, CharTokenizer(), None, keeping)
    assert keeping.head_dtypes == [torch.float32] and keeping.layers == list(model.get_decoder().layers)
