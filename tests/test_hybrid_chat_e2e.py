"""The hybrid families' chat formats end to end through the API: Qwen 3.5, LFM2 and Granite 4.0-H.

Each family's tiny random-weight model (shared/reference/archs2: qwen35, lfm2, granitehybrid) is
served by the real app with its family's real chat template (shared/reference/templates) and
called through the official openai client: the thinking split out as `reasoning_content`, the
call parsed with JSON arguments that follow the tool's schema, finish_reason "tool_calls", the
stream reassembling to the same reply; then the follow-up turn with the tool result, rendered by
the template, resumed from a recurrent-state checkpoint inside the previous turn
(lamplight.engine.checkpoints) and answered as it is without the cache.

Vocabularies. The archs2 files have 256 byte tokens, 13 merges and the ChatML specials only. Qwen
3.5's and LFM2's role markers are ChatML, but Granite's (`<|start_of_role|>`, `<|end_of_text|>`)
would be plain bytes there, and its replies would end on `<|im_end|>`, a token its template never
writes; the thinking markers would be bytes too, and the reasoning budget, which recognises the
opening marker as tokens (as llama.cpp's), would never see a thinking block the model opens in
bytes. So `_family_file` appends the markers the real vocabularies have as tokens (control tokens
for the role and call markers, user-defined ones for Qwen's `<think>` and `<tool_call>`, as the
real GGUFs type them), with random embedding and output rows, and makes the template's end of
turn the EOS. Markers that stay text (Qwen's `<function=`, Granite's `<tool_call>`) are matched by
the grammars as text, which the model may spell in bytes or with a merged token.

Random weights emit noise, so the requests constrain the reply: tool_choice "required" (the
family's call grammar holds the answer from its first token), `reasoning_budget_tokens` (the
thinking is closed after a few tokens) and `logit_bias` (whitespace banned, so JSON comes compact
and the calls short; for LFM2, whose prompt does not open the thinking, every other way to start
the reply is banned too, so the model opens `<think>` itself). LFM2's template has llama.cpp's
LFM2 tool markers, but lamplight gives it the generic JSON protocol (lamplight.chat.families), so
its calls are `{"tool_calls": [...]}` after the thinking.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import jsonschema
import numpy as np
import openai
import pytest
from conftest import reference_path, reference_text
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from test_server_support import ServerThread

import lamplight
from lamplight.engine.checkpoints import PROMPT_END_OFFSET, REPLY_INTERVAL
from lamplight.server import ServerSettings, ServerState
from lamplight.server.launcher import EngineOptions, build_engine

CONTROL, USER_DEFINED = 3, 4  # GGUF token types
INTERVAL = 64  # tokens between two recurrent-state checkpoints
PICK = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                                         "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["unit", "n"]}
TOOLS = [{"type": "function", "function": {"name": "pick", "description": "Pick a digit", "parameters": PICK}}]
USER = [{"role": "user", "content": "Pick a digit."}]
RESULT = '{"digit": 7}'
WHITESPACE = (" ", "\n", "\t", "\r")


@dataclass(frozen=True)
class Family:
    arch: str
    template: str
    tokens: dict[str, int]  # appended to the vocabulary: text -> GGUF token type
    special: dict[str, str]  # tokenizer.ggml.<name>_token_id -> that token's text
    add_bos: bool
    name: str  # the family lamplight.chat.families recognises
    tool_format: str
    thinks: bool
    template_file: bool = False  # --chat-template-file, else the GGUF's tokenizer.chat_template
    banned: tuple[str, ...] = WHITESPACE  # logit_bias -100
    # What the follow-up prompt holds for the call and the tool result, from (arguments, reasoning);
    # the templates write the arguments object with tojson (`{"unit": "c", "n": 3}`).
    turns: Callable[[dict, str], list[str]] | None = field(default=None, compare=False)


def _qwen_turns(args: dict, reasoning: str) -> list[str]:
    call = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in args.items())
    return [f"<|im_start|>assistant\n<think>\n{reasoning.strip()}\n</think>\n\n"
            f"<tool_call>\n<function=pick>\n{call}</function>\n</tool_call><|im_end|>\n",
            f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n"]


def _generic_turns(args: dict, reasoning: str) -> list[str]:
    # LFM2.5's template shows an assistant turn's content only: the call is the generic protocol's
    # JSON (lamplight.tools.generic), the tool result a user turn.
    return ['<|im_start|>assistant\n{"tool_calls": [{"name": "pick", "arguments": ' + json.dumps(args)
            + "}]}<|im_end|>\n",
            '<|im_start|>user\n{"tool_response": {"name": "pick", "tool_call_id": ',
            '"content": ' + RESULT + "}}<|im_end|>\n<|im_start|>assistant\n"]


def _granite_turns(args: dict, reasoning: str) -> list[str]:
    return ['<|start_of_role|>assistant<|end_of_role|><tool_call>\n{"name": "pick", "arguments": ' + json.dumps(args)
            + "}\n</tool_call><|end_of_text|>\n",
            f"<|start_of_role|>user<|end_of_role|>\n<tool_response>\n{RESULT}\n</tool_response><|end_of_text|>\n"
            "<|start_of_role|>assistant<|end_of_role|>"]


FAMILIES = {
    "qwen35": Family("qwen35", "Qwen3.5-4B.jinja",
                     dict.fromkeys(["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                                    "</tool_response>"], USER_DEFINED),
                     {"eos": "<|im_end|>"}, add_bos=False, name="Qwen3.5 / Nemotron 3 Nano",
                     tool_format="qwen3-coder", thinks=True, turns=_qwen_turns),
    "lfm2": Family("lfm2", "LFM2.5-Instruct.jinja",
                   {**dict.fromkeys(["<|startoftext|>", "<|tool_list_start|>", "<|tool_list_end|>",
                                     "<|tool_call_start|>", "<|tool_call_end|>", "<|tool_response_start|>",
                                     "<|tool_response_end|>"], CONTROL),
                    "<think>": USER_DEFINED, "</think>": USER_DEFINED},
                   {"bos": "<|startoftext|>", "eos": "<|im_end|>"}, add_bos=True, name="LFM2.5",
                   tool_format="generic", thinks=True, banned=WHITESPACE + ("{", "<"), turns=_generic_turns),
    "granitehybrid": Family("granitehybrid", "ibm-granite-granite-4.0.jinja",
                            dict.fromkeys(["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>"],
                                          CONTROL),
                            {"bos": "<|end_of_text|>", "eos": "<|end_of_text|>", "padding": "<|end_of_text|>"},
                            add_bos=False, name="Hermes 2 Pro", tool_format="hermes", thinks=False,
                            template_file=True, turns=_granite_turns),
}


def _family_file(family: Family, folder: Path) -> Path:
    """archs2/<arch>.gguf with the family's tokens appended (random rows of the F32 embedding and
    output matrices, every other tensor copied as stored), its special ids and BOS rule, and, unless
    the family's test passes it as a file, its chat template."""
    reader = GGUFReader(reference_path(f"archs2/{family.arch}.gguf"))
    tokens = [*reader.fields["tokenizer.ggml.tokens"].contents(), *family.tokens]
    types = [*reader.fields["tokenizer.ggml.token_type"].contents(), *family.tokens.values()]
    replaced = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                f"{family.arch}.vocab_size": len(tokens), "tokenizer.ggml.add_bos_token": family.add_bos,
                **{f"tokenizer.ggml.{name}_token_id": tokens.index(text) for name, text in family.special.items()}}
    if not family.template_file:
        replaced["tokenizer.chat_template"] = reference_text(f"templates/{family.template}")
    path = folder / f"{family.arch}.gguf"
    writer = GGUFWriter(str(path), family.arch)
    for key, value in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            sub_type = value.types[-1] if len(value.types) > 1 else None
            writer.add_key_value(key, replaced.get(key, value.contents()), value.types[0], sub_type)
    rng = np.random.default_rng(0)
    for tensor in reader.tensors:
        data = np.asarray(tensor.data)
        if tensor.name in ("token_embd.weight", "output.weight"):
            assert tensor.tensor_type == GGMLQuantizationType.F32
            rows = rng.standard_normal((len(family.tokens), data.shape[1])) * data.std()
            writer.add_tensor(tensor.name, np.concatenate([data, rows.astype(np.float32)]))
        else:
            writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@dataclass
