"""The remaining llama-server fields and endpoints through the HTTP API, on the tiny random-weight
model: LoRA adapters (--lora, /lora-adapters, per-request `lora`), slot save/restore/erase,
/infill, context shift and n_keep, return_tokens, timings_per_token, return_progress,
response_fields, multimodal inputs, /slots and /metrics, and the CLI flags behind them."""

from __future__ import annotations

import copy
import os
import threading
import time

import httpx
import pytest
from model_helpers import runner_for
from test_lora import TARGETS, merged_model
from test_server_cli import free_port
from test_server_support import assert_error, serve, sse_events
from tiny_gguf import write_tiny_llama, write_tiny_lora

import lamplight
from lamplight.cli import build_parser, engine_options, main, server_settings
from lamplight.gguf.file import GGUFFile
from lamplight.loader import AdapterError, load_adapters
from lamplight.runner import greedy
from lamplight.server import ServerSettings
from lamplight.server.infill import FimTokens, InfillInput, format_infill_prompt
from lamplight.server.launcher import EngineOptions, build_engine, load_model

GREEDY = {"temperature": 0, "ignore_eos": True}
# Byte tokens \x01..\x05 of the tiny vocabulary stand in for FIM_PRE, FIM_SUF, FIM_MID, FIM_REP, FIM_SEP.
FIM = FimTokens(prefix=4, suffix=5, middle=6, repo=7, sep=8)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("seed")
    return {"model": write_tiny_llama(d / "tiny.gguf"), "adapter": write_tiny_lora(d / "adapter.gguf", TARGETS),
            "slots": d / "slots", "dir": d}


@pytest.fixture(scope="module")
def loaded(files):
    return lamplight.load(str(files["model"]))


@pytest.fixture(scope="module")
def engine(loaded):
    """2 slots of 256 tokens; small steps (several progress events per prompt); n_batch 64 (/infill)."""
    engine = build_engine(loaded, EngineOptions(n_ctx=512, n_parallel=2, n_ubatch=16, n_batch=64))
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def client(loaded, engine, files):
    os.makedirs(files["slots"], exist_ok=True)
    server = serve(loaded, engine, ServerSettings(slot_save_path=str(files["slots"]), metrics=True))
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client
    server.stop()


@pytest.fixture(scope="module")
def plain_client(loaded, engine):
    """The same engine without --slot-save-path and --metrics, and with --no-slots."""
    server = serve(loaded, engine, ServerSettings(slots_endpoint=False))
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client
    server.stop()


def completion(client, **body) -> dict:
    response = client.post("/completion", json=body)
    assert response.status_code == 200, response.text
    return response.json()


# -- CLI flags -------------------------------------------------------------------------------

def test_cli_flags_reach_the_engine_and_settings(tmp_path):
    args = build_parser().parse_args([
        "serve", "--lora", "a.gguf,b.gguf", "--lora-scaled", "c.gguf:0.5", "--lora", "d.gguf",
        "--lora-scaled", "e.gguf:-1,f.gguf:2", "--lora-init-without-apply", "--context-shift",
        "--slot-save-path", str(tmp_path), "--spm-infill"])
    options = engine_options(args)
    assert list(options.loras) == [("a.gguf", 1.0), ("b.gguf", 1.0), ("c.gguf", 0.5), ("d.gguf", 1.0),
                                   ("e.gguf", -1.0), ("f.gguf", 2.0)]
    assert options.lora_init_without_apply and options.context_shift
    settings = server_settings(args)
    assert settings.slot_save_path == str(tmp_path) and settings.spm_infill
    defaults = build_parser().parse_args(["serve"])
    assert engine_options(defaults).loras == () and not engine_options(defaults).context_shift
    assert server_settings(defaults).slot_save_path is None
    assert not engine_options(build_parser().parse_args(["serve", "--context-shift", "--no-context-shift"])).context_shift
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--lora-scaled", "no-scale.gguf"])


def test_context_shift_flag_reaches_the_engine_config(loaded):
    for flag in (True, False):
        engine = build_engine(loaded, EngineOptions(n_ctx=64, n_parallel=1, context_shift=flag))
        try:
            assert engine.config.context_shift is flag
        finally:
            engine.stop()


