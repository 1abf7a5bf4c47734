"""Ollama's request bodies -> the bodies lamplight's own pipelines take (no second generation path).

/api/chat, and /api/generate with the chat template, become a /v1/chat/completions body (the chat
pipeline: template, tools in the family's format, reasoning, grammars, the sampler chain);
/api/generate with `raw` becomes a /completion body, with `suffix` an /infill body. Only the shape
is checked here (a 400 naming the field); the values are checked by the pipeline they go to.

Decisions where Ollama's API and lamplight differ:
- `options`: llama.cpp's samplers under their own names (Ollama uses llama.cpp's names), plus
  `num_predict` and `num_keep`; `num_ctx` must fit a slot (it cannot grow one); the load-time
  options (`num_gpu`, `num_thread`, ...) are fixed by the serve flags and unknown ones (`tfs_z`,
  `penalize_newline`, gone from llama.cpp) are accepted and logged, as Ollama does.
- `think`: true / "low" / "medium" / "high" turn thinking on (a 400 for a template that cannot
  think, as Ollama answers), with THINK_BUDGETS; false turns it off (a budget of 0).
- `keep_alive` is checked (seconds, or a Go duration such as "5m"), nothing is stored: the one
  model stays loaded.
- `context` (the old token context) is prepended to a raw prompt; with the chat template it is a
  400 (the conversation goes to /api/chat as messages), and only raw replies return it.
"""

from __future__ import annotations

import base64
import logging
import re
from dataclasses import dataclass
from typing import Any

from lamplight.sampling.params import SamplingParams
from lamplight.sampling.spec import sampling_fields

from .errors import field_error, invalid_request
from .fields import INT32_MAX, Fields, is_number

log = logging.getLogger("lamplight.server")

# Reasoning budget (tokens; -1 unlimited) of each `think` level. gpt-oss's template also reads
# the level as `reasoning_effort`.
THINK_BUDGETS = {"low": 1024, "medium": 4096, "high": -1}

# Sampling fields that only shape llama-server's answers (probabilities), not the sampling.
_ANSWER_FIELDS = {"n_probs", "post_sampling_probs"}
SAMPLING_OPTIONS = frozenset(name for name, _ in sampling_fields(SamplingParams) if name not in _ANSWER_FIELDS)
RENAMED_OPTIONS = {"num_predict": "n_predict", "num_keep": "n_keep"}
# Fixed when the model was loaded (the serve flags); Ollama reloads the model for them.
LOAD_OPTIONS = frozenset({"numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
                          "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread"})

# Go's time.ParseDuration, which Ollama reads `keep_alive` strings with ("5m", "1h30m", "-1s").
_GO_DURATION = re.compile(r"[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)")
_IMAGE_TYPES = {b"\x89PNG": "image/png", b"\xff\xd8\xff": "image/jpeg", b"GIF8": "image/gif", b"RIFF": "image/webp"}


@dataclass(frozen=True)
class ModelFacts:
    """What a conversion needs to know about the served model."""

    name: str
    can_think: bool
    n_ctx_slot: int


# -- fields every generating request has --------------------------------------------------------

def check_common(body: dict) -> None:
    """`model` (any name: the one served model answers), `keep_alive`, the logprobs switches."""
    fields = Fields(body)
    fields.string("model", "")
    check_keep_alive(body.get("keep_alive"))
    if fields.boolean("logprobs", False) or fields.integer("top_logprobs", 0, minimum=0):
        raise invalid_request("logprobs are not served on Ollama's API yet: use /v1/chat/completions")


def check_keep_alive(value: Any) -> None:
    """Seconds (negative: forever) or a Go duration string; stored nowhere (one model, always loaded)."""
    if value is None or (is_number(value) and abs(value) != float("inf")):
        return
    if isinstance(value, str) and _GO_DURATION.fullmatch(value):
        return
    raise field_error("keep_alive", f'must be a number of seconds or a duration such as "5m" or "1h30m", got {value!r}')


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def keep_alive_seconds(value: Any) -> float | None:
    """A checked `keep_alive` in seconds (negative: keep the model loaded for ever), None when
    the request gives none."""
    check_keep_alive(value)
    if value is None:
        return None
    if is_number(value):
        return float(value)
    sign = -1.0 if value.startswith("-") else 1.0
    return sign * sum(float(n) * _GO_UNITS[unit] for n, unit in _GO_PART.findall(value))


def sampling_fields_of(body: dict, model: ModelFacts) -> dict:
    """`options` and `format` as pipeline fields."""
    return {**option_fields(body.get("options"), model.n_ctx_slot), **format_fields(body.get("format"))}


