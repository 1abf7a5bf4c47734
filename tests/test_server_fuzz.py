"""Issue 14: a seeded, bounded fuzz of every endpoint and request field. Each answer must be a 4xx
in the error shape or a well-formed 200 (JSON, or an SSE stream that ends properly); never a
500, a dropped connection or a hang; and afterwards the server is healthy with every slot idle.

Tiny random-weight model on 127.0.0.1; 500 requests, four at a time."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from test_server_support import sse_events, tiny_served

SEED = 14
N_REQUESTS = 500

GENERATING = ["/completion", "/completions", "/v1/completions", "/v1/chat/completions", "/chat/completions", "/infill"]
OTHER_POSTS = ["/tokenize", "/detokenize", "/apply-template", "/lora-adapters", "/slots/0?action=erase", "/props"]
GETS = ["/health", "/props", "/slots", "/v1/models", "/metrics", "/lora-adapters", "/slots?fail_on_no_slot=1", "/nowhere"]

NOT_ENABLED = {"/slots/0?action=erase", "/props"}  # POST: needs --slot-save-path, --props

FIELDS = [
    "prompt", "messages", "n_predict", "max_tokens", "max_completion_tokens", "n", "n_cmpl", "stream", "stop",
    "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p", "typical_p", "top_n_sigma",
    "min_keep", "xtc_probability", "xtc_threshold", "repeat_last_n", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "mirostat", "mirostat_tau", "mirostat_eta", "samplers", "logit_bias", "ignore_eos",
    "seed", "n_probs", "post_sampling_probs", "logprobs", "top_logprobs", "cache_prompt", "id_slot", "n_keep",
    "n_discard", "n_indent", "t_max_predict_ms", "return_tokens", "timings_per_token", "return_progress",
    "response_fields", "lora", "grammar", "json_schema", "response_format", "tools", "tool_choice",
    "parallel_tool_calls", "stream_options", "chat_template_kwargs", "add_generation_prompt", "input_prefix",
    "input_suffix", "input_extra", "multimodal_data", "content", "tokens", "with_pieces", "add_special",
    "parse_special", "n_cache_reuse", "user", "model", "filename", "id", "scale",
    "speculative.type", "speculative.n_max", "speculative.n_min", "speculative.p_min",
]


def nasty_values(rng: random.Random) -> list:
    deep = json.loads("[" * 40 + "]" * 40)
    return [
        None, True, False, 0, -1, 1, 2, 7, 2**31 - 1, 2**31, -(2**31) - 1, 2**63, -(2**63), 10**30, 1e30, -1e30,
        1e308, -1e308, 5e-324, 1e-45, 0.5, -0.5, 3.4e38, 1.5, "", "x", "1", "NaN", "\ud800", "a\udfffb",
        "\x00", "😀" * 3, "y" * rng.choice([300, 5000, 100_000]), [], [1], [1, "a"], [None], ["\n", ":"],
        ["\ud800"], [[1, 2]], [[5, 1e308]], [["the", False]], {}, {"a": 1}, {"5": -1e30}, {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}, [{"role": "user", "content": 5}],
        [{"role": "user", "content": "hi"}], [{"id": 0, "scale": 1}], deep, list(range(300)),
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "root ::= " + "(" * 70 + '"a"' + ")" * 70, 'root ::= "a" | "b"', "edkypmxt", "zz",
        "ngram-mod", "ngram-map-k4v,ngram-simple", "ngram-map-k",  # speculative.type's kinds
    ]


def base_body(path: str, rng: random.Random) -> dict:
    body: dict = {"n_predict": rng.choice([1, 2, 4, 8]), "max_tokens": rng.choice([1, 3, 6])}
    if "chat" in path or path == "/apply-template":
        body["messages"] = [{"role": "user", "content": rng.choice(["hi", "the cat", ""])}]
    elif path == "/tokenize":
        body["content"] = "hello the world"
    elif path == "/detokenize":
        body["tokens"] = [100, 101, 102]
    elif path == "/infill":
        body.update(input_prefix="def f(", input_suffix="):", prompt="")
    else:
        body["prompt"] = rng.choice(["the", "in the a", ["a", "b"], [1, 100, 101]])
    if rng.random() < 0.3:
        body["stream"] = True
    return body


def raw_body(rng: random.Random) -> bytes:
    return rng.choice([
        b"", b"   ", b"{", b'{"prompt": "x"', b'{"prompt": NaN}', b'{"temperature": Infinity}',
        b'{"temperature": -Infinity}', b"[1, 2]", b'"text"', b"42", b"null", b"\xff\xfe\xfa",
        b'{"prompt": "\xc3\x28"}', b'{"prompt": "a", "prompt": 5}', b"[" * 5000 + b"]" * 5000,
        b'{"a":' * 3000 + b"1" + b"}" * 3000, b'{"prompt": "\\ud800"}', b'{"\\udc00": 1}',
        b'{"prompt": "' + b"z" * 1_500_000 + b'"}', b'{"messages": [' + b'{"role":"user","content":"x"},' * 2000 + b"1]}",
        b'{"prompt": "x", "n_predict": 1e999}', b'{"prompt": "x", "top_k": 1e30, "stream": true}',
    ])


def fuzz_case(rng: random.Random) -> tuple[str, str, bytes | None]:
    roll = rng.random()
    if roll < 0.08:
        return "GET", rng.choice(GETS), None
    path = rng.choice(GENERATING * 3 + OTHER_POSTS)
    if roll < 0.2:
        return "POST", path, raw_body(rng)
    body = base_body(path, rng)
    values = nasty_values(rng)
    for _ in range(rng.choice([1, 1, 2, 3])):
        target = body
        if rng.random() < 0.1 and isinstance(body.get("messages"), list):
            target = body["messages"][0]  # unknown or odd fields inside a message
        target[rng.choice(FIELDS + ["zz_unknown", "role", "content"])] = rng.choice(values)
    try:
        text = json.dumps(body, allow_nan=False)
    except ValueError:
        text = json.dumps({k: v for k, v in body.items() if not isinstance(v, float)})
    return "POST", path, text.encode("utf-8", "surrogatepass")


def check_answer(method: str, path: str, response: httpx.Response) -> str:
    """'' if fine, else what is wrong."""
    status = response.status_code
    if status == 501 and path in NOT_ENABLED:
        status = 400  # llama-server's answer for an endpoint this server was not started with
    elif status >= 500 or not (status == 200 or 400 <= status < 500):
        return f"status {status}: {response.text[:300]}"
    if status != 200:
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            return f"{status} without the error shape: {response.text[:200]}"
        if error.get("code") != response.status_code or not isinstance(error.get("message"), str) or not error.get("type"):
            return f"bad error shape: {error}"
        return ""
    kind = response.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        try:
            events = sse_events(response.text)
        except ValueError as exc:
            return f"bad SSE payload: {exc}"
        if not events:
            return "an empty stream"
        if any(isinstance(e, dict) and "error" in e for e in events):
            return f"an error in the stream: {events[-1]}"
        last = events[-1]
        if not (last == "[DONE]" or (isinstance(last, dict) and last.get("stop") is True)):
            return f"a stream that does not end properly: {events[-2:]}"
        return ""
    if kind.startswith("application/json"):
        try:
            response.json()
        except ValueError:
            return f"invalid JSON: {response.text[:200]}"
    return ""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with tiny_served(tmp_path_factory.mktemp("tiny")) as running:
        yield running


def test_fuzz_every_endpoint_and_field(served):
    server, engine = served
    rng = random.Random(SEED)
    cases = [fuzz_case(rng) for _ in range(N_REQUESTS)]

    def send(case) -> tuple[int, str]:
        method, path, body = case
        with httpx.Client(base_url=server.url, timeout=30) as client:
            try:
                response = client.request(method, path, content=body,
                                          headers={"Content-Type": "application/json"} if body is not None else None)
            except httpx.HTTPError as exc:  # dropped connection or hang
                return -1, f"{type(exc).__name__}: {exc}"
        return response.status_code, check_answer(method, path, response)

    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(send, cases))
    elapsed = time.monotonic() - start
    problems = [(case[:2], case[2][:120] if case[2] else None, why) for case, (_, why) in zip(cases, results) if why]
    statuses: dict[int, int] = {}
    for status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    print(f"\nfuzz: {len(cases)} requests in {elapsed:.1f} s, statuses {dict(sorted(statuses.items()))}")
    assert not problems, "\n".join(map(str, problems[:20]))
    assert statuses.get(200, 0) > N_REQUESTS // 5 and sum(v for k, v in statuses.items() if 400 <= k < 500) > N_REQUESTS // 5
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.get("/health").json() == {"status": "ok"}
        deadline = time.monotonic() + 20
        while not all(s.is_idle for s in engine.slots) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(slot["is_processing"] for slot in client.get("/slots").json())
        assert client.post("/completion", json={"prompt": "the", "n_predict": 3, "ignore_eos": True}).status_code == 200
    assert engine.stats["failed"] == 0 and not engine.active and not engine.waiting


# -- the other APIs' fuzz runs (issue 24): one loop, each API its cases and its answer check ---------

def fuzz_api(served, name: str, cases: list[tuple[str, str, bytes | None]], check, probe: tuple[str, dict, object]) -> None:
    """Send (method, path, body) cases four at a time; every answer must pass `check(method, path,
    response)`, about a fifth at least 200s and a fifth 4xx; then the server is healthy, idle and
    answers `probe` (path, body, predicate of its JSON)."""
    from test_server_support import wait_all_idle  # (this section is appended; the imports above are shared)

    server, engine = served

    def send(case) -> tuple[int, str]:
        method, path, body = case
        with httpx.Client(base_url=server.url, timeout=30) as client:
            try:
                response = client.request(method, path, content=body,
                                          headers={"Content-Type": "application/json"} if body is not None else None)
            except httpx.HTTPError as exc:  # dropped connection or hang
                return -1, f"{type(exc).__name__}: {exc}"
        return response.status_code, check(method, path, response)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(send, cases))
    problems = [(case[:2], case[2][:160] if case[2] else None, why) for case, (_, why) in zip(cases, results) if why]
    statuses: dict[int, int] = {}
    for status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    print(f"\n{name} fuzz: {len(cases)} requests, statuses {dict(sorted(statuses.items()))}")
    assert not problems, "\n".join(map(str, problems[:20]))
    assert statuses.get(200, 0) > len(cases) // 5
    assert sum(v for k, v in statuses.items() if 400 <= k < 500) > len(cases) // 5
    path, body, healthy = probe
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.get("/health").json() == {"status": "ok"}
        wait_all_idle(engine)
        assert healthy(client.post(path, json=body).json())
    assert engine.stats["failed"] == 0 and not engine.active and not engine.waiting


# -- issue 24: OpenAI's Responses API and the token counts -----------------------------------------

N_RESPONSES_REQUESTS = 150
RESPONSES_PATHS = ["/v1/responses", "/v1/responses", "/v1/responses/input_tokens", "/v1/chat/completions/input_tokens"]
RESPONSES_FIELDS = [
    "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens", "temperature",
    "top_p", "text", "reasoning", "stream", "metadata", "user", "truncation", "store", "background",
    "previous_response_id", "conversation", "include", "model", "messages",
]
RESPONSES_ENDS = ("response.completed", "response.incomplete")


def responses_values(rng: random.Random) -> list:
    """nasty_values plus the shapes of Responses items, tools and settings, right and wrong."""
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'}
    return nasty_values(rng) + [
        [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        [{"role": "developer", "content": "x"}, {"type": "message", "role": "assistant", "content": "y"}],
        [call, {"type": "function_call_output", "call_id": "c1", "output": "z"}],
        [{"type": "function_call_output", "call_id": "c2", "output": "z"}], [call], [{"type": "item_reference"}],
        [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]}],
        [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}],
        [{"role": "user", "content": [{"type": rng.choice(["input_file", "refusal", "output_text", "x"])}]}],
        [{"type": "function", "name": "f", "parameters": {"type": "object"}}], [{"type": "web_search"}],
        [{"type": "function"}], {"type": "function", "name": "f"}, "required", "none", "auto",
        {"format": {"type": "json_schema", "name": "s", "schema": {"type": "string", "maxLength": 3}}},
        {"format": {"type": "json_object"}}, {"format": {"type": "json_schema"}}, {"verbosity": "low"},
        {"effort": rng.choice(["none", "low", "high", "max"])}, {"summary": "auto"}, "disabled",
        ["reasoning.encrypted_content"],
    ]


def responses_case(rng: random.Random) -> tuple[str, bytes]:
    path = rng.choice(RESPONSES_PATHS)
    if rng.random() < 0.1:
        return path, raw_body(rng)
    if path.startswith("/v1/chat"):
        body = base_body(path, rng)
    else:
        body = {"input": rng.choice(["hi", [{"role": "user", "content": "the cat"}]]),
                "max_output_tokens": rng.choice([1, 2, 4])}
        if rng.random() < 0.3:
            body["stream"] = True
    values = responses_values(rng)
    for _ in range(rng.choice([1, 1, 2, 3])):
        target = body
        if rng.random() < 0.15 and isinstance(body.get("input"), list):
            target = body["input"][0]  # odd fields inside an item
        target[rng.choice(RESPONSES_FIELDS + ["zz_unknown", "role", "content", "type"])] = rng.choice(values)
    try:
        text = json.dumps(body, allow_nan=False)
    except ValueError:
        text = json.dumps({k: v for k, v in body.items() if not isinstance(v, float)})
    return path, text.encode("utf-8", "surrogatepass")


def check_responses_answer(path: str, response: httpx.Response) -> str:
    """'' if fine: check_answer's rules, a Responses stream ending in response.completed or
    .incomplete with its events numbered 0, 1, ..., and 200 JSON of the endpoint's object."""
    if response.status_code != 200 or not response.headers.get("content-type", "").startswith("text/event-stream"):
        problem = check_answer("POST", path, response)
        if problem or response.status_code != 200:
            return problem
        expected = "response" if path == "/v1/responses" else "response.input_tokens"
        return "" if response.json().get("object") == expected else f"not a {expected}: {response.text[:200]}"
    try:
        events = sse_events(response.text)
    except ValueError as exc:
        return f"bad SSE payload: {exc}"
    if not events or events[-1].get("type") not in RESPONSES_ENDS:
        return f"a stream that does not end properly: {events[-2:]}"
    if [e.get("sequence_number") for e in events] != list(range(len(events))):
        return "sequence numbers that do not count up by one"
    return ""