def test_start_up_errors_are_clear(files, capsys):
    assert main(["serve", "-m", str(files["model"]), "--lora", "/no/such/adapter.gguf"]) == 1
    assert "LoRA adapter not found: /no/such/adapter.gguf" in capsys.readouterr().err
    assert main(["serve", "-m", str(files["model"]), "--slot-save-path", "/no/such/dir"]) == 1
    assert "--slot-save-path: not a directory" in capsys.readouterr().err
    # A file that is not an adapter only shows when it is loaded, after the port is bound.
    code = main(["serve", "-m", str(files["model"]), "--lora", str(files["model"]), "--port", str(free_port())])
    assert code == 1
    err = capsys.readouterr().err
    assert "failed to load LoRA adapter" in err and "is not a LoRA adapter" in err
    assert "failed to load the model" not in err


def test_adapters_in_load_order_and_init_without_apply(files):
    adapters = load_adapters([(str(files["adapter"]), 0.5), (str(files["adapter"]), 1.0)], "llama")
    assert [a.scale for a in adapters] == [0.5, 1.0]
    assert [a.scale for a in load_adapters([(str(files["adapter"]), 0.5)], "llama", init_without_apply=True)] == [0.0]
    with pytest.raises(AdapterError, match="adapter is for 'llama'"):
        load_adapters([(str(files["adapter"]), 1.0)], "gemma3")


# -- LoRA ------------------------------------------------------------------------------------

PROMPT = [40, 50, 60, 70, 80]


@pytest.fixture(scope="module")
def lora_client(files):
    """A server started like `lamplight serve --lora adapter.gguf -c 512 -np 2 --weights reference`."""
    args = build_parser().parse_args(["serve", "-m", str(files["model"]), "--lora", str(files["adapter"]),
                                      "-c", "512", "-np", "2", "--weights", "reference"])
    loaded = load_model(args.model, engine_options(args))  # the reference path, as the expected tokens
    engine = build_engine(loaded, engine_options(args))
    server = serve(loaded, engine, server_settings(args))
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client
    server.stop()
    engine.stop()


def test_lora_per_request_and_server_wide(lora_client, files):
    base = greedy(runner_for(files["model"]), PROMPT, 10)
    merged = greedy(merged_model(files["model"], files["adapter"], 1.0), PROMPT, 10)
    assert base != merged
    adapters = lora_client.get("/lora-adapters").json()
    assert adapters == [{"id": 0, "path": str(files["adapter"]), "scale": 1.0, "task_name": "", "prompt_prefix": ""}]

    def tokens(**extra):
        body = completion(lora_client, prompt=PROMPT, n_predict=10, return_tokens=True, **GREEDY, **extra)
        return body["tokens"], body["generation_settings"]["lora"]

    assert tokens(lora=[{"id": 0, "scale": 0}]) == (base, [{"id": 0, "scale": 0.0}])
    assert tokens(lora=[{"id": 0, "scale": 1}]) == (merged, [{"id": 0, "scale": 1.0}])
    assert tokens(lora=[]) == (base, [{"id": 0, "scale": 0.0}])  # unlisted adapters get 0
    assert tokens() == (merged, [{"id": 0, "scale": 1.0}])  # the server's scale (--lora: 1)

    # POST /lora-adapters changes the default of requests that name no adapters.
    assert lora_client.post("/lora-adapters", json=[{"id": 0, "scale": 0}]).json() == {"success": True}
    assert lora_client.get("/lora-adapters").json()[0]["scale"] == 0.0
    assert tokens() == (base, [{"id": 0, "scale": 0.0}])
    assert lora_client.get("/props").json()["default_generation_settings"]["params"]["lora"] == [{"id": 0, "scale": 0.0}]
    assert tokens(lora=[{"id": 0, "scale": 1.0}])[0] == merged  # a request's own scales still win
    assert lora_client.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}]).status_code == 200
    assert tokens()[0] == merged
    assert lora_client.post("/lora-adapters", json=[]).status_code == 200  # unlisted -> 0
    assert lora_client.get("/lora-adapters").json()[0]["scale"] == 0.0
    lora_client.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}])


@pytest.mark.parametrize("body, message", [
    ([{"id": 3, "scale": 1}], "no adapter with id 3"),
    ({"id": 0, "scale": 1}, "Request body must be an array"),
    ([{"id": 0}], "entry 0 must be an object"),
    ([{"id": "zero", "scale": 1}], "Field 'lora': entry 0"),
    ([{"id": 0, "scale": "big"}], "Field 'lora': entry 0"),
    (["x"], "entry 0 must be an object"),
])
def test_lora_adapters_bad_bodies(lora_client, body, message):
    assert_error(lora_client.post("/lora-adapters", json=body), 400, "invalid_request_error", message)
    assert lora_client.get("/lora-adapters").json()[0]["scale"] == 1.0  # unchanged