def option_fields(options: Any, n_ctx_slot: int) -> dict:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise field_error("options", f"must be an object, got {options!r}")
    fields, read, ignored = Fields(options), {}, []
    for name, value in options.items():
        if value is None:
            continue
        if name in SAMPLING_OPTIONS or name == "stop":
            read[name] = value  # checked by the pipeline, under the same name
        elif name == "num_predict":
            # Ollama's -2 ("fill the context") and -1 ("no limit") both run to the context's end here.
            read["n_predict"] = max(fields.integer(name, -1, minimum=-2, maximum=INT32_MAX), -1)
        elif name == "num_keep":
            read["n_keep"] = fields.integer(name, 0, minimum=-1, maximum=INT32_MAX)
        elif name == "num_ctx":
            _check_num_ctx(fields.integer(name, 0, minimum=1, maximum=INT32_MAX), n_ctx_slot)
        else:
            ignored.append(name)
    _log_ignored(ignored)
    return read


def _check_num_ctx(num_ctx: int, n_ctx_slot: int) -> None:
    if num_ctx > n_ctx_slot:
        raise field_error("num_ctx", f"{num_ctx} is larger than a slot's context of {n_ctx_slot} tokens "
                                     "(set by the serve flags -c and -np)")


def _log_ignored(names: list[str]) -> None:
    load_time = [name for name in names if name in LOAD_OPTIONS]
    unknown = [name for name in names if name not in LOAD_OPTIONS]
    if load_time:
        log.info("ollama options ignored, fixed by the serve flags: %s", ", ".join(load_time))
    if unknown:
        log.warning("ollama options ignored, unknown to lamplight: %s", ", ".join(unknown))