def test_fuzz_responses_api(served):
    rng = random.Random(SEED + 24)
    cases = [("POST", *responses_case(rng)) for _ in range(N_RESPONSES_REQUESTS)]
    fuzz_api(served, "responses", cases, lambda method, path, response: check_responses_answer(path, response),
             ("/v1/responses", {"input": "the", "max_output_tokens": 2}, lambda body: body["object"] == "response"))


# -- issue 24: Anthropic's Messages API -----------------------------------------------------------

N_ANTHROPIC_REQUESTS = 150
ANTHROPIC_PATHS = ["/v1/messages", "/v1/messages", "/v1/messages/count_tokens"]
ANTHROPIC_FIELDS = [
    "model", "max_tokens", "system", "messages", "stream", "stop_sequences", "temperature", "top_p", "top_k",
    "tools", "tool_choice", "thinking", "metadata", "output_config", "output_format", "seed", "min_p",
    "chat_template_kwargs", "service_tier",
]
ANTHROPIC_ERROR_TYPES = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                         "timeout_error", "request_too_large", "rate_limit_error", "overloaded_error", "api_error"}
ANTHROPIC_STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}


def anthropic_values(rng: random.Random) -> list:
    """nasty_values plus Anthropic's blocks, turns, tools and settings, right and wrong."""
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok"}],
              "is_error": rng.random() < 0.5}
    image = {"type": "image", "source": rng.choice([{"type": "base64", "media_type": "image/png", "data": "AA=="},
                                                    {"type": "url", "url": "http://x/y.png"}, {"type": "file"}])}
    blocks = [{"type": "text", "text": "hi"}, image, result, use, {"type": "thinking", "thinking": "hm", "signature": "s"},
              {"type": "redacted_thinking", "data": "x"}, {"type": rng.choice(["video", "document", "text"])}, {}, 5]
    return nasty_values(rng) + [
        [{"role": "user", "content": [rng.choice(blocks) for _ in range(rng.choice([1, 2]))]}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [rng.choice(blocks)]}],
        [{"role": rng.choice(["system", "tool", "assistant", None]), "content": "hi"}], rng.choice(blocks),
        [{"type": "text", "text": "be brief"}], [{"name": "f", "input_schema": {"type": "object"}}],
        [{"name": "f"}], [{"type": "bash_20250124", "name": "bash"}], {"type": rng.choice(["auto", "any", "none"])},
        {"type": "tool", "name": rng.choice(["f", "g"]), "disable_parallel_tool_use": True}, {"type": "tool"},
        {"type": "enabled", "budget_tokens": rng.choice([1, 2, 0, "x"])}, {"type": "disabled"}, {"type": "adaptive"},
        {"format": {"type": "json_schema", "schema": {"type": "string", "maxLength": 3}}}, {"effort": "low"},
        {"user_id": "u"}, ["\n"], {"enable_thinking": True},
    ]


