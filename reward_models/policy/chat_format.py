"""The chat format of tool-calling policies: Qwen2.5's, and a byte-level BPE tokenizer built locally to carry it.

A conversation is OpenAI-shaped messages (system, user, assistant with ``tool_calls``, tool). ``QWEN_CHAT_TEMPLATE``
renders it the way Qwen2.5 does::

    <|im_start|>system
    You are a helpful assistant.

    # Tools
    search(query)
    add_to_cart(item_id, quantity)
    ...<|im_end|>
    <|im_start|>user
    Buy "red mug", quantity 3.<|im_end|>
    <|im_start|>assistant
    <tool_call>
    {"name": "search", "arguments": {"query": "red mug"}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    [{"name": "red mug", "id": "kq48", "price": 7}]
    </tool_response><|im_end|>
    <|im_start|>assistant

Everything but the tools block is Qwen2.5's template: tool calls as ``<tool_call>`` JSON blocks in the assistant
turn, consecutive tool results as ``<tool_response>`` blocks in one user turn. The tools block lists each tool as a
one-line signature instead of Qwen's JSON schemas (about 400 tokens for six tools), because a small model trained from
scratch pays for every prompt token and learns the tools from its demonstrations anyway.

A model's assistant turn is kept as the text it wrote, ``<tool_call>`` markup included: rendered as
``{"role": "assistant", "content": text}`` it gives back exactly the generated text, and ``parse_assistant_text``
reads the tool calls out of it for the environment. An assistant message with a ``tool_calls`` field (from an API or an
annotator) renders to the same text that ``format_assistant_text`` writes for it.

No torch import at module level: the web side renders and parses conversations with this module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_START, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Qwen2's pre-tokenizer: letters run together (with one leading non-letter), every digit is its own token.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

QWEN_CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system_prompt = messages[0]['content'] %}"
    "{%- else %}"
    "{%- set system_prompt = '" + DEFAULT_SYSTEM_PROMPT + "' %}"
    "{%- endif %}"
    "{{- '<|im_start|>system\\n' + system_prompt }}"
    "{%- if tools %}"
    "{{- '\\n\\n# Tools' }}"
    "{%- for tool in tools %}"
    "{%- set function = tool['function'] if tool['function'] is defined else tool %}"
    "{%- set parameters = function['parameters'] if function['parameters'] is defined else {} %}"
    "{%- set properties = parameters['properties'] if parameters['properties'] is defined else {} %}"
    "{{- '\\n' + function['name'] + '(' + (properties | list | join(', ')) + ')' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first)"
    " or (message['role'] == 'assistant' and not message['tool_calls']) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if tool_call['function'] is defined %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
    # OpenAI-shaped calls carry their arguments as JSON text, Qwen-shaped ones as an object.
    "{%- if tool_call['arguments'] is string %}{{- tool_call['arguments'] }}"
    "{%- else %}{{- tool_call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_TOOL_CALL_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)(?:" + re.escape(TOOL_CALL_END) + r"|\Z)", re.S)


def format_tool_call(name: str, arguments: str | dict[str, Any]) -> str:
    """One ``<tool_call>`` block, as the template renders it (arguments given as JSON text are kept verbatim)."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f'{TOOL_CALL_START}\n{{"name": "{name}", "arguments": {arguments}}}\n{TOOL_CALL_END}'


def format_assistant_text(message: dict[str, Any]) -> str:
    """The text a Qwen2.5-format model writes for an assistant message: its content, then one ``<tool_call>`` block
    per call, on separate lines. Rendered as plain content, it gives the same conversation text as the message."""
    parts = [message["content"]] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        parts.append(format_tool_call(function["name"], function.get("arguments", {})))
    return "\n".join(parts)


def parse_assistant_text(text: str, first_id: int = 0) -> dict[str, Any]:
    """A model's raw assistant text as an OpenAI assistant message. Never raises: the text is untrusted.

    ``content`` is the text outside the ``<tool_call>`` blocks, stripped. Each block becomes a tool call with the id
    ``call_<first_id + index>`` (pass the number of calls earlier in the conversation to keep ids unique) and its
    arguments re-serialised as JSON text. A block that is not ``{"name": str, "arguments": object}`` JSON (or JSON
    text of an object), or that is cut off without ``</tool_call>``, is kept as a call with the name ``""`` and the
    block's raw text as arguments, which environments answer with an error.

    >>> parse_assistant_text('<tool_call>\\n{"name": "search", "arguments": {"query": "mug"}}\\n</tool_call>')
    {'role': 'assistant', 'content': '', 'tool_calls': [{'id': 'call_0', 'type': 'function', \
'function': {'name': 'search', 'arguments': '{"query": "mug"}'}}]}
    """
    calls = []
    for index, match in enumerate(_TOOL_CALL_BLOCK.finditer(text)):
        name, arguments = _parse_call(match.group(1), closed=match.group(0).endswith(TOOL_CALL_END))
        function = {"name": name, "arguments": arguments}
        calls.append({"id": f"call_{first_id + index}", "type": "function", "function": function})
    content = _TOOL_CALL_BLOCK.sub("", text).strip()
    return {"role": "assistant", "content": content, "tool_calls": calls}


def _parse_call(block: str, closed: bool) -> tuple[str, str]:
    if not closed:
        return "", block
    try:
        parsed = json.loads(block)
    except json.JSONDecodeError:
        return "", block
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str) or not parsed["name"]:
        return "", block
    arguments = parsed.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return "", block
    if not isinstance(arguments, dict):
        return "", block
    return parsed["name"], json.dumps(arguments, ensure_ascii=False)


def render_chat(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    chat_template: str = QWEN_CHAT_TEMPLATE,
) -> str:
    """A conversation rendered with ``chat_template``, without a tokenizer (what ``apply_chat_template(...,
    tokenize=False)`` returns for a tokenizer carrying that template)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[list(messages)],
        tools=list(tools) if tools is not None else None,
        chat_template=chat_template,
        add_generation_prompt=add_generation_prompt,
    )
    return rendered[0]


def build_bpe_tokenizer(
    corpus: Iterable[str], vocab_size: int = 4096, *, added_tokens: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``corpus`` with Qwen2's pre-tokenizer, wrapped for transformers.

    Special tokens ``<|endoftext|>`` (padding), ``<|im_start|>`` and ``<|im_end|>`` (end of a turn, so generation
    stops there); ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>`` and ``added_tokens``
    (an environment's opaque ids, so that copying one is copying one token) are ordinary added tokens: decoding
    keeps them. ``vocab_size`` caps the BPE vocabulary; a small corpus may saturate below it. Left padding and the
    chat template are set. Deterministic for a given corpus.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    special = [ENDOFTEXT, IM_START, IM_END]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    markup = [TOOL_CALL_START, TOOL_CALL_END, TOOL_RESPONSE_START, TOOL_RESPONSE_END]
    backend.add_tokens([AddedToken(token, normalized=False, special=False) for token in [*markup, *added_tokens]])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START],
        chat_template=QWEN_CHAT_TEMPLATE,
        # Only the turn structure is protected by apply_chat_template(sanitize_control_tokens=True): an assistant
        # turn kept as the model's raw text must still encode its <tool_call> markup as the tokens it generated.
        chat_control_tokens=[ENDOFTEXT, IM_START, IM_END, TOOL_RESPONSE_START, TOOL_RESPONSE_END],
        # Batched generation appends to the right end of every prompt, so prompts are padded on the left.
        padding_side="left",
    )