def test_lora_request_errors(lora_client):
    for lora, message in [([{"id": 1, "scale": 1}], "no adapter with id 1"), ({"id": 0}, "Field 'lora'"),
                          ([{"scale": 1}], "Field 'lora'")]:
        assert_error(lora_client.post("/completion", json={"prompt": "x", "lora": lora}), 400,
                     "invalid_request_error", message)
    raw = lora_client.post("/lora-adapters", content=b"[{", headers={"content-type": "application/json"})
    assert_error(raw, 400, "invalid_request_error", "not valid JSON")


def test_lora_adapters_without_adapters(client):
    assert client.get("/lora-adapters").json() == []
    assert client.post("/lora-adapters", json=[]).json() == {"success": True}
    assert_error(client.post("/lora-adapters", json=[{"id": 0, "scale": 1}]), 400, "invalid_request_error")


# -- slot save / restore / erase -------------------------------------------------------------

def slot_action(client, slot, action, **body):
    return client.post(f"/slots/{slot}", params={"action": action}, json=body or None)


def test_slot_save_erase_restore_continue_equals_never_saving(client, files):
    first = {"prompt": "The sky is blue and", "n_predict": 8, "return_tokens": True, **GREEDY}

    def run_first(slot):
        assert slot_action(client, slot, "erase").status_code == 200  # start from an empty slot
        body = completion(client, id_slot=slot, **first)
        return client.post("/tokenize", json={"content": first["prompt"]}).json()["tokens"] + body["tokens"]

    def run_second(slot, prompt):
        return completion(client, prompt=prompt, n_predict=8, return_tokens=True, id_slot=slot, **GREEDY)

    # Never saving: the second request continues from the first one's cache.
    prompt = run_first(0)
    never_saved = run_second(0, prompt)
    assert never_saved["timings"]["cache_n"] == len(prompt) - 1

    # Save, erase, use the slot for something else, restore, continue.
    assert run_first(0) == prompt
    saved = slot_action(client, 0, "save", filename="slot0.bin").json()
    assert set(saved) == {"id_slot", "filename", "n_saved", "n_written", "timings"}
    assert (saved["id_slot"], saved["filename"], saved["n_saved"]) == (0, "slot0.bin", len(prompt) - 1)
    assert saved["n_written"] == os.path.getsize(files["slots"] / "slot0.bin") and saved["timings"]["save_ms"] >= 0
    assert slot_action(client, 0, "erase").json() == {"id_slot": 0, "n_erased": len(prompt) - 1}
    completion(client, prompt="something else entirely", n_predict=4, id_slot=0, **GREEDY)
    restored = slot_action(client, 0, "restore", filename="slot0.bin").json()
    assert set(restored) == {"id_slot", "filename", "n_restored", "n_read", "timings"}
    assert (restored["id_slot"], restored["n_restored"], restored["n_read"]) == (0, len(prompt) - 1, saved["n_written"])
    after_restore = run_second(0, prompt)
    assert after_restore["tokens"] == never_saved["tokens"]
    assert after_restore["content"] == never_saved["content"]
    assert after_restore["timings"]["cache_n"] == len(prompt) - 1

    # The file restores into another slot too.
    assert slot_action(client, 1, "restore", filename="slot0.bin").status_code == 200
    other = run_second(1, prompt)
    assert other["tokens"] == never_saved["tokens"] and other["timings"]["cache_n"] == len(prompt) - 1


@pytest.mark.parametrize("path, body, code, message", [
    ("/slots/0?action=fly", {"filename": "x"}, 400, "Invalid action"),
    ("/slots/0", {"filename": "x"}, 400, "Invalid action"),
    ("/slots/abc?action=erase", None, 400, "Invalid slot ID"),
    ("/slots/7?action=erase", None, 400, "slot 7 does not exist"),
    ("/slots/7?action=save", {"filename": "x.bin"}, 400, "slot 7 does not exist"),
    ("/slots/0?action=save", {"filename": "../escape.bin"}, 400, "Invalid filename"),
    ("/slots/0?action=save", {"filename": "a/b.bin"}, 400, "Invalid filename"),
    ("/slots/0?action=save", {}, 400, '"filename" is required'),
    ("/slots/0?action=save", {"filename": 5}, 400, "Field 'filename'"),
    ("/slots/0?action=restore", {"filename": "never-saved.bin"}, 400, "does not exist"),
])
def test_slot_action_errors(client, path, body, code, message):
    assert_error(client.post(path, json=body), code, "invalid_request_error", message)