def anthropic_case(rng: random.Random) -> tuple[str, bytes]:
    path = rng.choice(ANTHROPIC_PATHS)
    if rng.random() < 0.1:
        return path, raw_body(rng)
    body = {"model": "tiny", "max_tokens": rng.choice([1, 2, 4]),
            "messages": [{"role": "user", "content": rng.choice(["hi", [{"type": "text", "text": "the cat"}]])}]}
    if rng.random() < 0.3:
        body["stream"] = True
    values = anthropic_values(rng)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        target = body
        if rng.random() < 0.15 and isinstance(body.get("messages"), list) and isinstance(body["messages"][0], dict):
            target = body["messages"][0]  # odd fields inside a message
        target[rng.choice(ANTHROPIC_FIELDS + ["zz_unknown", "role", "content"])] = rng.choice(values)
    try:
        text = json.dumps(body, allow_nan=False)
    except ValueError:
        text = json.dumps({k: v for k, v in body.items() if not isinstance(v, float)})
    return path, text.encode("utf-8", "surrogatepass")


def anthropic_sse(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of each event of an Anthropic stream."""
    pairs = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        pairs.append((lines.get("event", ""), json.loads(lines.get("data", "null"))))
    return pairs


def check_anthropic_answer(path: str, response: httpx.Response) -> str:
    """'' if fine: a 4xx in Anthropic's error shape, or a message / token count / stream that is
    whole (message_start ... message_stop, each event named by its data's type)."""
    status = response.status_code
    if status != 200:
        if not 400 <= status < 500:
            return f"status {status}: {response.text[:300]}"
        try:
            body = response.json()
            shaped = body["type"] == "error" and isinstance(body["error"]["message"], str)
            return "" if shaped and body["error"]["type"] in ANTHROPIC_ERROR_TYPES else f"bad error shape: {body}"
        except (ValueError, KeyError, TypeError):
            return f"{status} without Anthropic's error shape: {response.text[:200]}"
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            events = anthropic_sse(response.text)
        except ValueError as exc:
            return f"bad SSE payload: {exc}"
        names = [name for name, _ in events]
        if not names or names[0] != "message_start" or names[-1] != "message_stop" or "error" in names:
            return f"a stream that does not end properly: {names[:3]} ... {events[-2:]}"
        if any(not isinstance(data, dict) or data.get("type") != name for name, data in events):
            return "an event whose name is not its data's type"
        return ""
    body = response.json()
    if path.endswith("/count_tokens"):
        return "" if isinstance(body.get("input_tokens"), int) else f"not a token count: {body}"
    if body.get("type") != "message" or body.get("stop_reason") not in ANTHROPIC_STOP_REASONS:
        return f"not a whole message: {response.text[:200]}"
    return ""


def test_fuzz_anthropic_messages_api(served):
    rng = random.Random(SEED + 2400)
    cases = [("POST", *anthropic_case(rng)) for _ in range(N_ANTHROPIC_REQUESTS)]
    ok = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "the"}]}
    fuzz_api(served, "anthropic", cases, lambda method, path, response: check_anthropic_answer(path, response),
             ("/v1/messages", ok, lambda body: body["type"] == "message"))


