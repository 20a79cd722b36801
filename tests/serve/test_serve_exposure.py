"""docs/serve.md's "binding an address other than loopback without a key prints a warning", through
`specchat serve` itself. The socket is never opened: the command's bind is replaced by one that
records the address and stops the command there, before anything loads or listens."""

import pytest
from helpers.cli import run_cli

from specchat.errors import SpecchatError

STOPPED = "stopped at the bind (test)"
WARNING = ("warning: listening on 0.0.0.0 without an API key: anyone who can reach this address can use the "
           "server (set --api-key or SPECCHAT_API_KEY)")


@pytest.fixture
def binds(monkeypatch) -> list[tuple[str, int]]:
    """The addresses `serve` asks to listen on; each ask ends the command with a one-line error."""
    asked = []

    def record_and_stop(host: str, port: int) -> None:
        asked.append((host, port))
        raise SpecchatError(STOPPED)

    monkeypatch.setattr("specchat.serve.command.bind", record_and_stop)
    monkeypatch.delenv("SPECCHAT_API_KEY", raising=False)
    return asked


def test_a_non_loopback_address_without_a_key_is_warned_before_binding(monkeypatch, capsys, binds):
    code, out, err = run_cli(monkeypatch, capsys, "serve", "--host", "0.0.0.0", "--port", "0")
    assert (code, out, binds) == (2, "", [("0.0.0.0", 0)])
    assert err.splitlines() == [WARNING, f"error: {STOPPED}"]


@pytest.mark.parametrize(("args", "key"), [(["--host", "0.0.0.0", "--api-key", "k"], None),
                                           (["--host", "0.0.0.0"], "k"),  # the key from SPECCHAT_API_KEY
                                           (["--host", "127.0.0.1"], None),
                                           ([], None)])  # loopback by default
def test_a_key_or_a_loopback_address_is_not_warned(monkeypatch, capsys, binds, args, key):
    if key is not None:
        monkeypatch.setenv("SPECCHAT_API_KEY", key)
    code, _, err = run_cli(monkeypatch, capsys, "serve", "--port", "0", *args)
    assert code == 2 and len(binds) == 1
    assert err.splitlines() == [f"error: {STOPPED}"]
