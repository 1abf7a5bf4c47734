"""Rendering Hugging Face style Jinja chat templates the way llama-server (`--jinja`) does.

The environment is the one transformers' `apply_chat_template` builds: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, no keep_trailing_newline,
the loopcontrols extension, a pass-through `{% generation %}` tag, `raise_exception`,
`strftime_now` and a `tojson` filter that keeps non-ASCII text (`ensure_ascii=False`).

Template variables: `messages`, `add_generation_prompt`, `tools` (None when there are none),
`bos_token`, `eos_token`, `enable_thinking` (always defined, as in llama.cpp; True unless
`extra` says otherwise) and every key of `extra` (the request's `chat_template_kwargs`), which
cannot shadow the variables above.

llama.cpp behaviours reproduced on top of plain Jinja:
- a leading bos_token is cut from the output when the vocabulary adds BOS itself (`add_bos`),
  and a trailing eos_token when it adds EOS (`add_eos`), so the tokenizer does not double them;
- `add_generation_prompt` is left undefined rather than false when there is no generation prompt;
- `content: null` rendered as "" (llama-server holds content as a string), and message shapes
  some templates expect instead of OpenAI's (lamplight.chat.messages.adapt_to_caps, adapt_to_template);
- assistant prefill: when the last message is an assistant one, llama-server renders the other
  messages, then the generation prompt, the reply's thinking section and its content, so the
  prompt ends inside the reply with no end-of-turn marker (lamplight.chat.prefill).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from functools import cached_property
from typing import Any, NoReturn

from jinja2 import TemplateError, Undefined, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lamplight.chat.errors import ChatTemplateError
from lamplight.chat.caps import probe_caps
from lamplight.chat.messages import adapt_to_caps, adapt_to_template, normalize_messages
from lamplight.chat.families import detect_family, renders_tools
from lamplight.chat.prefill import ThinkingSection, thinking_section
from lamplight.chat.text import common_prefix_length


class TemplateRaised(ChatTemplateError):
    """The template called raise_exception(message); the message is the template's own."""


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` only marks assistant text for training; render the body."""

    tags = {"generation"}

    def parse(self, parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> NoReturn:
    raise TemplateRaised(str(message))


def _now() -> datetime:
    """The template clock (tests fix it)."""
    return datetime.now()


def _strftime_now(fmt: str) -> str:
    return _now().strftime(fmt)


class _LenientUndefined(Undefined):
    """llama.cpp's Jinja lets an undefined value join a string as "" (firefunction's `"\\n" + functions`)."""

    __slots__ = ()

    def __add__(self, other: Any) -> Any:
        return other if isinstance(other, str) else Undefined.__add__(self, other)

    def __radd__(self, other: Any) -> Any:
        return other if isinstance(other, str) else Undefined.__radd__(self, other)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=_json_default)


def _json_default(value: Any) -> Any:
    """`tools | map(attribute='function') | tojson`: Jinja's map/select yield generators; dump them as lists."""
    if isinstance(value, Iterator):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _plain_text(value: Any) -> str:
    """`|safe` without Markup: llama.cpp never HTML-escapes, but Markup + str would."""
    return str(value)


class _TemplateSandbox(ImmutableSandboxedEnvironment):
    """transformers' immutable sandbox, except that lists may grow and shrink (Kimi K2 keeps a stack with append and pop)."""

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in ("append", "pop"):
            return True
        return super().is_safe_attribute(obj, attr, value)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _TemplateSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        undefined=_LenientUndefined,
        extensions=[loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.filters["safe"] = _plain_text
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENVIRONMENT = _environment()


class ChatTemplate:
    """A compiled chat template plus the special-token text it is rendered with."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str = "custom",
                 *, add_bos: bool = False, add_eos: bool = False):
        self.source = source
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.supports_tools = renders_tools(source)
        self.family = detect_family(source)  # thinking, answer markers, tool format (lamplight.chat.families)
        self.reasoning = self.family.reasoning
        self.answer_wrapper = self.family.answer_wrapper
        self.supports_thinking = self.reasoning is not None
        self._template = _compile(source, name)
        self.caps = probe_caps(lambda messages, prompt, tools: self._render(normalize_messages(messages), prompt,
                                                                           tools, None))

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r})"

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None, extra: dict | None = None,
               prefill_assistant: bool = True, keep_null_content: bool = False) -> str:
        """Render the prompt; a final assistant message is continued unless prefill_assistant is
        False. A null content renders as "" (as llama-server's) unless keep_null_content."""
        messages = adapt_to_caps(normalize_messages(messages), self.caps, keep_null_content=keep_null_content)
        if prefill_assistant and messages[-1]["role"] == "assistant":
            return self._render_prefill(messages, tools, extra)
        return self._render(adapt_to_template(messages, self.source), add_generation_prompt, tools, extra)

    def _render_prefill(self, messages: list[dict], tools: list[dict] | None, extra: dict | None) -> str:
        history, reply = messages[:-1], messages[-1]
        if history and history[-1]["role"] == "assistant":
            raise ChatTemplateError("Cannot have 2 or more assistant messages at the end of the list.")
        history = adapt_to_template(history, self.source)
        # llama.cpp's way: the history without the generation prompt, then what the generation
        # prompt adds after the longest common prefix (which differs from rendering with the
        # generation prompt only where a template ends a conversation differently: Phi-3.5's eos).
        closed = self._render(history, False, tools, extra)
        opened = self._render(history, True, tools, extra)
        generation_prompt = opened[common_prefix_length(closed, opened):]
        reply_so_far = self.thinking_section.continue_reply(
            generation_prompt, reply.get("reasoning_content") or "", reply["content"] or "")
        return closed + reply_so_far

    @cached_property
    def thinking_section(self) -> ThinkingSection:
        """The thinking section a continued reply gets (lamplight.chat.prefill)."""
        return thinking_section(self.family.thinking, self.source, self._probe, self.caps.supports_tool_calls)

    def _probe(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None,
               extra: dict | None) -> str | None:
        """A rendering for the template analysis, or None where the template fails on it."""
        try:
            return self._render(adapt_to_caps(normalize_messages(messages), self.caps), add_generation_prompt,
                                tools, extra)
        except (ChatTemplateError, RecursionError):
            return None

    def _render(self, messages: list[dict], add_generation_prompt: bool,
                tools: list[dict] | None, extra: dict | None) -> str:
        context = self._context(messages, add_generation_prompt, tools, extra)
        try:
            text = self._template.render(context)
        except ChatTemplateError:
            raise
        except Exception as exc:  # any failure inside a template is the template's (or request's) fault
            raise ChatTemplateError(f"error rendering chat template {self.name!r}: {_describe(exc)}") from exc
        return self._strip_special_tokens(text)

    def _context(self, messages: list[dict], add_generation_prompt: bool,
                 tools: list[dict] | None, extra: dict | None) -> dict[str, Any]:
        if extra is not None and not isinstance(extra, dict):
            raise ChatTemplateError("'chat_template_kwargs' must be an object")
        context = {
            # llama.cpp passes enable_thinking always: true only where the template can think.
            "enable_thinking": self.supports_thinking,
            # Dates llama.cpp gives templates: Llama 3.x's `date_string`, firefunction v2's `datetime`.
            "date_string": _now().strftime("%d %b %Y"),
            "datetime": _now().strftime("%b %d %Y"),
            **(extra or {}),
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        if not add_generation_prompt:  # llama.cpp defines it only when true (RWKV World's default is true)
            del context["add_generation_prompt"]
        if tools:  # left undefined otherwise, as llama.cpp does (Hermes iterates `tools` if defined)
            context["tools"] = tools
        return context

    def _strip_special_tokens(self, text: str) -> str:
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text


def _compile(source: str, name: str):
    if not isinstance(source, str):
        raise ChatTemplateError(f"chat template {name!r} must be a string")
    try:
        return _ENVIRONMENT.from_string(source)
    except TemplateError as exc:
        raise ChatTemplateError(f"invalid chat template {name!r}: {_describe(exc)}") from exc


def _describe(exc: Exception) -> str:
    line = getattr(exc, "lineno", None)
    where = f" (line {line})" if line else ""
    return f"{type(exc).__name__}: {exc}{where}"