# -- issue 24: Ollama's API -----------------------------------------------------------------------

N_OLLAMA_REQUESTS = 150
OLLAMA_POSTS = ["/api/chat", "/api/chat", "/api/generate", "/api/generate", "/api/show", "/api/pull"]
OLLAMA_GETS = ["/api/tags", "/api/ps", "/api/version", "/", "/api/nowhere"]
OLLAMA_FIELDS = [
    "model", "messages", "prompt", "suffix", "system", "template", "raw", "images", "format", "options", "stream",
    "think", "keep_alive", "context", "tools", "logprobs", "top_logprobs", "name", "insecure", "verbose",
]
OLLAMA_OPTIONS = ["num_predict", "num_ctx", "num_keep", "temperature", "top_k", "top_p", "min_p", "typical_p",
                  "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "seed", "stop",
                  "mirostat", "mirostat_tau", "tfs_z", "num_gpu", "ignore_eos", "dry_multiplier", "zz_unknown"]


def ollama_values(rng: random.Random) -> list:
    """nasty_values plus Ollama's messages, calls, images, formats and durations, right and wrong."""
    call = {"function": {"name": rng.choice(["f", 5]), "arguments": rng.choice([{"a": 1}, "x", None])}}
    return nasty_values(rng) + [
        [{"role": "user", "content": "hi", "images": rng.choice([["iVBORw0KGgo="], "x", [5]])}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "content": "ok", "tool_name": rng.choice(["f", 5, None])}],
        [{"role": rng.choice(["system", "wizard", None]), "content": "hi", "thinking": rng.choice(["t", 5])}],
        "json", "xml", {"type": "object", "properties": {"a": {"enum": ["x"]}}}, {"type": "nonsense"},
        "5m", "1h30m", "-1s", "10", "5 minutes", -1, "low", "high", "extreme",
        {rng.choice(OLLAMA_OPTIONS): rng.choice([1, -2, 0.5, "x", [], None, 10**7])},
        {"num_predict": rng.choice([1, 2]), rng.choice(OLLAMA_OPTIONS): rng.choice([1, 0.5, True])},
        [1, 2, 3], [10**6], "hf.co/tester/Missing-GGUF:Q8_0", "tester/Missing-GGUF", "llama3.2",
    ]