def format_fields(value: Any) -> dict:
    """`format`: "json" (any object) or a JSON schema -> the pipeline's response_format grammar."""
    if value is None or value == "":
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(value, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": value}}}
    raise field_error("format", f'must be "json" or a JSON schema object, got {value!r}')


def thinking_fields(think: Any, model: ModelFacts) -> dict:
    """`think` -> enable_thinking and the reasoning budget; nothing when it is not given (the
    template's default, as /v1/chat/completions does)."""
    if think is None:
        return {}
    if think is False:
        return {"reasoning_budget_tokens": 0, "chat_template_kwargs": {"enable_thinking": False}}
    if think is not True and think not in THINK_BUDGETS:
        raise field_error("think", f'must be true, false, "low", "medium" or "high", got {think!r}')
    if not model.can_think:
        raise invalid_request(f'"{model.name}" does not support thinking')
    kwargs: dict = {"enable_thinking": True}
    if think is not True:
        kwargs["reasoning_effort"] = think
    return {"reasoning_budget_tokens": THINK_BUDGETS.get(think, -1), "chat_template_kwargs": kwargs}


# -- /api/chat ----------------------------------------------------------------------------------

def chat_body(body: dict, model: ModelFacts) -> dict:
    """An /api/chat body as a /v1/chat/completions body ("messages" [] is Ollama's load call)."""
    check_common(body)
    chat = {"messages": chat_messages(body.get("messages")), **sampling_fields_of(body, model),
            **thinking_fields(body.get("think"), model)}
    tools = Fields(body).array("tools")
    if tools:
        if "response_format" in chat:
            raise invalid_request("'format' cannot be combined with 'tools'")
        chat["tools"] = tools  # OpenAI's shape already
    return chat


def chat_messages(messages: Any) -> list[dict]:
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise field_error("messages", f"must be an array of message objects, got {messages!r}")
    return _with_call_ids([_message(f"messages[{index}]", message) for index, message in enumerate(messages)])


def _message(where: str, message: Any) -> dict:
    """One Ollama message as an OpenAI one; the chat pipeline checks roles and the rest."""
    if not isinstance(message, dict):
        raise invalid_request(f"{where} must be an object")
    content = _optional_string(message, "content", where) or ""
    converted: dict = {"role": message.get("role"), "content": content}
    images = message.get("images")
    if images:
        converted["content"] = [{"type": "text", "text": content}, *_image_parts(images, f"{where}.images")]
    thinking = _optional_string(message, "thinking", where)
    if thinking:
        converted["reasoning_content"] = thinking
    tool_name = _optional_string(message, "tool_name", where)
    if tool_name is not None:
        converted["name"] = tool_name
    if isinstance(message.get("tool_call_id"), str):
        converted["tool_call_id"] = message["tool_call_id"]
    if message.get("tool_calls") is not None:
        converted["tool_calls"] = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
    return converted


def _optional_string(message: dict, key: str, where: str) -> str | None:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise invalid_request(f"{where}.{key} must be a string")
    return value


def _image_parts(images: Any, where: str) -> list[dict]:
    """Base64 images as the chat pipeline's image_url parts (a model without a projector refuses them)."""
    if not isinstance(images, list) or not all(isinstance(image, str) for image in images):
        raise invalid_request(f"{where} must be an array of base64 strings")
    return [{"type": "image_url", "image_url": {"url": f"data:{_image_type(image)};base64,{image}"}}
            for image in images]


def _image_type(image: str) -> str:
    try:
        head = base64.b64decode(image[:16] + "=" * (-len(image[:16]) % 4))
    except ValueError:
        return "application/octet-stream"
    return next((kind for magic, kind in _IMAGE_TYPES.items() if head.startswith(magic)), "application/octet-stream")


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise invalid_request(f"{where} must be an array")
    return [_tool_call(call, f"{where}[{index}]") for index, call in enumerate(calls)]


def _tool_call(call: Any, where: str) -> dict:
    """{function: {name, arguments: {...}}} -> OpenAI's call (arguments stay an object: the
    chat layer renders them as each template expects)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise invalid_request(f"{where} must be an object with a 'function' that has a string 'name'")
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        raise invalid_request(f"{where}.function.arguments must be an object")
    converted = {"type": "function", "function": {"name": function["name"], "arguments": arguments or {}}}
    if isinstance(call.get("id"), str):
        converted["id"] = call["id"]
    return converted


def _with_call_ids(messages: list[dict]) -> list[dict]:
    """Ollama's calls carry no ids and its tool results name their tool; templates that render ids
    (Mistral's want nine characters) get them: each call without one `call00000`, `call00001`,
    ..., each result without one the id of the earliest unanswered call of its tool (else the
    earliest unanswered call)."""
    unanswered: list[tuple[str, str]] = []  # (tool name, call id)
    count = 0
    for message in messages:
        for call in message.get("tool_calls", []):
            call.setdefault("id", f"call{count:05d}")
            count += 1
            unanswered.append((call["function"]["name"], call["id"]))
        if message.get("role") == "tool" and "tool_call_id" not in message and unanswered:
            match = next((entry for entry in unanswered if entry[0] == message.get("name")), unanswered[0])
            unanswered.remove(match)
            message["tool_call_id"] = match[1]
    return messages


# -- /api/generate ------------------------------------------------------------------------------

@dataclass(frozen=True)
class GeneratePlan:
    mode: str  # "chat" (the chat template), "raw" (/completion), "infill" (/infill, with `suffix`)
    body: dict  # what that pipeline takes
    load_only: bool  # an empty prompt: Ollama's "load the model" call


def generate_plan(body: dict, model: ModelFacts) -> GeneratePlan:
    check_common(body)
    fields = Fields(body)
    prompt, suffix, system = fields.string("prompt", ""), fields.string("suffix", ""), fields.string("system", "")
    if fields.string("template", ""):
        raise field_error("template", "is not supported: lamplight renders the chat template of the GGUF "
                                      "(--chat-template or --chat-template-file at start-up replace it)")
    context = _context(body.get("context"))
    raw = fields.boolean("raw", False)
    load_only = not prompt and not suffix
    if suffix:
        return GeneratePlan("infill", _infill_body(body, model, prompt, suffix, system, context), load_only)
    if raw:
        return GeneratePlan("raw", _raw_body(body, model, prompt, system, context), load_only)
    if context:
        raise field_error("context", "is only accepted with raw: true (it is prepended to the raw prompt); "
                                     "send the conversation to /api/chat as messages instead")
    return GeneratePlan("chat", _generate_chat_body(body, model, prompt, system), load_only)


def _generate_chat_body(body: dict, model: ModelFacts, prompt: str, system: str) -> dict:
    user: dict = {"role": "user", "content": prompt}
    if body.get("images"):
        user["content"] = [{"type": "text", "text": prompt}, *_image_parts(body["images"], "images")]
    messages = ([{"role": "system", "content": system}] if system else []) + [user]
    return {"messages": messages, **sampling_fields_of(body, model), **thinking_fields(body.get("think"), model)}


def _raw_body(body: dict, model: ModelFacts, prompt: str, system: str, context: list[int]) -> dict:
    _refuse_template_fields(body, system, "raw mode")
    raw: dict = {"prompt": [*context, prompt] if context else prompt, **sampling_fields_of(body, model)}
    if body.get("images"):
        raw["multimodal_data"] = body["images"]  # the pipeline's answer: this model has no projector
    return raw


def _infill_body(body: dict, model: ModelFacts, prompt: str, suffix: str, system: str, context: list[int]) -> dict:
    _refuse_template_fields(body, system, "suffix (infill)")
    if context:
        raise field_error("context", "cannot be combined with suffix (infill builds its own prompt)")
    infill = {"input_prefix": prompt, "input_suffix": suffix, "prompt": "", **sampling_fields_of(body, model)}
    if body.get("images"):
        infill["multimodal_data"] = body["images"]
    return infill


def _refuse_template_fields(body: dict, system: str, mode: str) -> None:
    """Without the chat template there is nowhere to put a system prompt or thinking switch."""
    if system:
        raise field_error("system", f"is not supported in {mode}: there is no chat template to put it in")
    think = body.get("think")
    if think is not None and think is not False:
        raise field_error("think", f"is not supported in {mode}: thinking is switched by the chat template")


def _context(value: Any) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise field_error("context", "must be an array of token ids (the `context` of an earlier raw reply)")
    return value