def test_slot_action_on_a_corrupt_file(client, files):
    (files["slots"] / "junk.bin").write_bytes(b"not a slot file")
    assert_error(slot_action(client, 0, "restore", filename="junk.bin"), 400, "invalid_request_error", "junk.bin")


def test_slot_actions_need_slot_save_path(plain_client):
    for action in ("save", "restore", "erase"):
        assert_error(slot_action(plain_client, 0, action, filename="x.bin"), 501, "not_supported_error",
                     "--slot-save-path")


# -- /infill ---------------------------------------------------------------------------------

def test_infill_needs_fim_tokens(client):
    error = assert_error(client.post("/infill", json={"input_prefix": "a", "input_suffix": "b"}), 400,
                         "invalid_request_error", "Infill is not supported by this model")
    assert "prefix token is missing" in error["message"] and "middle token is missing" in error["message"]


@pytest.fixture(scope="module")
def fim_client(loaded, engine):
    """The tiny model with FIM tokens (byte tokens standing in for them)."""
    fim_loaded = copy.copy(loaded)
    tokenizer = fim_loaded.tokenizer = copy.copy(loaded.tokenizer)
    tokenizer.fim_prefix_id, tokenizer.fim_suffix_id, tokenizer.fim_middle_id = FIM.prefix, FIM.suffix, FIM.middle
    tokenizer.fim_rep_id, tokenizer.fim_sep_id = FIM.repo, FIM.sep
    server = serve(fim_loaded, engine)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client
    server.stop()


def test_infill_prompt_layout_and_answer(fim_client, client):
    def tok(text):
        return fim_client.post("/tokenize", json={"content": text, "parse_special": False}).json()["tokens"]

    body = {"input_prefix": "def f(", "input_suffix": "):\n    pass\n", "prompt": "x",
            "input_extra": [{"filename": "a.py", "text": "import os\n"}, {"text": "y = 1\n"}],
            "n_predict": 6, "return_tokens": True, **GREEDY}
    answer = fim_client.post("/infill", json=body).json()
    # llama.cpp's repo-level FIM layout; `prompt` goes after the prefix, before FIM_SUF.
    expected = ([FIM.repo] + tok("myproject\n") + [FIM.sep] + tok("a.py\n") + tok("import os\n")
                + [FIM.sep] + tok("tmp\n") + tok("y = 1\n") + [FIM.sep] + tok("filename\n")
                + [FIM.prefix] + tok("def f(") + tok("x") + [FIM.suffix] + tok("):\n    pass\n") + [FIM.middle])
    assert answer["tokens_evaluated"] == len(expected)
    assert answer["prompt"] == fim_client.post("/detokenize", json={"tokens": expected}).json()["content"]
    # The native /completion answer, for that prompt.
    same = completion(client, prompt=expected, n_predict=6, return_tokens=True, **GREEDY)
    assert answer["tokens"] == same["tokens"] and answer["content"] == same["content"]
    assert set(answer) == set(same) and answer["stop_type"] == "limit"
    streamed = sse_events(fim_client.post("/infill", json={**body, "stream": True}).text)
    assert "".join(e["content"] for e in streamed) == answer["content"] and streamed[-1]["stop"] is True
    assert "[DONE]" not in streamed
    fields = fim_client.post("/infill", json={**body, "response_fields": ["content", "tokens_evaluated"]}).json()
    assert fields == {"content": answer["content"], "tokens_evaluated": len(expected)}