def ollama_case(rng: random.Random) -> tuple[str, str, bytes | None]:
    if rng.random() < 0.1:
        return rng.choice(["GET", "HEAD"]), rng.choice(OLLAMA_GETS), None
    path = rng.choice(OLLAMA_POSTS)
    if rng.random() < 0.1:
        return "POST", path, raw_body(rng)
    body: dict = {"model": "tiny", "options": {"num_predict": rng.choice([1, 2, 4])}}
    if path == "/api/chat":
        body["messages"] = [{"role": "user", "content": rng.choice(["hi", "the cat", ""])}]
    elif path == "/api/generate":
        body["prompt"] = rng.choice(["the", "in the a", ""])
    elif path == "/api/pull":
        body["model"] = rng.choice(["tester/Missing-GGUF", "llama3.2", "hf.co/a/b:Q4_K_M"])
    if rng.random() < 0.5:
        body["stream"] = False
    values = ollama_values(rng)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        target = body
        if rng.random() < 0.15 and isinstance(body.get("messages"), list):
            target = body["messages"][0]  # odd fields inside a message
        elif rng.random() < 0.15:
            target = body["options"]  # odd options
        target[rng.choice(OLLAMA_FIELDS + OLLAMA_OPTIONS + ["role", "content"])] = rng.choice(values)
    try:
        text = json.dumps(body, allow_nan=False)
    except ValueError:
        text = json.dumps({k: v for k, v in body.items() if not isinstance(v, float)})
    return "POST", path, text.encode("utf-8", "surrogatepass")


