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
