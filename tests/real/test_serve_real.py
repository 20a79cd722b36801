"""The embedded pair behind `specchat serve`: at temperature 0 the server's chat text is exactly what
`specchat generate --temperature 0` prints for the same message, streamed or not, through OpenAI's
route and Ollama's, and a fill-in-the-middle completion (/v1/completions with a suffix; Ollama's
/api/generate with one) is the completion of the prompt in Qwen2.5-Coder's own format, ended at
<|endoftext|>, as is /infill's (llama.cpp's route, laid out as
llama.cpp lays it), a warm-up of the editor's chunks is reused by the next /infill, the tokenizer
routes give the ids the chat route runs, n_probs gives each greedy token as its likeliest, and
/metrics counts a reply and what speculation gained in it, the embedding routes put each
reworded text nearest its own, echoed logprobs score a greedy continuation as its likeliest tokens,
n seeded choices are each the request alone at its seed, best_of returns the likeliest of them, a
predicted edit is the same reply, and Ollama's `context` goes on from an answer. Float32 and a
fixed budget: in bf16, or with `--budget auto` (which sizes trees from measured times), two runs
score different trees, and bf16 tree passes round differently (see docs/exactness.md)."""

import json
import subprocess
import sys
import urllib.request

import numpy
import ollama
import pytest
from helpers.serve_process import serving

pytestmark = pytest.mark.real

PROMPT = "Write a Python function that checks whether a number is prime."
NEW_TOKENS = 16
DECODING = ("--temperature", "0", "--dtype", "float32", "--budget", "16")
PREFIX, SUFFIX = "def is_prime(n):\n    ", "\n\nprint(is_prime(7))\n"
FIM_PROMPT = f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"  # Qwen2.5-Coder's format
MIDDLE_TOKENS = 64  # the greedy middle measured 46 tokens with its end (2026-11-29)


def generate(*args: str) -> str:  # its stdout
    return subprocess.run([sys.executable, "-m", "specchat", "generate", *args], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server, and what `generate` printed for PROMPT: generate runs before the server starts,
    so that two float32 pairs (~7.9 GB each) never live at once: side by side they hold 16 GB, past
    this module's RAM turn (REAL_MODULE_RAM, tests/helpers/ram_turns.py), and beside another worker's module past
    the machine's 24 GB."""
    expected = generate(PROMPT, *DECODING, "--max-new-tokens", str(NEW_TOKENS)).removesuffix("\n")  # its newline
    with serving(tmp_path_factory.mktemp("serve") / "serve.log", *DECODING) as server:
        client = server.client()
        yield client, client.models.list().data[0].id, expected, server.url.removesuffix("/v1")
    assert server.stopped_cleanly()


def test_served_text_equals_generate_at_temperature_0(served):
    """Through OpenAI's route, whole and streamed, and through Ollama's /api/chat (its own client)."""
    client, model, expected, url = served
    messages = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=NEW_TOKENS)
    streamed = client.chat.completions.create(model=model, messages=messages, max_tokens=NEW_TOKENS, stream=True)
    streamed_text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert whole.choices[0].message.content == streamed_text == expected
    chat = ollama.Client(host=url).chat(model=model, messages=messages, options={"num_predict": NEW_TOKENS},
                                        stream=True)
    assert "".join(part.message.content for part in chat) == expected
    assert whole.usage.completion_tokens == NEW_TOKENS or whole.choices[0].finish_reason == "stop"


