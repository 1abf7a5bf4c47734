"""OpenAI tool calling: formats, grammars, parsers and streaming deltas (README.md)."""

from .base import GrammarSource, ParsedMessage, ToolFormat, ToolPlan
from .formats import (
    CommandR7BFormat,
    CommandRPlusFormat,
    DeepSeekR1Format,
    DeepSeekV31Format,
    GraniteFormat,
    GenericFormat,
    HermesFormat,
    Llama3Format,
    MistralFormat,
)
from .harmony import HarmonyFormat
from .xml_calls import GlmFormat, QwenXmlFormat
from .plan import FORMATS, detect_format, plan_tool_calling, prompt_inputs, template_tools
from .spec import ToolCall, ToolRequestError, ToolSpec, new_tool_call_id
from .stream import ToolCallStream, finish_reason, message_json

__all__ = [
    "FORMATS",
    "CommandR7BFormat",
    "CommandRPlusFormat",
    "DeepSeekR1Format",
    "DeepSeekV31Format",
    "GraniteFormat",
    "GenericFormat",
    "GlmFormat",
    "GrammarSource",
    "HarmonyFormat",
    "HermesFormat",
    "Llama3Format",
    "MistralFormat",
    "ParsedMessage",
    "QwenXmlFormat",
    "ToolCall",
    "ToolCallStream",
    "ToolFormat",
    "ToolPlan",
    "ToolRequestError",
    "ToolSpec",
    "detect_format",
    "finish_reason",
    "message_json",
    "new_tool_call_id",
    "plan_tool_calling",
    "prompt_inputs",
    "template_tools",
]
