"""Chat templates: the GGUF file's `tokenizer.chat_template` rendered with Jinja2, or a built-in fallback.

The environment follows Hugging Face's conventions for chat templates: a sandboxed (immutable) Jinja2
environment with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that keeps
non-ASCII text, and the globals `raise_exception(message)` and `strftime_now(format)`. The template sees
`messages`, `add_generation_prompt`, `bos_token`, `eos_token` and any extra keyword arguments (`tools`, ...).

When the file has no template, a built-in one is used, chosen by architecture:

* `gemma*`: llama.cpp's built-in "gemma" format. Each message is
  `<start_of_turn>{role}\\n{content}<end_of_turn>\\n` with `assistant` renamed `model`, contents stripped of
  ASCII whitespace, and system messages merged into the next user turn (followed by a blank line); the
  generation prompt is `<start_of_turn>model\\n`.
* anything else: ChatML, `<|im_start|>{role}\\n{content}<|im_end|>\\n`, generation prompt
  `<|im_start|>assistant\\n`.

Like llama.cpp, a rendered prompt that starts with the BOS text has it removed when the tokenizer adds BOS
itself (and a trailing EOS text when it adds EOS), so `tokenizer.encode(prompt)` never doubles them.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext

from . import sandbox
from .errors import TokenizerError

_WS = " \\t\\n\\v\\f\\r"  # C isspace(), as llama.cpp's trim()

GEMMA_TEMPLATE = (
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = ns.system + (message['content'] | trim('" + _WS + "')) %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{% if ns.system and role != 'model' %}{{ ns.system + '\\n\\n' }}{% set ns.system = '' %}{% endif %}"
    "{{ (message['content'] | trim('" + _WS + "')) + '<end_of_turn>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def builtin_template(architecture: str | None) -> str:
    """The fallback template for an architecture without `tokenizer.chat_template` (see the module doc)."""
    return GEMMA_TEMPLATE if (architecture or "").startswith("gemma") else CHATML_TEMPLATE


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face's assistant-mask marker) renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _environment() -> sandbox.BoundedEnvironment:
    env = sandbox.BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                     extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.bound_filters()
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template; `render` returns the prompt text (BOS/EOS handling: see the module doc)."""

    def __init__(self, source: str, bos_token: str, eos_token: str, *, strip_bos: bool = False,
                 strip_eos: bool = False, origin: str = "chat template"):
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token
        self.strip_bos, self.strip_eos, self.origin = strip_bos, strip_eos, origin
        if not isinstance(source, str):
            raise TokenizerError(f"{origin}: the chat template must be a string, got {type(source).__name__}")
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise TokenizerError(f"{origin}: cannot compile the chat template: {e}") from e
        except Exception as e:  # MemoryError, RecursionError (deep nesting), ...: the template is untrusted
            raise TokenizerError(f"{origin}: cannot compile the chat template: {type(e).__name__}: {e}") from e

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any) -> str:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise TokenizerError(f"{self.origin}: messages must be a list of dicts")
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, **extra}
        try:
            text = sandbox.render(self._template, messages=messages, add_generation_prompt=add_generation_prompt,
                                  **context)
        except jinja2.TemplateError as e:
            raise TokenizerError(f"{self.origin}: chat template failed: {e}") from e
        except Exception as e:  # a missing key, a division by zero, MemoryError, RecursionError, ...
            raise TokenizerError(f"{self.origin}: chat template failed: {type(e).__name__}: {e}") from e
        if self.strip_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.strip_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text