def test_a_middle_filled_in_is_the_fim_prompt_as_qwen_writes_it_ended_at_endoftext(served):
    client, model, _, url = served
    whole = client.completions.create(model=model, prompt=PREFIX, suffix=SUFFIX, max_tokens=MIDDLE_TOKENS)
    streamed = client.completions.create(model=model, prompt=PREFIX, suffix=SUFFIX, max_tokens=MIDDLE_TOKENS,
                                         stream=True)
    # The same middle from the hand-written format: the suffix reached the model in Qwen's own tokens.
    written = client.completions.create(model=model, prompt=FIM_PROMPT, max_tokens=MIDDLE_TOKENS, logprobs=0)
    # Ollama's /api/generate with a suffix, as editor plugins speaking Ollama's API send it
    ollamas = ollama.Client(host=url).generate(model=model, prompt=PREFIX, suffix=SUFFIX,
                                               options={"num_predict": MIDDLE_TOKENS}, stream=False)
    middle = whole.choices[0].text
    assert middle == "".join(c.choices[0].text for c in streamed if c.choices) == written.choices[0].text
    assert ollamas.response == middle and ollamas.done_reason == "stop"
    assert whole.choices[0].finish_reason == "stop" and whole.usage.completion_tokens < MIDDLE_TOKENS
    # the model's own end (no stop string was sent): counted, with no logprobs entry, as it has no text
    assert written.choices[0].finish_reason == "stop" and "".join(written.choices[0].logprobs.tokens) == middle
    assert len(written.choices[0].logprobs.tokens) == written.usage.completion_tokens - 1
    compile(PREFIX + middle + SUFFIX, "filled.py", "exec")  # a body that makes the file whole
    assert "return" in middle


def test_infill_lays_the_cursor_out_as_llama_cpp_does_and_its_indent_stop_keeps_the_body(served):
    """llama.vim's request, without the editor's extra chunks: /infill's middle is the completion of
    the repository-level layout written by hand, up to the first line indented less than the
    cursor's (n_indent), where the body ends; the draft's tokens were accepted in it."""
    client, model, _, url = served
    infill = post(f"{url}/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": MIDDLE_TOKENS,
                                    "n_indent": 4})
    layout = f"<|repo_name|>myproject\n<|file_sep|>filename\n{FIM_PROMPT}"  # no chunks: the names llama.cpp gives
    # as many tokens as /infill decoded: they hold the body and the character that ended it
    written = client.completions.create(model=model, prompt=layout,
                                        max_tokens=infill["tokens_predicted"]).choices[0].text
    body, rest = infill["content"], written[len(infill["content"]):]
    assert written.startswith(body) and rest and rest[0] not in " \t", (body, rest)  # cut before a line's text
    assert infill["stop_type"] == "limit" and body.count("\n") >= 2
    assert infill["timings"]["draft_n"] >= infill["timings"]["draft_n_accepted"] > 0
    compile(PREFIX + body + SUFFIX, "filled.py", "exec")


def test_a_warm_up_computes_the_editors_chunks_so_the_next_infill_reuses_them(served):
    """llama.vim's ring update (n_predict 0 with its chunks of other files) returns nothing, and the
    completion after it computes only what follows the chunks: llama.cpp's timings say so."""
    _, _, _, url = served
    chunk = {"filename": "primes.py", "text": "".join(f"def is_multiple_of_{k}(n):\n    return n % {k} == 0\n\n"
                                                         for k in range(2, 14))}
    ring = {"input_prefix": "", "input_suffix": "", "prompt": "", "input_extra": [chunk], "n_predict": 0,
            "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}
    assert post(f"{url}/infill", ring) == {}
    reply = post(f"{url}/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [chunk],
                                   "n_predict": 4})
    timings = reply["timings"]
    assert timings["cache_n"] + timings["prompt_n"] == reply["tokens_evaluated"]
    # the 12 functions (~200 tokens) came from the warm-up; the cursor's file is computed now
    assert timings["cache_n"] > 150 and timings["prompt_n"] < 40, timings


