"""Request parsing without a server: fields, defaults, validation messages, prompt forms."""

from __future__ import annotations

import math

import pytest
from conftest import load_jsonl
from tiny_gguf import write_tiny_llama

from lamplight.gguf.file import GGUFFile
from lamplight.server.errors import ApiError
from lamplight.server.generation_settings import generation_settings, props_default_params
from lamplight.server.params import Endpoint, default_sampling, parse_generation_params
from lamplight.server.prepare import prepare_request
from lamplight.server.prompts import tokenize_prompts
from lamplight.server.responses_native import select_response_fields
from lamplight.server.settings import ServerSettings
from lamplight.tokenizer import Tokenizer

N_PARALLEL = 4


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    return Tokenizer.from_gguf(GGUFFile(path))


_COMPILERS: dict = {}


def parse(body, tokenizer, endpoint=Endpoint.NATIVE, settings=None):
    """Parsed and prepared (grammar compiled), as completion_flow does."""
    from lamplight.grammar import GrammarCompiler

    compiler = lambda: _COMPILERS.setdefault(id(tokenizer), GrammarCompiler(tokenizer))  # noqa: E731
    params = parse_generation_params(body, endpoint, settings or ServerSettings(), tokenizer, N_PARALLEL)
    return prepare_request(params, tokenizer, compiler)


def rejected(body, tokenizer, endpoint=Endpoint.NATIVE) -> str:
    with pytest.raises(ApiError) as info:
        parse(body, tokenizer, endpoint)
    assert info.value.code == 400 and info.value.type == "invalid_request_error"
    return info.value.message


def test_defaults_come_from_server_settings(tokenizer):
    settings = ServerSettings(sampling_defaults={"temperature": 0.2, "top_k": 7}, n_predict=32)
    params = parse({}, tokenizer, settings=settings)
    assert params.sampling.temperature == 0.2 and params.sampling.top_k == 7
    assert params.sampling.top_p == 0.95 and params.request.n_predict == 32
    assert params.request.stop == [] and params.n_choices == 1 and params.request.cache_prompt is True
    assert parse({"n_predict": -1}, tokenizer, settings=settings).request.n_predict == 32


def test_null_means_default_and_unknown_fields_are_ignored(tokenizer):
    params = parse({"temperature": None, "top_p": None, "stop": None, "whatever": {"x": 1}}, tokenizer)
    assert params.sampling.temperature == 0.8 and params.request.stop == []


def test_token_limit_names(tokenizer):
    assert parse({"max_tokens": 5}, tokenizer).request.n_predict == 5
    assert parse({"max_completion_tokens": 6}, tokenizer).request.n_predict == 6
    assert parse({"max_tokens": 5, "n_predict": 9}, tokenizer).request.n_predict == 9
    assert parse({"n_predict": 4.0}, tokenizer).request.n_predict == 4  # an integral float is an integer


@pytest.mark.parametrize("body, field, expected", [
    ({"top_p": 1.5}, "top_p", "must be a number in [0, 1], got 1.5"),
    ({"top_p": "high"}, "top_p", "must be a number in [0, 1]"),
    ({"temperature": -1}, "temperature", "must be a number >= 0"),
    ({"top_k": 2.5}, "top_k", "must be an integer"),
    ({"n_predict": -2}, "n_predict", "must be an integer in [-1, 2147483647]"),
    ({"max_tokens": "ten"}, "max_tokens", "must be an integer"),
    ({"n": 5}, "n", "must be an integer in [1, 4]"),
    ({"n_cmpl": 0}, "n_cmpl", "must be an integer in [1, 4]"),
    ({"n_keep": -2}, "n_keep", "must be an integer >= -1"),
    ({"seed": -5}, "seed", "must be an integer in [-1, 4294967295]"),
    ({"mirostat": 3}, "mirostat", "must be an integer in [0, 2]"),
    ({"repeat_penalty": 0}, "repeat_penalty", "must be a number > 0"),
    ({"stream": "yes"}, "stream", "must be a boolean"),
    ({"stop": 5}, "stop", "must be a string or an array of strings"),
    ({"dry_sequence_breakers": []}, "dry_sequence_breakers", "must be a non-empty array of strings"),
    ({"samplers": ["top_k", "bogus"]}, "samplers", "unknown sampler 'bogus'"),
    ({"logit_bias": 3}, "logit_bias", "expected an array"),
    ({"logit_bias": [[1, "x"]]}, "logit_bias", "the bias must be a number"),
    ({"n_indent": -1}, "n_indent", "must be an integer >= 0"),
    ({"t_max_predict_ms": -3}, "t_max_predict_ms", "must be a number >= -1"),
    ({"stream_options": [1]}, "stream_options", "must be an object"),
    ({"lora": {"id": 0}}, "lora", "must be an array"),
    ({"lora": [{"id": 0}]}, "lora", "entry 0 must be an object with an integer 'id' and a number 'scale'"),
    ({"lora": [{"id": -1, "scale": 1}]}, "lora", "entry 0: 'id': must be an integer >= 0"),
])
def test_invalid_values_name_the_field(tokenizer, body, field, expected):
    message = rejected(body, tokenizer)
    assert message.startswith(f"Field '{field}': ") and expected in message, message