class Served:
    family: Family
    url: str
    client: openai.OpenAI
    loaded: object

    def post(self, route: str, body: dict) -> dict:
        response = httpx.post(self.url + route, json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()

    def token_ids(self, text: str) -> list[int]:
        return self.post("/tokenize", {"content": text, "parse_special": True})["tokens"]

    def request(self, messages: list[dict]) -> dict:
        """The chat request of these tests: the call required, a few tokens of thinking, the
        family's banned tokens, token ids in the logprobs."""
        bias = {str(self.token_ids(text)[0]): -100 for text in self.family.banned}
        return {"model": "tiny", "messages": messages, "tools": TOOLS, "tool_choice": "required", "max_tokens": 160,
                "seed": 5, "logit_bias": bias, "logprobs": True, "extra_body": {"reasoning_budget_tokens": 4}}


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, tmp_path_factory):
    family = FAMILIES[request.param]
    path = _family_file(family, tmp_path_factory.mktemp(family.arch))
    template_file = str(reference_path(f"templates/{family.template}")) if family.template_file else None
    loaded = lamplight.load(str(path), backend="fast", chat_template_file=template_file)
    engine = build_engine(loaded, EngineOptions(n_ctx=2048, n_parallel=1, checkpoint_interval=INTERVAL))
    state = ServerState(ServerSettings())
    state.attach(loaded, engine)
    server = ServerThread(state).start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    yield Served(family, server.url, client, loaded)
    server.stop()
    engine.stop()