@pytest.mark.parametrize("body, message", [
    ({"input_suffix": "b"}, '"input_prefix" is required'),
    ({"input_prefix": "a"}, '"input_suffix" is required'),
    ({"input_prefix": 1, "input_suffix": "b"}, '"input_prefix" must be a string'),
    ({"input_prefix": "a", "input_suffix": "b", "prompt": ["x"]}, '"prompt" must be a string'),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": {"text": "x"}}, '"input_extra" must be an array'),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "f"}]}, 'must contain a "text" field'),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": ["x"]}, 'must contain a "text" field'),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "x", "filename": 3}]},
     '"filename" field must be a string'),
    ({"input_prefix": "a", "input_suffix": "b", "top_p": 9}, "Field 'top_p'"),
    ({"input_prefix": [99999], "input_suffix": "b"}, "out of range"),
])
def test_infill_request_errors(fim_client, body, message):
    assert_error(fim_client.post("/infill", json=body), 400, "invalid_request_error", message)


class _Tok:
    """Characters as token ids (ord), for checking the layout arithmetic."""

    add_bos, bos_id = True, 1

    def encode(self, text, add_special=False, parse_special=False):
        return [ord(c) for c in text]


def test_infill_prompt_spm_truncation_and_snippets():
    tok = _Tok()
    text = InfillInput(prefix="abcdefghij", suffix="KLMNOPQRST", extra=[{"filename": "f", "text": "zz"}], prompt="p")
    no_sep = FimTokens(prefix=-1, suffix=-2, middle=-3, repo=None, sep=None)
    ids = format_infill_prompt(tok, no_sep, text, n_batch=2048, n_predict=-1, n_ctx=4096)
    snippet = [ord(c) for c in "\n\n--- snippet ---\n\nzz"]
    assert ids == snippet + [1, -1] + tok.encode("abcdefghijp") + [-2] + tok.encode("KLMNOPQRST") + [-3]
    spm = format_infill_prompt(tok, no_sep, text, n_batch=2048, n_predict=-1, n_ctx=4096, spm_infill=True)
    assert spm == snippet + [1, -2] + tok.encode("KLMNOPQRST") + [-1] + tok.encode("abcdefghijp") + [-3]
    # n_batch 8: the prefix keeps its last 3*(8/4) = 6 tokens, the suffix its first 8/4 - (2 + 1) -> 0,
    # and the extra context only n_ctx - n_batch - 2*n_predict = 20 - 8 - 2*4 = 4 tokens (its end).
    small = format_infill_prompt(tok, no_sep, text, n_batch=8, n_predict=4, n_ctx=20)
    assert small == snippet[-4:] + [1, -1] + tok.encode("efghijp") + [-2, -3]


# -- context shift and n_keep ----------------------------------------------------------------

@pytest.fixture(scope="module")
def small_slots(loaded, files):
    """One 64-token slot with --context-shift (and --metrics, --slot-save-path), one without."""
    shifting = build_engine(loaded, EngineOptions(n_ctx=64, n_parallel=1, context_shift=True))
    stopping = build_engine(loaded, EngineOptions(n_ctx=64, n_parallel=1))
    servers = [serve(loaded, shifting, ServerSettings(metrics=True, slot_save_path=str(files["dir"]))),
               serve(loaded, stopping)]
    yield [server.url for server in servers]
    for server in servers:
        server.stop()
    shifting.stop()
    stopping.stop()


def test_context_shift_keeps_generating(small_slots):
    shifting, stopping = small_slots
    body = {"prompt": "The sky", "n_predict": 150, "return_tokens": True, **GREEDY}
    response = httpx.post(f"{shifting}/completion", json={**body, "stream": True}, timeout=60)
    response.content.decode("utf-8")  # strict: the stream is valid UTF-8
    events = sse_events(response.text)
    assert all("error" not in e for e in events)
    partials, final = events[:-1], events[-1]
    assert len(partials) == 150 and [e["tokens_predicted"] for e in partials] == list(range(1, 151))
    assert final["stop"] and final["tokens_predicted"] == 150 and final["truncated"] is True
    assert final["stop_type"] == "limit" and final["tokens_cached"] < 64
    whole = httpx.post(f"{shifting}/completion", json=body, timeout=60).json()
    assert whole["content"] == "".join(e["content"] for e in partials)
    assert whole["tokens"] == [e["tokens"][0] for e in partials]
    # Without --context-shift the generation stops when the slot is full.
    stopped = httpx.post(f"{stopping}/completion", json=body, timeout=60).json()
    n_prompt = stopped["tokens_evaluated"]
    assert stopped["tokens_predicted"] == 64 - n_prompt and stopped["truncated"] is True
    assert stopped["stop_type"] == "limit"
    assert stopped["tokens"] == whole["tokens"][:64 - n_prompt]  # the same text up to the first shift
    short = httpx.post(f"{shifting}/completion", json={**body, "n_predict": 10}, timeout=60).json()
    assert short["truncated"] is False