def test_the_tokenizer_routes_give_the_ids_the_chat_route_runs(served):
    """/apply-template's prompt, through /tokenize, is as many tokens as the chat route's prompt, with
    or without tools, and comes back whole through /detokenize; Qwen's byte-level pieces join to a
    text's bytes, split characters included."""
    client, model, _, url = served
    messages = [{"role": "user", "content": PROMPT}]
    prompt = post(f"{url}/apply-template", {"messages": messages})["prompt"]
    ids = post(f"{url}/tokenize", {"content": prompt})["tokens"]  # its special tokens' names read as those tokens
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=1)
    assert reply.usage.prompt_tokens == len(ids) and prompt.startswith("<|im_start|>")
    assert post(f"{url}/detokenize", {"tokens": ids})["content"] == prompt
    tools = [{"type": "function", "function": {"name": "is_prime", "parameters": {"type": "object"}}}]
    declared = post(f"{url}/apply-template", {"messages": messages, "tools": tools})["prompt"]
    reply = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=1)
    assert "<tools>" in declared and '"is_prime"' in declared
    assert reply.usage.prompt_tokens == len(post(f"{url}/tokenize", {"content": declared})["tokens"])
    text = "naïve ☃ café 🙂"
    pieces = post(f"{url}/tokenize", {"content": text, "with_pieces": True})["tokens"]
    joined = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
    assert joined == text.encode() and any(isinstance(p["piece"], list) for p in pieces)


def test_n_probs_gives_the_greedy_tokens_as_their_likeliest(served):
    """llama.cpp's completion_probabilities on the embedded pair, speculating at temperature 0: an
    entry a token, which is the likeliest of its alternatives there."""
    _, _, _, url = served
    reply = post(f"{url}/completion", {"prompt": PREFIX, "n_predict": 8, "n_probs": 2, "temperature": 0})
    entries = reply["completion_probabilities"]
    assert len(entries) == reply["tokens_predicted"] and reply["timings"]["draft_n_accepted"] > 0
    assert all(entry["top_logprobs"][0]["id"] == entry["id"] for entry in entries)


# Each text beside a rewording of it (names changed, a sentence turned round): the target's mean-pooled
# rows put every rewording nearest its own text, cosines 0.956-0.981 against 0.56 at most for another
# text (float32, 2026-12-02). A raw generative model is no retrieval model (a question lands near no
# answer so): closeness of near-duplicates is what it gives, and what this checks.
TEXTS = ["def reverse(s):\n    return s[::-1]",
         "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
         "Paris is the capital of France and its largest city.", "SELECT name FROM users WHERE age > 30;"]
REWORDED = ["def reverse(text):\n    return text[::-1]",
            "def is_prime(number):\n"
            "    return number > 1 and all(number % k for k in range(2, int(number ** 0.5) + 1))",
            "The capital of France, and its largest city, is Paris.", "SELECT name FROM people WHERE age > 30;"]
# a rewording's cosine to its text over its highest to another: 0.40 at least (AMD EPYC, 2026-12-02)
LEAST_GAP = 0.2


def test_embeddings_put_each_rewording_nearest_its_own_text(served):
    """OpenAI's route (its client's base64) and Ollama's give the same unit vectors of the target's
    mean-pooled rows; each reworded text's nearest text is its own, by a clear gap."""
    client, model, _, url = served
    vectors = numpy.array([item.embedding for item in client.embeddings.create(model=model,
                                                                               input=TEXTS + REWORDED).data])
    # float32 rounding: 7e-8 off length 1 at most (AMD EPYC, 2026-12-02)
    assert numpy.allclose(numpy.linalg.norm(vectors, axis=1), 1.0, rtol=0, atol=1.4e-7)
    assert ollama.Client(host=url).embed(model=model, input=TEXTS).embeddings == vectors[:4].tolist()
    cosines = vectors[4:] @ vectors[:4].T
    assert (cosines.argmax(axis=1) == numpy.arange(4)).all(), cosines
    others = numpy.where(numpy.eye(4, dtype=bool), -1.0, cosines).max(axis=1)
    assert (cosines.diagonal() - others >= LEAST_GAP).all(), cosines


