"""A word-level tokenizer built locally, so the tiny policy needs nothing from the model hub.

Every whitespace-separated word of the corpus is one token; the chat template renders a conversation as::

    <bos><system> reach the goal G <user> . A | G . <assistant> goal is down 1 left 1 ; action down <eos>

so conversational data (``messages`` with system/user/assistant roles, as TRL and ``datasets`` hold it) renders to
the tiny model's format through the ordinary ``apply_chat_template``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
ROLE_TOKENS = ["<system>", "<user>", "<assistant>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<{{ message['role'] }}> {{ message['content'] }} "
    "{% if message['role'] == 'assistant' %}{{ eos_token }} {% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def build_word_tokenizer(corpus: Iterable[str]) -> PreTrainedTokenizerFast:
    """Train a WordLevel tokenizer on ``corpus`` and wrap it for transformers (left padding, chat template).

    Token ids are deterministic for a given corpus: the trainer orders words by count, then alphabetically.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(unk_token=UNK))
    # WhitespaceSplit, not Whitespace: the latter would cut "<system>"-like words and "|" runs at punctuation.
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=[PAD, BOS, EOS, UNK, *ROLE_TOKENS], show_progress=False)
    backend.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=ROLE_TOKENS,
        chat_template=CHAT_TEMPLATE,
        # Batched generation appends to the right end of every prompt, so prompts are padded on the left.
        padding_side="left",
    )