def expected_tokens_cached(n_prompt: int, n_predict: int, n_ctx: int, n_keep: int) -> int:
    """The slot's tokens at the end, per llama-server's shift rule (tiny model: no BOS)."""
    computed, generated = n_prompt, 1
    while generated < n_predict:
        if computed + 1 >= n_ctx:
            keep = min(n_prompt if n_keep < 0 else n_keep, n_ctx - 4)
            computed -= (computed - keep) // 2
        computed += 1
        generated += 1
    return computed


def test_n_keep(small_slots):
    shifting, _ = small_slots
    prompt = "the other one in the sea"
    seen = set()
    for n_keep in (0, -1, 12, 500):
        body = httpx.post(f"{shifting}/completion", json={
            "prompt": prompt, "n_predict": 120, "n_keep": n_keep, "cache_prompt": False, **GREEDY}, timeout=60).json()
        assert body["generation_settings"]["n_keep"] == n_keep and body["truncated"] is True
        assert body["tokens_predicted"] == 120
        assert body["tokens_cached"] == expected_tokens_cached(body["tokens_evaluated"], 120, 64, n_keep)
        seen.add(body["tokens_cached"])
    assert len(seen) >= 3  # n_keep changes what the shifts discard
    for bad in (-2, "all", 1.5):
        assert_error(httpx.post(f"{shifting}/completion", json={"prompt": "x", "n_keep": bad}), 400,
                     "invalid_request_error", "Field 'n_keep'")


def test_busy_slot_slots_and_metrics(small_slots, plain_client):
    """A generation that runs until cancelled: /slots?fail_on_no_slot=1 is 503, a second request
    waits (requests_deferred), a busy slot cannot be saved; all is back to idle afterwards."""
    shifting, _ = small_slots

    def metric(name: str) -> float:
        text = httpx.get(f"{shifting}/metrics").text
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))

    assert httpx.get(f"{shifting}/slots", params={"fail_on_no_slot": 1}).status_code == 200
    waiting: list[httpx.Response] = []
    with httpx.Client(timeout=60) as streamer:
        with streamer.stream("POST", f"{shifting}/completion", json={
                "prompt": "The sky", "n_predict": 100000, "stream": True, **GREEDY}) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            assert_error(httpx.get(f"{shifting}/slots", params={"fail_on_no_slot": 1}), 503, "unavailable_error",
                         "no slot available")
            slots = httpx.get(f"{shifting}/slots").json()
            assert slots[0]["is_processing"] is True and slots[0]["next_token"][0]["n_remain"] > 0
            assert metric("llamacpp:requests_processing") == 1
            assert 0 < metric("llamacpp:kv_cache_usage_ratio") <= 1 and metric("llamacpp:kv_cache_tokens") > 0
            assert_error(httpx.post(f"{shifting}/slots/0?action=save", json={"filename": "busy.bin"}),
                         400, "invalid_request_error", "busy")
            second = threading.Thread(target=lambda: waiting.append(httpx.post(
                f"{shifting}/completion", json={"prompt": "hi", "n_predict": 2, **GREEDY}, timeout=60)))
            second.start()
            deadline = time.monotonic() + 10
            while metric("llamacpp:requests_deferred") != 1:
                assert time.monotonic() < deadline, "the second request was never deferred"
                time.sleep(0.05)
        # Leaving the block closed the stream: the generation is cancelled and the slot freed.
    second.join(30)
    assert waiting and waiting[0].status_code == 200 and waiting[0].json()["tokens_predicted"] == 2
    deadline = time.monotonic() + 10
    while httpx.get(f"{shifting}/slots", params={"fail_on_no_slot": 1}).status_code != 200:
        assert time.monotonic() < deadline, "the slot never became idle"
        time.sleep(0.05)
    assert metric("llamacpp:requests_processing") == 0 and metric("llamacpp:requests_deferred") == 0
    # --no-slots
    assert_error(plain_client.get("/slots"), 501, "not_supported_error", "--slots")