@pytest.fixture(scope="module")
def first_turn(served):
    """The first reply (not streamed), with the request that asked for it."""
    body = served.request(USER)
    return body, served.client.chat.completions.create(**body)


def _prompt_ids(served, response) -> list[int]:
    """The ids of the prompt a reply answered: its `prompt` field (llama-server's /completion's,
    the prompt's tokens as text, BOS included)."""
    ids = served.token_ids(response.model_extra["prompt"])
    assert len(ids) == response.usage.prompt_tokens
    return ids


def _reply(response) -> tuple[str | None, str | None, list[tuple[str, str]], str]:
    choice = response.choices[0]
    calls = [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or ()]
    return choice.message.content, getattr(choice.message, "reasoning_content", None), calls, choice.finish_reason


def test_the_template_is_the_familys_with_its_markers_as_tokens(served, first_turn):
    template = served.loaded.chat_template
    assert (template.family.name, template.family.tool_format) == (served.family.name, served.family.tool_format)
    _, response = first_turn
    prompt, ids = response.model_extra["prompt"], _prompt_ids(served, response)
    for marker in served.family.tokens:
        if marker in prompt:
            assert served.token_ids(marker)[0] in ids, marker


def test_reply_splits_the_thinking_from_a_parsed_call(first_turn, served):
    _, response = first_turn
    content, reasoning, calls, finish = _reply(response)
    assert finish == "tool_calls"
    assert not content
    ((name, arguments),) = calls
    assert name == "pick"
    jsonschema.validate(json.loads(arguments), PICK)  # `unit` is c or f, never "\"c\""
    if served.family.thinks:
        assert reasoning and "<think>" not in reasoning and "</think>" not in reasoning
    else:
        assert reasoning is None


def test_stream_reassembles_to_the_same_reply(first_turn, served):
    body, response = first_turn
    reasoning, calls, finish, ids = "", {}, None, set()
    for chunk in served.client.chat.completions.create(**body, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        reasoning += getattr(choice.delta, "reasoning_content", None) or ""
        assert not choice.delta.content
        for part in choice.delta.tool_calls or ():
            call = calls.setdefault(part.index, ["", ""])
            call[0] += part.function.name or ""
            call[1] += part.function.arguments or ""
            if part.id:
                ids.add(part.id)
    _, want_reasoning, want_calls, want_finish = _reply(response)
    streamed = (reasoning or None, [tuple(calls[i]) for i in sorted(calls)], finish)
    assert streamed == (want_reasoning, want_calls, want_finish)
    assert len(ids) == 1


def test_follow_up_renders_the_result_and_resumes_from_a_checkpoint(first_turn, served):
    body, response = first_turn
    message = response.choices[0].message
    call = message.tool_calls[0]
    assistant = {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}
    reasoning = getattr(message, "reasoning_content", None)
    if reasoning:
        assistant["reasoning_content"] = reasoning
    messages = [*USER, assistant, {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    follow_up = served.client.chat.completions.create(**{**body, "messages": messages, "max_tokens": 4})

    prompt = follow_up.model_extra["prompt"]
    assert prompt.startswith(response.model_extra["prompt"])
    for turn in served.family.turns(json.loads(call.function.arguments), reasoning or ""):
        assert turn in prompt
    # The slot held the first prompt and the reply but its last token; the template re-renders
    # the reply, so the two part inside it: the turn resumes from the last checkpoint before
    # (lamplight.engine.checkpoints: multiples of INTERVAL, 4 tokens before the first prompt's
    # end, multiples of the reply interval inside the reply).
    first_prompt = _prompt_ids(served, response)
    held = first_prompt + [token.id for token in response.choices[0].logprobs.content][:-1]
    ids = _prompt_ids(served, follow_up)
    common = next((i for i, (a, b) in enumerate(zip(held, ids)) if a != b), min(len(held), len(ids)))
    assert common < len(held)
    reply_interval = min(INTERVAL, REPLY_INTERVAL)
    checkpoints = {n for n in range(1, len(held) + 1) if n % INTERVAL == 0 or n == len(first_prompt) - PROMPT_END_OFFSET
                   or (n > len(first_prompt) and n % reply_interval == 0)}
    cached = follow_up.usage.prompt_tokens_details.cached_tokens
    assert cached == follow_up.model_extra["timings"]["cache_n"] == max(n for n in checkpoints if n <= common) > 0

    fresh = served.client.chat.completions.create(**{**body, "messages": messages, "max_tokens": 4,
                                                     "extra_body": {**body["extra_body"], "cache_prompt": False}})
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert [t.id for t in fresh.choices[0].logprobs.content] == [t.id for t in follow_up.choices[0].logprobs.content]
