"""The server's parts on their own: stop strings, the chat template, the request's checks, the
socket and the exposure warning, and a shutdown with requests in flight (a reply's usage and
figures: test_serve_reply.py)."""

import logging
import threading

import pytest
from helpers.serve_helpers import loop  # noqa: F401 (a fixture)
from helpers.serve_helpers import MODEL, CharTokenizer, client, make_app, serving, user

from specchat.chat_template import encode_chat
from specchat.decoding.events import SamplingParams
from specchat.errors import SpecchatError
from specchat.serve.command import Serving, check_serving, exposure_warning
from specchat.serve.errors import APIError
from specchat.serve.listen import bind, is_loopback, server_for, url_of
from specchat.serve.scheduler import Job
from specchat.serve.schema import ChatRequest, field_name, parse_body
from specchat.serve.stops import StopScan
from specchat.tui.fake import FakeEngine


def scan_all(stops: list[str], pieces: list[str]) -> tuple[list[str], str, bool]:
    scan = StopScan(stops)
    sent = [scan.push(piece) for piece in pieces]
    return sent, scan.finish(), scan.hit


def test_a_stop_string_split_across_pieces_is_held_back_then_cut():
    assert scan_all(["STOP"], ["abc S", "TO", "P tail"]) == (["abc ", "", ""], "", True)


def test_a_held_back_tail_that_no_stop_completes_is_sent():
    assert scan_all(["STOP"], ["abc ST", "ay"]) == (["abc ", "STay"], "", False)
    assert scan_all(["STOP"], ["abc ST"]) == (["abc "], "ST", False)


def test_the_earliest_of_several_stop_strings_cuts():
    assert scan_all(["yz", "b"], ["abcxyz"]) == (["a"], "", True)
    assert scan_all([], ["free text"]) == (["free text"], "", False)


def test_the_chat_template_is_applied_for_the_assistants_turn():
    assert encode_chat(CharTokenizer(), user("hi")) == CharTokenizer().encode("<user>hi</><assistant>")


def test_field_names_read_as_the_client_wrote_them():
    assert field_name(("messages", 2, "content", "str")) == "messages[2].content"
    assert field_name(("stop", "list[str]", 0)) == "stop[0]"


def test_unknown_fields_are_ignored_as_openai_clients_expect():
    request = parse_body(b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "user": "u1", '
                         b'"presence_penalty": 0, "n": 1, "response_format": {"type": "text"}}', ChatRequest)
    assert request.model == "m"


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                                ("0.0.0.0", False), ("192.168.1.5", False), ("example.org", False)])
def test_only_loopback_addresses_count_as_private(host, loopback):
    assert is_loopback(host) == loopback


def serving_options(**changes) -> Serving:
    return Serving(**{"host": "127.0.0.1", "port": 8000, "api_key": None, "max_queue": 16, "slots": 1,
                      "log_prompts": False, **changes})


def test_binding_elsewhere_without_a_key_warns():
    assert exposure_warning(serving_options()) is None
    assert exposure_warning(serving_options(host="0.0.0.0", api_key="k")) is None
    warning = exposure_warning(serving_options(host="0.0.0.0"))
    assert warning.startswith("warning: listening on 0.0.0.0 without an API key") and "SPECCHAT_API_KEY" in warning


@pytest.mark.parametrize(("changes", "fragment"), [({"port": 70000}, "--port"), ({"max_queue": -1}, "--max-queue"),
                                                   ({"slots": 0}, "--slots"), ({"api_key": " "}, "--api-key")])
def test_serving_options_out_of_range_are_one_line(changes, fragment):
    with pytest.raises(SpecchatError, match=fragment):
        check_serving(serving_options(**changes))


@pytest.mark.parametrize("host", ["a..b", "x" * 64 + ".example"])
def test_a_host_name_idna_cannot_encode_is_one_line(host):
    with pytest.raises(SpecchatError, match="not a host name"):  # was the codec's UnicodeError
        bind(host, 0)


def test_a_taken_port_is_one_line():
    taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(SpecchatError, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            bind("127.0.0.1", port)
        assert url_of(taken) == f"http://127.0.0.1:{port}"
    finally:
        taken.close()


def test_shutdown_answers_waiting_requests_and_ends_the_running_one():
    engine = FakeEngine(reply="x" * 5000, accepted=(0,), delay_s=0.02)
    app, scheduler = make_app([engine])
    results = {}
    with serving(app) as url:
        chat = client(url)

        def ask(name: str) -> None:
            try:
                results[name] = chat.chat.completions.create(model=MODEL, messages=user(name)).choices[0].finish_reason
            except Exception as error:  # what the client saw is what the test checks
                results[name] = error

        threads = [threading.Thread(target=ask, args=(name,)) for name in ("a", "b")]
        threads[0].start()
        while scheduler.running is None:
            threading.Event().wait(0.005)
        threads[1].start()
        while not scheduler.waiting:
            threading.Event().wait(0.005)
    for thread in threads:
        thread.join(10)
    assert results["a"] == "length"  # cut at the next iteration, not after 5000
    assert getattr(results["b"], "status_code", None) == 503
    assert isinstance(results["b"], Exception) and "shutting down" in str(results["b"])


def test_a_forced_exit_still_shuts_the_app_down():
    """A second Ctrl+C forces uvicorn's exit, which skips the app's shutdown: the server runs it
    anyway, where the app's lifespan was left waiting and the interrupt that ends the process then
    cancelled it with a traceback on the terminal."""
    app, _ = make_app([FakeEngine()])
    sock = bind("127.0.0.1", 0)
    server = server_for(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the server did not start"
        threading.Event().wait(0.01)
    errors = Recorded(logging.ERROR)
    logging.getLogger("uvicorn.error").addHandler(errors)  # uvicorn's own loggers do not propagate
    try:
        server.force_exit = server.should_exit = True
        thread.join(10)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
        sock.close()
    assert not thread.is_alive() and errors.records == []


class Recorded(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_submitting_after_shutdown_is_refused(loop):
    app, scheduler = make_app([FakeEngine()])
    scheduler.stop_all()
    with pytest.raises(APIError, match="shutting down"):
        scheduler.submit(Job([1], 1, SamplingParams(), loop))