def test_lora_and_n_keep_reach_the_request(tokenizer):
    request = parse({"lora": [{"id": 0, "scale": 0.5}], "n_keep": -1}, tokenizer).request_for([1, 2])
    assert request.lora == [(0, 0.5)] and request.n_keep == -1
    assert parse({}, tokenizer).request_for([1]).lora is None


def test_stop_and_stream_options(tokenizer):
    assert parse({"stop": "\n"}, tokenizer).request.stop == ["\n"]
    assert parse({"stop": ["a", "b"]}, tokenizer).request.stop == ["a", "b"]
    params = parse({"stream": True, "stream_options": {"include_usage": True}}, tokenizer)
    assert params.stream and params.include_usage
    assert not parse({"stream_options": {"include_usage": True}}, tokenizer).include_usage


def test_chat_logprobs(tokenizer):
    message = rejected({"top_logprobs": 2}, tokenizer, Endpoint.CHAT)
    assert message == "top_logprobs requires logprobs to be set to true"
    assert parse({"logprobs": True}, tokenizer, Endpoint.CHAT).n_probs == 20
    params = parse({"logprobs": True, "top_logprobs": 2}, tokenizer, Endpoint.CHAT)
    assert params.n_probs == 2 and params.logprobs and params.top_logprobs == 2
    params = parse({"logprobs": True, "top_logprobs": 0}, tokenizer, Endpoint.CHAT)
    assert params.n_probs == 1 and params.top_logprobs == 0
    assert parse({"logprobs": False}, tokenizer, Endpoint.CHAT).n_probs == 0


def test_completions_logprobs_is_n_probs(tokenizer):
    assert parse({"logprobs": 3}, tokenizer, Endpoint.COMPLETIONS).n_probs == 3
    assert parse({"logprobs": 3, "n_probs": 5}, tokenizer, Endpoint.COMPLETIONS).n_probs == 5
    assert "Field 'logprobs'" in rejected({"logprobs": True}, tokenizer, Endpoint.COMPLETIONS)


def test_samplers_and_logit_bias(tokenizer):
    assert parse({"samplers": "kt"}, tokenizer).sampling.samplers == ["top_k", "temperature"]
    assert parse({"samplers": ["Top-K", "temp"]}, tokenizer).sampling.samplers == ["top_k", "temperature"]
    the = tokenizer.encode(" the", add_special=False, parse_special=False)
    params = parse({"logit_bias": {"5": 1.5, " the": False}}, tokenizer)
    assert params.sampling.logit_bias == [(5, 1.5)] + [(t, -math.inf) for t in the]
    assert parse({"logit_bias": [[7, -2]]}, tokenizer).sampling.logit_bias == [(7, -2.0)]


TOOLS = [{"type": "function", "function": {"name": "f"}}]


