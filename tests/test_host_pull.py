"""host_pull: the kernel that moves pinned host bytes onto a GPU by the GPU's own loads, run on the CPU
by Triton's interpreter and compared byte for byte with the source; `pull`'s plain copy where no GPU
takes the kernel; the sender's staging on a CPU. On CUDA the same bytes are checked arriving from
pinned memory beside the streamer's loads (tests/scripts/test_gpu_checks_on_cuda.py); here a fence's
events are stood in for.

Triton reads TRITON_INTERPRET when `triton.jit` decorates a kernel; host_pull decorates its kernel
lazily, once per mode, so setting the variable for this module's tests is enough."""

from collections.abc import Iterator

import pytest
import torch

from specchat.host_pull import BLOCK, HostSender, ReadFence, launch, pull, words

pytest.importorskip("triton", reason="triton is not installed (the test extra installs it on x86-64 Linux)")


@pytest.fixture
def interpreter() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        yield


def random_bytes(count: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (count,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("dtype", "shape"), [
    (torch.int64, (2, 256)),  # a bucket's ids and positions
    (torch.int64, (97, 24)),  # a step's lineages
    (torch.bfloat16, (3, 4096)),  # embedding rows
    (torch.bfloat16, (1, 3)),  # 6 bytes: moved as bytes, not words
    (torch.float32, (BLOCK + 1,)),  # a second program's single word
    (torch.int32, (1,)),  # one word, one program
])
def test_the_kernel_moves_every_byte_and_no_other(interpreter, dtype, shape):
    count = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    host = random_bytes(count, seed=count).view(dtype).view(shape)
    out = torch.full((count + 8,), 7, dtype=torch.uint8)  # bytes past the target stay as they were
    launch(out[:count].view(dtype).view(shape), host)
    assert torch.equal(out[:count], host.reshape(-1).view(torch.uint8))
    assert out[count:].tolist() == [7] * 8


def test_words_are_four_bytes_where_the_size_allows(interpreter):
    assert words(torch.zeros(3, dtype=torch.int64)).dtype == torch.int32
    assert words(torch.zeros(3, dtype=torch.bfloat16)).dtype == torch.uint8


def test_the_kernel_refuses_a_target_of_another_size_and_moves_nothing_empty(interpreter):
    with pytest.raises(ValueError, match="16 bytes pulled into 8"):
        launch(torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int64))
    launch(torch.empty(0), torch.empty(0))


def test_off_a_gpu_pull_is_a_plain_copy_converting_the_dtype():
    host = torch.randn(4, 5, dtype=torch.bfloat16)
    out = torch.zeros(4, 5, dtype=torch.float32)
    pull(out, host)
    assert torch.equal(out, host.float())


def test_a_sender_off_a_gpu_gives_the_array_on_its_device_and_holds_no_staging():
    sender = HostSender(torch.device("cpu"))
    lineages = torch.arange(12).view(3, 4)
    assert torch.equal(sender.send(lineages), lineages)
    assert sender.buffer is None and sender.read.event is None



def test_a_non_contiguous_target_is_refused_rather_than_written_through_a_copy(interpreter):
    out = torch.zeros(4, 6)[:, :3]
    with pytest.raises(RuntimeError):
        launch(out, torch.ones(4, 3))


def test_off_a_gpu_a_fence_has_nothing_to_wait_for():
    fence = ReadFence()
    fence.pass_(torch.device("cpu"))
    fence.wait()
    assert fence.event is None


class RecordingEvent:
    """torch.cuda.Event stood in for: what was asked of it, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def record(self) -> None:
        self.calls.append("record")

    def synchronize(self) -> None:
        self.calls.append("synchronize")


def test_beside_a_gpu_a_fence_records_one_event_after_each_pull_and_waits_on_its_last_recording(monkeypatch):
    made: list[RecordingEvent] = []
    monkeypatch.setattr(torch.cuda, "Event", lambda: made.append(RecordingEvent()) or made[-1])
    fence, cuda = ReadFence(), torch.device("cuda")
    fence.wait()  # nothing pulled yet
    fence.pass_(cuda)
    fence.wait()
    fence.pass_(cuda)
    fence.wait()
    assert len(made) == 1 and fence.event is made[0]
    assert fence.event.calls == ["record", "synchronize", "record", "synchronize"]