def check_ollama_answer(method: str, path: str, response: httpx.Response) -> str:
    """'' if fine: a 4xx (501 for embeddings and the model store) as `{"error": message}`, or a 200:
    JSON, plain text for `/`, or NDJSON lines each an object, the last `done: true` (a pull's:
    status "success") or an error line."""
    status = response.status_code
    if status != 200:
        if not 400 <= status < 500:
            return f"status {status}: {response.text[:300]}"
        if method == "HEAD":
            return ""  # no body to shape
        try:
            body = response.json()
        except ValueError:
            return f"{status} without Ollama's error shape: {response.text[:200]}"
        return "" if isinstance(body, dict) and list(body) == ["error"] and isinstance(body["error"], str) \
            else f"bad error shape: {body}"
    kind = response.headers.get("content-type", "")
    if method == "HEAD" or path == "/":
        return ""
    try:
        lines = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    except ValueError as exc:
        return f"a line that is not JSON: {exc}: {response.text[:200]}"
    if not lines or not all(isinstance(line, dict) for line in lines):
        return f"not JSON objects: {response.text[:200]}"
    if not kind.startswith("application/x-ndjson"):
        return "" if len(lines) == 1 else f"several lines without the NDJSON type: {response.text[:200]}"
    last = lines[-1]
    ended = last.get("done") is True or last.get("status") == "success" or isinstance(last.get("error"), str)
    if not ended or any("error" in line for line in lines[:-1]):
        return f"a stream that does not end properly: {lines[-2:]}"
    return ""