@pytest.mark.parametrize("body, expected", [
    ({"grammar": "root ::= \"a"}, "Field 'grammar'"),
    ({"grammar": "start ::= \"a\""}, "root"),
    ({"json_schema": {"type": "object", "not": {}}}, "not"),
    ({"grammar": "root ::= \"a\"", "json_schema": {}}, "Cannot use both grammar and json_schema"),
    ({"grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}}, "Cannot use both"),
    ({"response_format": {"type": "xml"}}, "response_format type must be one of"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "uniqueItems": True}}}},
     "Field 'response_format'"),
    ({"tools": [{"type": "function"}]}, "Field 'tools'"),
    ({"tool_choice": "sometimes"}, "Invalid tool_choice"),
    ({"tool_choice": "required"}, "needs 'tools'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "g"}}}, "not among the tools"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "Field 'parallel_tool_calls'"),
    ({"tools": TOOLS, "grammar": "root ::= \"a\""}, "Cannot use custom grammar constraints with tools."),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "Cannot use response_format with tools."),
    # A keyword the grammar cannot enforce is ignored in tool schemas (test_server_tools), a broken schema is not.
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "frob"}}}]},
     "Field 'tools'"),
    ({"multimodal_data": ["aGk="]}, "this model has no multimodal projector"),
])
def test_invalid_constraints_are_refused(tokenizer, body, expected):
    assert expected in rejected(body, tokenizer, Endpoint.CHAT)


def test_constraints_compile(tokenizer):
    assert parse({"grammar": 'root ::= "a" [0-9]+'}, tokenizer).request.grammar.kind == "gbnf"
    assert parse({"json_schema": {"type": "object"}}, tokenizer).request.grammar.kind == "json_schema"
    chat = Endpoint.CHAT
    assert parse({"response_format": {"type": "json_object"}}, tokenizer, chat).request.grammar is not None
    spec = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}, "strict": True}}
    assert parse({"response_format": spec}, tokenizer, chat).request.grammar is not None
    assert parse({"response_format": {"type": "text"}}, tokenizer, chat).request.grammar is None


def test_tools_compile_a_grammar(tokenizer):
    params = parse({"tools": TOOLS}, tokenizer, Endpoint.CHAT)
    assert params.request.grammar is not None and params.tool_plan.format.name == "generic"
    assert params.tool_plan.parallel is True and params.tool_plan.choice == "auto"
    none = parse({"tools": TOOLS, "tool_choice": "none"}, tokenizer, Endpoint.CHAT)
    assert none.request.grammar is None and not none.tool_plan.active


