"""Serving generation requests on the native backend imports no torch: in a fresh interpreter
whose imports of torch raise, engines on a tiny llama and on a hybrid (lfm2, recurrent layers)
run greedy and seeded requests, n = 2 choices, a JSON schema, n-gram speculation, a prompt
sharing a cached prefix, the RAM prompt cache (--cache-ram), a unified quantized KV cache (q8_0),
a context shift, and a hybrid's recurrent checkpoints, and every reply is what the same
requests get in a process where torch is loaded."""

from __future__ import annotations

import json

import pytest
from conftest import reference_dir
from no_torch import printed, run_script
from tiny_gguf import write_tiny_llama

from lamplight.native import runtime

SCRIPT = """
import json

import lamplight
from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.types import FinalEvent, GenerationRequest
from lamplight.grammar import GrammarCompiler
from lamplight.sampling import SamplingParams
from lamplight.speculative import SpecConfig, SpecRequest
from lamplight.speculative.config import NgramMapSizes

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5, ignore_eos=True)
# Drafts after any token seen before (this model's greedy text repeats no longer n-gram), every step.
NGRAM = SpecConfig(kinds=("ngram-simple",), ngram_simple=NgramMapSizes(size_n=1, size_m=8, min_hits=1), adaptive=False)
NO_DRAFTS = SpecRequest(kinds=())
PROMPT = [3 + (i * 17) % 23 for i in range(40)]  # repeats every 23 tokens: n-grams to draft from
SCHEMA = {{"type": "object", "properties": {{"a": {{"type": "integer"}}}}, "required": ["a"]}}


def tokens(n, seed):
    return [3 + (seed * 31 + i * 17) % 240 for i in range(n)]


def finals(engine, request):
    events = list(engine.submit(request).iter_events(timeout=120))
    done = sorted((e for e in events if isinstance(e, FinalEvent)), key=lambda e: e.choice)
    assert len(done) == request.n_choices, events
    return [dict(tokens=list(e.token_ids), text=e.content, stop=e.stop_type, cached=e.n_cached,
                 drafted=e.timings.draft_n, truncated=e.truncated) for e in done]


def serve(model, config, requests):
    engine = Engine(model.runner, model.tokenizer, config)
    engine.start()
    try:
        replies = []
        for request in requests:  # each a function of the replies so far
            replies.append(finals(engine, request(replies)))
        hits = engine.prompt_cache.hits if engine.prompt_cache is not None else 0
        return {{"replies": replies, "ram_hits": hits}}
    finally:
        engine.stop()


results = {{}}
llama = lamplight.load({llama!r}, backend="native")
schema = GrammarCompiler(llama.tokenizer).compile_json_schema(SCHEMA)
results["llama"] = serve(llama, EngineConfig(n_ctx=1024, n_parallel=2, cache_type_k="f16", cache_type_v="f16",
                                             speculative=NGRAM), [
    lambda r: GenerationRequest(PROMPT, GREEDY, n_predict=48, speculative=NO_DRAFTS),
    lambda r: GenerationRequest(PROMPT, SEEDED, n_predict=16, speculative=NO_DRAFTS),
    lambda r: GenerationRequest(PROMPT[:30], SEEDED, n_predict=12, n_choices=2, speculative=NO_DRAFTS),
    lambda r: GenerationRequest(PROMPT[:20], SamplingParams(temperature=0.0), n_predict=64, grammar=schema,
                                speculative=NO_DRAFTS),
    lambda r: GenerationRequest(PROMPT, GREEDY, n_predict=48),  # drafts from the n-grams so far
    lambda r: GenerationRequest(PROMPT + r[0][0]["tokens"] + [5, 6, 7], GREEDY, n_predict=8, speculative=NO_DRAFTS),
])
a, b = tokens(120, 1), tokens(90, 2)
results["llama_q8_0_ram"] = serve(llama, EngineConfig(n_ctx=512, n_parallel=1, kv_unified=True, cache_ram_mib=64,
                                                      cache_type_k="q8_0", cache_type_v="q8_0"), [
    lambda r: GenerationRequest(a, GREEDY, n_predict=6),
    lambda r: GenerationRequest(b, SEEDED, n_predict=6),  # takes the slot: a's tokens go to RAM
    lambda r: GenerationRequest(a + r[0][0]["tokens"][:-1] + tokens(9, 3), GREEDY, n_predict=6),
])
results["llama_shift"] = serve(llama, EngineConfig(n_ctx=128, n_parallel=2, context_shift=True), [
    lambda r: GenerationRequest(PROMPT[:10], GREEDY, n_predict=150, n_keep=-1),
])
hybrid = lamplight.load({hybrid!r}, backend="native")
A = tokens(40, 4)
results["lfm2"] = serve(hybrid, EngineConfig(n_ctx=512, n_parallel=2, checkpoint_interval=16), [
    lambda r: GenerationRequest(A, GREEDY, n_predict=8),
    lambda r: GenerationRequest(A + r[0][0]["tokens"][:-1] + [7, 8], SEEDED, n_predict=8),  # the live state
    lambda r: GenerationRequest(A[:35] + tokens(6, 5), GREEDY, n_predict=8),  # from the checkpoint at 32
    lambda r: GenerationRequest(tokens(30, 6), SEEDED, n_predict=8, n_choices=2),  # the state copied
])
results["lfm2_ram"] = serve(hybrid, EngineConfig(n_ctx=512, n_parallel=1, cache_ram_mib=64), [
    lambda r: GenerationRequest(a[:50], GREEDY, n_predict=6),
    lambda r: GenerationRequest(b, GREEDY, n_predict=6),  # takes the slot: a's tokens and state go to RAM
    lambda r: GenerationRequest(a[:50] + r[0][0]["tokens"][:-1] + [9], GREEDY, n_predict=6),
])
print("RESULTS", json.dumps(results))
print("TORCH_LOADED", "torch" in sys.modules)
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    if runtime.library() is None:
        pytest.skip(f"no native library here: {runtime.unavailable_reason()}")
    hybrid = reference_dir() / "archs2" / "lfm2.gguf"
    if not hybrid.is_file():
        pytest.skip(f"no hybrid reference model at {hybrid}")
    return write_tiny_llama(tmp_path_factory.mktemp("torch_free") / "tiny.gguf", n_ctx=512, n_embd=128), hybrid


def served(models, guarded: bool) -> tuple[dict, bool]:
    """The script's replies, and whether torch was loaded at its end."""
    llama, hybrid = models
    script = SCRIPT.format(llama=str(llama), hybrid=str(hybrid))
    if not guarded:
        script = "import torch  # a process with torch loaded, as a PyTorch backend would have it\n" + script
    out = run_script(script, guarded=guarded, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = printed(out)
    return json.loads(lines["RESULTS"]), lines["TORCH_LOADED"] == "True"


def test_serving_on_the_native_backend_imports_no_torch(models):
    results, torch_loaded = served(models, guarded=True)
    assert not torch_loaded
    expected, torch_loaded = served(models, guarded=False)
    assert torch_loaded
    assert results == expected
    greedy, seeded, choices, schema, speculated, extended = results["llama"]["replies"]
    assert len(choices) == 2 and greedy != seeded
    assert schema[0]["stop"] == "eos" and isinstance(json.loads(schema[0]["text"])["a"], int)
    assert speculated[0]["drafted"] > 0 and speculated[0]["tokens"] == greedy[0]["tokens"]  # drafts change no token
    assert extended[0]["cached"] == len(greedy[0]["tokens"]) + 40 - 1  # the slot's prefix reused
    ram = results["llama_q8_0_ram"]
    assert ram["ram_hits"] == 1 and ram["replies"][2][0]["cached"] == 120 + 5
    (shifted,) = results["llama_shift"]["replies"]
    assert len(shifted[0]["tokens"]) == 150 and shifted[0]["truncated"]  # generated past a full slot
    first, live, checkpointed, pair = results["lfm2"]["replies"]
    assert live[0]["cached"] == 40 + 7 and checkpointed[0]["cached"] == 32  # not read again from 0
    assert len(pair) == 2 and pair[0]["tokens"] != pair[1]["tokens"]
    hybrid_ram = results["lfm2_ram"]
    assert hybrid_ram["ram_hits"] == 1 and hybrid_ram["replies"][2][0]["cached"] == 50 + 5
