"""Built-in chat templates (the names llama-server accepts for `--chat-template NAME`).

Each is a Jinja source written after the format's public definition:
- chatml: llama.cpp's CHATML_TEMPLATE_SRC (`<|im_start|>role\\ncontent<|im_end|>\\n`).
- llama3: Meta Llama 3 Instruct (`<|start_header_id|>role<|end_header_id|>\\n\\ncontent<|eot_id|>`,
  bos_token first, content trimmed).
- gemma: Gemma 3 text turns (`<start_of_turn>user|model\\n...<end_of_turn>\\n`, bos_token first,
  a system message becomes a "system\\n\\n" prefix of the first user turn). Unlike Google's template it
  does not insist on strictly alternating roles, because it also serves as the fallback for base models.
- llama2: Llama 2 chat (`<s>[INST] <<SYS>>\\n...\\n<</SYS>>\\n\\nuser [/INST] answer </s>`).
- phi3: Phi-3 (`<|role|>\\ncontent<|end|>\\n`, `<|assistant|>\\n` as generation prompt).
"""

from __future__ import annotations

CHATML = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)

LLAMA3 = (
    "{%- for message in messages -%}\n"
    "  {%- if loop.first -%}{{- bos_token -}}{%- endif -%}\n"
    "  {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' -}}\n"
    "  {{- (message.content or '') | trim -}}\n"
    "  {{- '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "{%- endif -%}"
)

GEMMA = (
    "{{- bos_token -}}\n"
    "{%- if messages and messages[0].role == 'system' -%}\n"
    "  {%- set first_user_prefix = (messages[0].content or '') | trim + '\\n\\n' -%}\n"
    "  {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "  {%- set first_user_prefix = '' -%}\n"
    "  {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "  {%- set role = 'model' if message.role == 'assistant' else message.role -%}\n"
    "  {{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') -}}\n"
    "  {{- (message.content or '') | trim -}}\n"
    "  {{- '<end_of_turn>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<start_of_turn>model\\n' -}}\n"
    "{%- endif -%}"
)

LLAMA2 = (
    "{%- if messages and messages[0].role == 'system' -%}\n"
    "  {%- set system_message = messages[0].content -%}\n"
    "  {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "  {%- set system_message = none -%}\n"
    "  {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "  {%- set content = message.content or '' -%}\n"
    "  {%- if loop.first and system_message is not none -%}\n"
    "    {%- set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + content -%}\n"
    "  {%- endif -%}\n"
    "  {%- if message.role == 'user' -%}\n"
    "    {{- bos_token + '[INST] ' + content | trim + ' [/INST]' -}}\n"
    "  {%- elif message.role == 'assistant' -%}\n"
    "    {{- ' ' + content | trim + ' ' + eos_token -}}\n"
    "  {%- endif -%}\n"
    "{%- endfor -%}"
)

PHI3 = (
    "{%- for message in messages -%}\n"
    "  {{- '<|' + message.role + '|>\\n' + (message.content or '') + '<|end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|assistant|>\\n' -}}\n"
    "{%- endif -%}"
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": CHATML,
    "llama3": LLAMA3,
    "gemma": GEMMA,
    "llama2": LLAMA2,
    "phi3": PHI3,
}