def test_constraints_that_can_proceed(tokenizer):
    parse({"response_format": {"type": "text"}}, tokenizer, Endpoint.CHAT)
    parse({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"},
          tokenizer, Endpoint.CHAT)
    parse({"grammar": ""}, tokenizer)


def test_parsing_compiles_nothing_and_preparing_does(tokenizer):
    from lamplight.grammar import GrammarCompiler
    from lamplight.sampling.dry import BreakerTable

    def parse_only(body):
        return parse_generation_params(body, Endpoint.NATIVE, ServerSettings(), tokenizer, N_PARALLEL)

    params = parse_only({"grammar": 'root ::= "a', "dry_multiplier": 0.8})  # a 400 only once compiled
    assert params.constraint.source == 'root ::= "a' and params.request.grammar is None
    assert params.request.dry_breakers is None
    with pytest.raises(ApiError, match="Field 'grammar'"):
        prepare_request(params, tokenizer, lambda: GrammarCompiler(tokenizer))
    with pytest.raises(ApiError, match="constrained decoding is not available on this server"):
        prepare_request(params, tokenizer)
    dry = prepare_request(parse_only({"dry_multiplier": 0.8}), tokenizer)
    assert isinstance(dry.request.dry_breakers, BreakerTable) and dry.request.grammar is None
    assert prepare_request(parse_only({}), tokenizer).request.dry_breakers is None


def test_the_request_record_is_built_once(tokenizer):
    import dataclasses

    params = parse({"n_predict": 7, "stop": ["x"], "seed": 5, "stream": True, "return_progress": True}, tokenizer)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.stream = False
    request = params.request_for([1, 2])
    assert request == dataclasses.replace(params.request, prompt_tokens=[1, 2])
    assert (request.n_predict, request.stop, request.sampling.seed, request.return_progress) == (7, ["x"], 5, True)
    assert not parse({"return_progress": True}, tokenizer).request.return_progress  # progress is streamed only
    drawn = parse({}, tokenizer)
    assert drawn.sampling.seed == -1 and 0 <= drawn.request.sampling.seed < 2**32  # echoed as asked, run as drawn
    chat = parse({"logprobs": True, "top_logprobs": 0}, tokenizer, Endpoint.CHAT)
    assert chat.request.sampling.n_probs == chat.sampling.n_probs == 1


def test_prompt_forms(tokenizer):
    hello = tokenizer.encode("Hello", add_special=True, parse_special=True)
    assert tokenize_prompts("Hello", tokenizer) == [hello]
    assert tokenize_prompts([12, 34], tokenizer) == [[12, 34]]
    assert tokenize_prompts([12, "Hello", 34], tokenizer) == [[12] + tokenizer.encode("Hello", False, True) + [34]]
    assert tokenize_prompts(["Hello", [1, 2]], tokenizer) == [hello, [1, 2]]
    assert tokenize_prompts([[1, 2], [3]], tokenizer) == [[1, 2], [3]]
    assert tokenize_prompts("<|im_start|>", tokenizer) == [[1]]  # special tokens are parsed
    assert tokenize_prompts({"prompt_string": "Hello"}, tokenizer) == [hello]


@pytest.mark.parametrize("prompt, expected", [
    (None, '"prompt" is required'),
    ([], '"prompt" must not be empty'),
    ([1, 99999], "token id 99999 is out of range"),
    ([1, [2]], "neither a token id nor a string"),
    (3.5, '"prompt" must be a string'),
    ({"prompt_string": "x", "multimodal_data": ["aGk="]}, "no multimodal projector"),
])
def test_bad_prompts(tokenizer, prompt, expected):
    with pytest.raises(ApiError) as info:
        tokenize_prompts(prompt, tokenizer)
    assert info.value.code == 400 and expected in info.value.message


def test_response_fields_selection():
    body = {"content": "x", "generation_settings": {"n_predict": 2}, "stop": True}
    assert select_response_fields(body, ["content", "generation_settings/n_predict", "missing/x"]) == {
        "content": "x", "generation_settings/n_predict": 2}
    assert select_response_fields(body, []) is body


def test_generation_settings_match_llama_server_keys_and_floats(tokenizer):
    examples = {e["name"]: e for e in load_jsonl("llama-server-examples.jsonl")}
    expected = examples["completion_native"]["response"]["generation_settings"]
    params = parse({"n_predict": 4, "temperature": 0}, tokenizer)
    echo = generation_settings(params.sampling, n_predict=4, stop=[], n_keep=0, n_discard=0,
                               stream=False, timings_per_token=False)
    assert list(echo) == list(expected)
    assert echo == expected  # same defaults, same float32 rounding
    props = examples["props"]["response"]["default_generation_settings"]["params"]
    assert list(props_default_params(default_sampling(ServerSettings()), -1, 0)) == list(props)


def test_ignore_eos_and_bans_echo_as_null_bias(tokenizer):
    params = parse({"ignore_eos": True, "logit_bias": [[5, False]]}, tokenizer)
    echo = generation_settings(params.sampling, n_predict=-1, stop=[], n_keep=0, n_discard=0, stream=False,
                               timings_per_token=False, eog_ids=tokenizer.eog_ids)
    assert echo["logit_bias"][0] == {"bias": None, "token": 5}
    assert {e["token"] for e in echo["logit_bias"][1:]} == set(tokenizer.eog_ids)


def test_probability_entries(tokenizer):
    from lamplight.sampling import TokenProb, TokenProbs
    from lamplight.server.probs import FLOAT32_LOWEST, token_probs_json, utf8_text

    space_the = tokenizer.encode(" the", add_special=False, parse_special=False)[0]
    probs = TokenProbs(TokenProb(space_the, 0.5, math.log(0.5)), [TokenProb(space_the, 0.5, math.log(0.5)),
                                                                TokenProb(7, 0.0, -math.inf)], post_sampling=False)
    entry = token_probs_json(probs, tokenizer)
    assert entry["token"] == " the" and entry["bytes"] == list(b" the") and entry["logprob"] == math.log(0.5)
    assert entry["top_logprobs"][1]["logprob"] == FLOAT32_LOWEST
    assert [e["id"] for e in token_probs_json(probs, tokenizer, top_limit=1)["top_logprobs"]] == [space_the]
    post = token_probs_json(TokenProbs(probs.chosen, probs.top[:1], post_sampling=True), tokenizer)
    assert set(post) == {"id", "token", "bytes", "prob", "top_probs"} and post["prob"] == 0.5
    assert utf8_text("aé".encode()[:-1]) == "a"  # an incomplete character at the end is cut