def test_echoed_logprobs_score_a_greedy_continuation_as_its_likeliest_tokens(served):
    """lm-evaluation-harness's loglikelihood requests on the embedded pair, a batch of two: the prompt
    and the greedy completion the server decoded, sent back as token ids with echo, logprobs and one
    new token, score each completion token as its position's likeliest (the harness's is_greedy),
    their sum the continuation's log-likelihood, below 0; the same with its third token changed
    scores the first two so and the third not; each prompt runs through the target once."""
    client, model, _, url = served
    prompt = post(f"{url}/tokenize", {"content": PREFIX})["tokens"]
    completion = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=1)
    continuation = post(f"{url}/tokenize", {"content": completion.choices[0].text})["tokens"]
    changed = continuation[:2] + [continuation[2] + 1] + continuation[3:]
    answer = client.completions.create(model=model, prompt=[prompt + continuation, prompt + changed], max_tokens=1,
                                       temperature=0, logprobs=1, echo=True)
    batch, size = answer.choices, len(prompt)
    # each prompt ran through the target once: its reply computed only its last token again
    assert answer.usage.prompt_tokens_details.cached_tokens == answer.usage.prompt_tokens - 2
    scored = batch[0].logprobs
    assert scored.token_logprobs[0] is None and len(scored.tokens) == size + len(continuation) + 1
    picks = [logprob == max(top.values()) for logprob, top in zip(scored.token_logprobs[size:-1],
                                                                  scored.top_logprobs[size:-1])]
    assert all(picks) and sum(scored.token_logprobs[size:-1]) < 0
    others = batch[1].logprobs
    firsts = zip(others.token_logprobs[size:size + 3], others.top_logprobs[size:size + 3])
    assert [logprob == max(top.values()) for logprob, top in firsts] == [True, True, False]
    # the completion's own logprobs, logged as it was decoded, are these positions' (float32 passes of other
    # widths, whose linears other kernels may multiply, oneDNN inside its measured span and MKL outside:
    # quant/onednn_float.py; 5.1e-6 apart at most, AVX2 EPYC, 2026-12-04; 1.2e-6 with MKL's alone, 2026-12-02)
    assert numpy.allclose(scored.token_logprobs[size:-1], completion.choices[0].logprobs.token_logprobs,
                          rtol=0, atol=1e-5)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def test_n_choices_are_each_the_reply_to_the_request_alone_at_its_seed(served):
    """OpenAI's n on the embedded pair at t=1: choice i is the reply to the same request alone at seed
    11 + i (each SpecExec's seeded sample, exact: tests/real/test_real_exactness.py), the choices
    differ, and the prompt is counted once."""
    client, model, _, _ = served
    request = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 1.0}
    choices = client.chat.completions.create(**request, n=3, seed=11)
    alone = [client.chat.completions.create(**request, seed=11 + i) for i in range(3)]
    texts = [choice.message.content for choice in choices.choices]
    assert texts == [reply.choices[0].message.content for reply in alone] and len(set(texts)) > 1
    assert choices.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert choices.usage.completion_tokens == sum(reply.usage.completion_tokens for reply in alone)


def test_best_of_returns_the_candidate_of_highest_logprob_per_token(served):
    """OpenAI's best_of on the embedded pair at t=1: of the three replies n = 3 gives (seeds 11-13,
    each SpecExec's exact seeded sample), best_of 3 returns the one whose tokens' mean logprob is the
    highest, and bills all three."""
    client, model, _, _ = served
    request = {"model": model, "prompt": "def is_prime(n):", "max_tokens": 8, "temperature": 1.0, "seed": 11}
    every = client.completions.create(**request, n=3, logprobs=0)
    best = client.completions.create(**request, best_of=3)
    assert all(choice.finish_reason == "length" for choice in every.choices)  # no end token: every one shown
    means = [sum(choice.logprobs.token_logprobs) / 8 for choice in every.choices]
    likeliest = every.choices[means.index(max(means))]
    assert len(set(means)) == 3 and [choice.text for choice in best.choices] == [likeliest.text]
    assert best.usage.completion_tokens == every.usage.completion_tokens == 24


EDITED = '''def area(width, height):
    result = width * height
    if result < 0:
        raise ValueError("negative area")
    return result
'''