def test_fuzz_ollama_api(served, tmp_path, monkeypatch):
    from huggingface_hub import constants

    # /api/pull never reaches the network here: offline, with an empty cache, it fails at once.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    rng = random.Random(SEED + 2424)
    cases = [ollama_case(rng) for _ in range(N_OLLAMA_REQUESTS)]
    ok = {"messages": [{"role": "user", "content": "the"}], "options": {"num_predict": 2}, "stream": False}
    fuzz_api(served, "ollama", cases, check_ollama_answer, ("/api/chat", ok, lambda body: body["done"] is True))

# -- images (issue 23): prompt objects with multimodal_data, chat image_url parts --------------------

N_IMAGE_REQUESTS = 160
MARKER = "<__media__>"


def image_values(rng: random.Random, images: list[str]) -> list:
    """Image payloads and their odd neighbours: real images (base64), bytes that are not an image,
    a decompression bomb's header, not base64, wrong types."""
    import base64
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 90_000, 90_000, 8, 2, 0, 0, 0))
    return [*images, *images, base64.b64encode(b"this is not an image").decode(), base64.b64encode(bomb).decode(),
            "not base64!", "", "=" * 8, images[0][: len(images[0]) // 2], None, 5, [], {}, "\ud800", "x" * 5000]


def image_url_values(rng: random.Random, images: list[str], media_dir: str) -> list:
    data = [f"data:image/png;base64,{image}" for image in images]
    return [*data, *data, images[0], "data:image/png,rawbytes", "data:;base64,", "data:image/png;base64,@@@",
            f"file://{media_dir}/tiny.png", f"file://{media_dir}/../etc/passwd", "file:///etc/passwd",
            f"file://{media_dir}/missing.png", "http://127.0.0.1:9/x.png", "https://example.com/a.png", "ftp://x/y",
            "", None, 7, {"url": None}, ["x"]]


def image_case(rng: random.Random, images: list[str], media_dir: str) -> tuple[str, str, bytes]:
    if rng.random() < 0.5:
        path = rng.choice(["/completion", "/completion", "/completions", "/v1/completions", "/infill", "/v1/embeddings"])
        markers = rng.choice([0, 1, 1, 2, 3])
        text = rng.choice(["a ", "", "picture: "]).join([""] + [MARKER] * markers) + rng.choice([" shows a", "", "\n"])
        if rng.random() < 0.4:  # a well-formed request: one real image per marker
            data = [rng.choice(images) for _ in range(markers)]
        else:
            data = [rng.choice(image_values(rng, images)) for _ in range(rng.choice([0, 1, 1, 2]))]
        prompt: object = {"prompt_string": text, "multimodal_data": data}
        if rng.random() < 0.1:
            prompt = rng.choice([{"prompt_string": 5}, {"multimodal_data": images[:1]}, [prompt, "plain"], [prompt, prompt]])
        if rng.random() < 0.1:
            prompt["multimodal_data"] = rng.choice(image_values(rng, images))  # type: ignore[index]
        body: dict = {"prompt": prompt, "n_predict": rng.choice([0, 1, 2]), "input_prefix": "def f(",
                      "input": prompt}
    else:
        path = rng.choice(["/v1/chat/completions", "/apply-template", "/v1/chat/completions/input_tokens"])
        parts = []
        for _ in range(rng.choice([1, 2, 3])):
            if rng.random() < 0.6:
                url = rng.choice(image_url_values(rng, images, media_dir))
                parts.append(rng.choice([{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "image_url", "image_url": url}, {"type": "image_url"},
                                         {"type": "input_audio", "input_audio": {"data": "aGk="}}]))
            else:
                parts.append({"type": "text", "text": rng.choice(["What is it?", "", MARKER])})
        body = {"messages": [{"role": "user", "content": parts}], "max_tokens": rng.choice([1, 2]),
                "n": rng.choice([1, 1, 2])}
    if rng.random() < 0.25:
        body["stream"] = True
    text = json.dumps(body)
    return "POST", path, text.encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def vision_served(smollm2_path, tmp_path_factory):
    """SmolLM2 with the reference mlp projector (../shared/reference/vision), --media-path."""
    from conftest import reference_path
    from test_server_support import serve

    from lamplight.server.launcher import EngineOptions, build_engine, load_model

    vision = reference_path("vision")
    media = tmp_path_factory.mktemp("media")
    (media / "tiny.png").write_bytes((vision / "images" / "tiny_8x8.png").read_bytes())
    options = EngineOptions(n_ctx=4 * 512, n_parallel=4, n_ubatch=128, weights="fast",
                            mmproj=str(vision / "mmproj" / "mmproj-mlp.gguf"), media_path=str(media))
    loaded = load_model(str(smollm2_path), options)
    engine = build_engine(loaded, options)
    server = serve(loaded, engine)
    try:
        yield server, engine, vision, media
    finally:
        server.stop()
        engine.stop()


def check_image_answer(method: str, path: str, response: httpx.Response) -> str:
    """check_answer's rules; /v1/embeddings answers 501 here (a server started without --embeddings)."""
    if path == "/v1/embeddings" and response.status_code == 501:
        return ""
    return check_answer(method, path, response)


@pytest.mark.real_model
def test_fuzz_image_inputs(vision_served):
    import base64

    server, engine, vision, media = vision_served
    images = [base64.b64encode((vision / "images" / name).read_bytes()).decode()
              for name in ("tiny_8x8.png", "gray_50x70.png", "photo_120x90.jpg")]
    rng = random.Random(SEED + 2323)
    cases = [image_case(rng, images, str(media)) for _ in range(N_IMAGE_REQUESTS)]
    ok = {"prompt": {"prompt_string": f"a {MARKER} shows a", "multimodal_data": images[:1]}, "n_predict": 2}
    fuzz_api((server, engine), "images", cases, check_image_answer,
             ("/completion", ok, lambda body: body["tokens_evaluated"] > 64))  # the image is 64 rows