def test_metrics(client, plain_client):
    assert_error(plain_client.get("/metrics"), 501, "not_supported_error", "--metrics")
    completion(client, prompt="The metrics", n_predict=3, **GREEDY)
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert int(response.headers["process-start-time-unix"]) > 0
    values = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:prompt_seconds_total",
                 "llamacpp:tokens_predicted_seconds_total", "llamacpp:prompt_tokens_seconds",
                 "llamacpp:predicted_tokens_seconds", "llamacpp:n_decode_total", "llamacpp:n_tokens_max"):
        assert values[name] > 0, name
    assert values["llamacpp:requests_processing"] == 0 and values["llamacpp:requests_deferred"] == 0
    assert 0 < values["llamacpp:kv_cache_usage_ratio"] <= 1 and values["llamacpp:kv_cache_tokens"] > 0
    before = values["llamacpp:tokens_predicted_total"]
    completion(client, prompt="More", n_predict=2, **GREEDY)
    after = client.get("/metrics").text
    assert f"llamacpp:tokens_predicted_total {before + 2}" in after


# -- per-request fields ----------------------------------------------------------------------

def test_return_tokens(client):
    body = {"prompt": "The sky", "n_predict": 5, **GREEDY}
    plain = completion(client, **body)
    assert plain["tokens"] == []
    with_tokens = completion(client, return_tokens=True, **body)
    assert len(with_tokens["tokens"]) == 5 and with_tokens["content"] == plain["content"]
    events = sse_events(client.post("/completion", json={**body, "stream": True}).text)
    assert [e["tokens"] for e in events[:-1]] == [[t] for t in with_tokens["tokens"]]  # streams always carry ids
    assert events[-1]["tokens"] == []  # already streamed
    assert events[-1]["stop"] is True
    streamed_with = sse_events(client.post("/completion", json={**body, "stream": True, "return_tokens": True}).text)
    assert streamed_with[-1]["tokens"] == []
    assert_error(client.post("/completion", json={**body, "return_tokens": 1}), 400, "invalid_request_error",
                 "Field 'return_tokens'")


