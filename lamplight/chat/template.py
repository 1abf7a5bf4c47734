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
- assistant prefill: when the last message is an assistant one, llama-server renders the other
  messages with the generation prompt and appends that message's content verbatim, so the prompt
  ends right after the content with no end-of-turn marker.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, NoReturn

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lamplight.chat.errors import ChatTemplateError
from lamplight.chat.messages import normalize_messages

_MENTIONS_TOOLS = re.compile(r"\btools\b")


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


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        extensions=[loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
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
        self.supports_tools = bool(_MENTIONS_TOOLS.search(source))
        self._template = _compile(source, name)

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r})"

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None, extra: dict | None = None,
               prefill_assistant: bool = True) -> str:
        """Render the prompt; a final assistant message is continued unless prefill_assistant is False."""
        messages = normalize_messages(messages)
        if prefill_assistant and messages[-1]["role"] == "assistant":
            return self._render_prefill(messages, tools, extra)
        return self._render(messages, add_generation_prompt, tools, extra)

    def _render_prefill(self, messages: list[dict], tools: list[dict] | None, extra: dict | None) -> str:
        history, unfinished = messages[:-1], messages[-1]
        if history and history[-1]["role"] == "assistant":
            raise ChatTemplateError("Cannot have 2 or more assistant messages at the end of the list.")
        return self._render(history, True, tools, extra) + (unfinished["content"] or "")

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
        return {
            "enable_thinking": True,
            **(extra or {}),
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "tools": tools or None,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }

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
