"""forward.CausalLM's inputs on the device: sent through one sender made at the first send, and a
step's tokens and positions moved together, in one pull beside a GPU (host_pull.py)."""

import torch

from specchat.decoding.forward import CausalLM


class SendsOnCuda(CausalLM):
    """A model whose device says CUDA, its sends recorded and kept on the host (no GPU here)."""

    sent: list[torch.Tensor]

    @property
    def device(self) -> torch.device:
        return torch.device("cuda")

    def send(self, host: torch.Tensor) -> torch.Tensor:
        self.sent.append(host)
        return host


def test_a_model_sends_through_one_sender_made_at_its_first_send(tiny_draft):
    model = CausalLM(tiny_draft.model)
    assert model.sender is None
    assert model.send(torch.tensor([3, 1])).tolist() == [3, 1]
    first = model.sender
    model.send(torch.tensor([2]))
    assert first is not None and model.sender is first


def test_beside_a_gpu_a_steps_tokens_and_positions_go_over_in_one_send(tiny_draft):
    model = SendsOnCuda(tiny_draft.model)
    model.sent = []
    tokens, positions = model.rows_on_device(torch.tensor([5, 6, 7], dtype=torch.int32), torch.arange(10, 13))
    assert len(model.sent) == 1 and model.sent[0].dtype == torch.long
    assert tokens.tolist() == [[5, 6, 7]] and positions.tolist() == [[10, 11, 12]]


def test_rows_already_on_the_models_device_are_only_shaped():
    model = CausalLM(torch.nn.Linear(1, 1))
    model.model.device = torch.device("cpu")  # what send asks of a model: its device
    tokens, positions = model.rows_on_device(torch.tensor([4, 2]), torch.tensor([0, 1]))
    assert tokens.tolist() == [[4, 2]] and positions.tolist() == [[0, 1]] and model.sender is None