def test_timings_per_token(client):
    body = {"prompt": "The sky is", "n_predict": 6, "stream": True, "timings_per_token": True, **GREEDY}
    events = sse_events(client.post("/completion", json=body).text)
    partials, final = events[:-1], events[-1]
    assert len(partials) == 6 and all("timings" in e for e in partials)
    assert [e["timings"]["predicted_n"] for e in partials] == [1, 2, 3, 4, 5, 6]
    predicted_ms = [e["timings"]["predicted_ms"] for e in partials]
    assert predicted_ms == sorted(predicted_ms) and predicted_ms[0] == 0.0  # the first token ends the prompt
    prompt_ms = {e["timings"]["prompt_ms"] for e in partials}
    assert len(prompt_ms) == 1 and prompt_ms.pop() == final["timings"]["prompt_ms"] > 0
    assert partials[-1]["timings"] == final["timings"]  # the engine's own timings, not an estimate
    assert final["generation_settings"]["timings_per_token"] is True
    plain = sse_events(client.post("/completion", json={**body, "timings_per_token": False}).text)
    assert all("timings" not in e for e in plain[:-1]) and "timings" in plain[-1]
    chat = sse_events(client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
        "timings_per_token": True, **GREEDY}).text)
    content_chunks = [e for e in chat[:-1] if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert content_chunks and all("timings" in e for e in content_chunks)
    completions = sse_events(client.post("/v1/completions", json={
        "prompt": "hi", "max_tokens": 3, "stream": True, "timings_per_token": True, **GREEDY}).text)
    assert all("timings" in e for e in completions[:-1])
    assert_error(client.post("/completion", json={**body, "timings_per_token": "yes"}), 400,
                 "invalid_request_error", "Field 'timings_per_token'")


def test_return_progress(client):
    prompt = "the sea and the other one " * 6  # several 16-token steps
    body = {"prompt": prompt, "n_predict": 2, "stream": True, "return_progress": True, "timings_per_token": True,
            "cache_prompt": False, **GREEDY}
    events = sse_events(client.post("/completion", json=body).text)
    progress = [e for e in events if "prompt_progress" in e]
    n_prompt = events[-1]["tokens_evaluated"]
    assert len(progress) >= 4
    assert events[:len(progress)] == progress  # all before the first token
    assert progress[0]["prompt_progress"] == {"total": n_prompt, "cache": 0, "processed": 0, "time_ms": 0}
    processed = [p["prompt_progress"]["processed"] for p in progress]
    assert processed == sorted(set(processed)) and processed[-1] == n_prompt
    times = [p["prompt_progress"]["time_ms"] for p in progress]
    assert times == sorted(times)
    assert all(p["prompt_progress"]["total"] == n_prompt and p["content"] == "" and not p["stop"] for p in progress)
    assert all(p["timings"]["prompt_n"] == p["prompt_progress"]["processed"] for p in progress)
    # A cached prompt starts from its cache.
    assert slot_action(client, 1, "erase").status_code == 200
    cached = sse_events(client.post("/completion", json={**body, "cache_prompt": True, "id_slot": 1}).text)
    again = sse_events(client.post("/completion", json={**body, "cache_prompt": True, "id_slot": 1}).text)
    first = [e["prompt_progress"] for e in again if "prompt_progress" in e]
    assert first[0] == {"total": n_prompt, "cache": n_prompt - 1, "processed": n_prompt - 1, "time_ms": 0}
    assert [e["prompt_progress"]["cache"] for e in cached if "prompt_progress" in e][0] == 0
    assert first[-1]["processed"] == n_prompt and len(cached) > len(again)
    # Not streamed: no progress; OpenAI streams carry it too.
    assert "prompt_progress" not in completion(client, **{**body, "stream": False})
    chat = sse_events(client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": prompt}], "max_tokens": 1, "stream": True, "return_progress": True,
        "cache_prompt": False}).text)
    chat_progress = [e for e in chat[:-1] if "prompt_progress" in e]
    assert chat_progress and chat_progress[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chat_progress[-1]["prompt_progress"]["processed"] == chat_progress[-1]["prompt_progress"]["total"]


def test_response_fields(client):
    body = {"prompt": "Hi", "n_predict": 2, **GREEDY,
            "response_fields": ["content", "generation_settings/n_predict", "timings/predicted_n", "no/such", "stop"]}
    selected = completion(client, **body)
    full = completion(client, **{**body, "response_fields": None})
    assert selected == {"content": full["content"], "generation_settings/n_predict": 2,
                        "timings/predicted_n": 2, "stop": True}
    events = sse_events(client.post("/completion", json={**body, "stream": True}).text)
    assert set(events[-1]) == {"content", "generation_settings/n_predict", "timings/predicted_n", "stop"}
    assert all("index" in e for e in events[:-1])  # partial chunks keep their shape
    # Native only: the OpenAI endpoints ignore it.
    openai_body = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2,
                                                       "response_fields": ["content"]}).json()
    assert openai_body["object"] == "text_completion" and "choices" in openai_body
    assert completion(client, prompt="Hi", n_predict=1, response_fields=[]).keys() == full.keys()
    for bad in ("content", [1], {"a": 1}):
        assert_error(client.post("/completion", json={**body, "response_fields": bad}), 400,
                     "invalid_request_error", "Field 'response_fields'")


@pytest.mark.parametrize("path, body", [
    ("/completion", {"prompt": {"prompt_string": "a <__media__>", "multimodal_data": ["aGVsbG8="]}}),
    ("/completion", {"prompt": ["x", {"prompt_string": "<__media__>", "multimodal_data": ["aGVsbG8="]}]}),
    ("/completion", {"prompt": "x", "multimodal_data": ["aGVsbG8="]}),
    ("/v1/completions", {"prompt": {"prompt_string": "<__media__>", "multimodal_data": ["aGVsbG8="]}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "aGVsbG8=", "format": "wav"}}]}]}),
])
def test_multimodal_inputs_need_a_projector(client, path, body):
    assert_error(client.post(path, json=body), 400, "invalid_request_error", "this model has no multimodal projector")


def test_prompt_object_without_media_is_fine(client):
    body = completion(client, prompt={"prompt_string": "The sky"}, n_predict=1)
    assert body["prompt"] == "The sky"


def test_n_indent_and_t_max_predict_ms_validation(client):
    for field, bad in (("n_indent", -1), ("n_indent", "4"), ("t_max_predict_ms", "soon"), ("t_max_predict_ms", -5)):
        assert_error(client.post("/completion", json={"prompt": "x", field: bad}), 400, "invalid_request_error",
                     f"Field '{field}'")
    ok = completion(client, prompt="x", n_predict=3, n_indent=4, t_max_predict_ms=10000, **GREEDY)
    assert ok["stop_type"] in ("limit", "eos")