def test_a_predicted_edit_is_the_same_reply_in_no_more_iterations(served):
    """Predicted outputs on the embedded pair: an edit's chat request, whether it sends the code it
    changes as OpenAI's prediction or predicts nothing (the code it quotes is then the prediction),
    answers exactly as the same prompt ids do as a raw prompt on /v1/completions, which predicts
    nothing, greedy and seeded (a prediction is only a chain in each tree); sent, in no more
    iterations, and the reply follows most of it."""
    client, model, _, url = served
    ask = "Rename `result` to `size` in this function. Reply with the whole function in one Python code block only."
    messages = [{"role": "user", "content": f"{ask}\n\n```python\n{EDITED}```"}]
    prompt = post(f"{url}/apply-template", {"messages": messages})["prompt"]
    ids = post(f"{url}/tokenize", {"content": prompt, "parse_special": True})["tokens"]
    request = {"model": model, "max_tokens": 64, "messages": messages}
    plain = client.completions.create(model=model, prompt=ids, max_tokens=64, temperature=0)
    quoted = client.chat.completions.create(**request, temperature=0)
    predicted = client.chat.completions.create(**request, temperature=0, prediction={
        "type": "content", "content": f"```python\n{EDITED}```"})
    assert predicted.choices[0].message.content == quoted.choices[0].message.content == plain.choices[0].text
    assert "size = width * height" in plain.choices[0].text
    assert predicted.model_extra["specchat"]["iterations"] <= plain.model_extra["specchat"]["iterations"]
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > details.rejected_prediction_tokens
    assert quoted.usage.completion_tokens_details is None  # the client predicted nothing
    seeded = {"temperature": 0.8, "seed": 5, "max_tokens": 48}  # each token the target's sample at its position
    assert client.chat.completions.create(**request | seeded).choices[0].message.content == (
        client.completions.create(model=model, prompt=ids, **seeded).choices[0].text)


def test_an_ollama_context_sent_back_goes_on_from_its_answer(served):
    """Ollama's older way to go on (`context`) on the embedded pair: the next prompt runs after the
    answer's ids, only its own tokens computed, and its text is what /v1/completions gives for those
    ids as a raw prompt."""
    client, model, _, url = served
    ollamas, options = ollama.Client(host=url), {"num_predict": 8}
    first = ollamas.generate(model=model, prompt=PROMPT, options=options)
    second = ollamas.generate(model=model, prompt="Now in one line.", context=first.context, options=options)
    follows = post(f"{url}/apply-template", {"messages": [{"role": "user", "content": "Now in one line."}]})
    ids = first.context + post(f"{url}/tokenize", {"content": follows["prompt"], "parse_special": True})["tokens"]
    assert second.context[:len(ids)] == ids and second.prompt_eval_count == len(ids) - len(first.context) + 1
    raw = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0)
    assert second.response == raw.choices[0].text


def test_the_metrics_count_a_reply_and_show_speculation_gaining_tokens(served):
    client, model, _, url = served
    before = scrape(url)
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=NEW_TOKENS)
    after = scrape(url)
    gained = {name: after[name] - before.get(name, 0.0) for name in after}
    assert gained['specchat_requests_total{route="/v1/chat/completions",status="200"}'] == 1
    assert gained["specchat_generation_tokens_total"] == reply.usage.completion_tokens
    assert gained["specchat_prompt_tokens_total"] == reply.usage.prompt_tokens
    # SpecExec at budget 16 on code: the target accepted draft tokens, more than one token an iteration.
    assert gained["specchat_iterations_total"] < gained["specchat_generation_tokens_total"]
    assert 0 < gained["specchat_draft_tokens_accepted_total"] <= gained["specchat_draft_tokens_scored_total"]


def scrape(url: str) -> dict[str, float]:
    """The server's metrics, each sample by its line's name and labels."""
    with urllib.request.urlopen(f"{url}/metrics") as response:
        lines = response.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")}
