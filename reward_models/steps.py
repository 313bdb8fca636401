"""Per-step heads: what the process reward model (`reward_models.prm`) and the value critic (`reward_models.value`)
share. Both put a token-classification head on a causal LM or encoder and read it at the token that ends each step,
the design of TRL's former ``PRMTrainer``. This module lays trajectories out and reads a head at their steps;
`reward_models.step_training` trains one.

A trajectory is a `prompt` and one piece per step, in one of two styles (the stepwise and returns exports' layouts;
the prompt followed by the pieces is the trajectory up to its last step):

- text: the prompt and the pieces are text (the ``Role: content`` transcript cut at each step);
- conversational: the prompt is the messages before the first step, and piece ``i`` the messages after step
  ``i - 1``'s assistant message through step ``i``'s (what came back, then the turn), rendered by the tokenizer's chat
  template with the row's ``tools`` (`step_texts`): each piece is what the rendering of the conversation through it
  adds, up to the last token of its assistant message (the token before the end-of-sequence token that closes the
  turn, which opens the next piece).

Each piece is tokenised on its own, followed by `step_separator`, and the step is read at the last token of the two;
everything else carries the label ``-100`` and is ignored::

    <bos> System: reach the goal G User: ... Assistant: | goal is down 4 left 1 ; action left | User: ... action up
                                                                                        ^ step 0               ^ step 1

The exported text pieces end at a decision and the next one starts with a newline, so the default separator is empty
and each step is read at its last token (the action, or the last token of a tool call); set ``--step_separator '\\n'``
to read at a separator token as TRL did (on a word-level tokenizer a newline encodes to nothing and the two are the
same).

Long trajectories are cut into windows of at most `max_length` tokens rather than truncated, so no labelled step is
dropped, and every step is read after as much of the trajectory before it as fits: the first window starts at the
prompt and reads every step that ends inside it; each later step gets a window of its own that ends at it and holds
``<bos>`` and then as many of the tokens before it as fit (the past cut from the left: the beginning of the prompt
first, then the earliest steps). A trajectory of ``n`` steps past the first window so costs ``n`` more windows, the
price of never reading a step with less of its past than fits. Training and scoring cut the same way, so a step is
scored with the context it was trained with. A causal LM reads each step from what came before it only; an encoder
also sees the steps after it in the first window, so its score for a step changes when later steps are added (use a
causal LM where that matters, as in online PPO).

The head's settings (`step_separator`, `step_max_length`, and `step_style`, the style of the rows it trained on, which
is the one it reads) are stored in the model's ``config.json``, so a directory that another trainer saved again
(PPO continues the value critic) still scores the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.config import ConfigError
from reward_models.common.judge_config import JudgeConfig
from reward_models.conversation import Message
from reward_models.policy.turns import message_steps, text_pair, text_steps, transcript

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

IGNORE = -100
STYLES = ("conversational", "text")
# A trajectory's prompt and step pieces: text, or message lists (see the module docstring).
Prompt = str | Sequence[Message]
Pieces = Sequence[str] | Sequence[Sequence[Message]]
Tools = Sequence[dict[str, Any]] | None


@dataclass
class StepHeadConfig(JudgeConfig):
    """Settings of a per-step head, on top of `JudgeConfig`."""

    step_separator: str = field(
        default="",
        metadata={
            "help": "Text appended to each step piece; the step is read at its last token (empty: the piece's)."
        },
    )


# --- encoding ----------------------------------------------------------------------------------------------------


@dataclass
class StepWindow:
    """Token ids of (part of) one trajectory, and where in them each of its steps is read."""

    input_ids: list[int]
    positions: list[int]
    steps: list[int]


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Right padding (positions then count from each window's start) and a pad token (the end-of-text token for
    causal LMs that have none)."""
    tokenizer.padding_side = "right"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def pieces_problem(row: Mapping[str, Any], export: str) -> str | None:
    """Why a row's ``prompt`` and ``completions`` are no trajectory in either style, or None: the prompt is text or
    messages and the step pieces a non-empty list of the same kind. `export` says, for the message, how to export
    such rows."""
    prompt, completions = row.get("prompt"), row.get("completions")
    if not isinstance(prompt, str | list):
        return f"prompt must be text or messages ({export})"
    if not isinstance(completions, list) or not completions:
        return "completions must be a non-empty list of step pieces"
    piece = str if isinstance(prompt, str) else list
    if not all(isinstance(completion, piece) for completion in completions):
        return f"the step pieces must be {piece.__name__}s, as the prompt"
    return None


def trajectory_steps(messages: Sequence[Message], style: str) -> tuple[Prompt, Pieces]:
    """A trajectory conversation as the prompt and one piece per assistant turn, in `style` (what the stepwise
    export writes for a trajectory with every step labelled)."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    return text_steps(messages) if style == "text" else message_steps(messages)


def step_texts(
    tokenizer: PreTrainedTokenizerBase, prompt: Prompt, completions: Pieces, tools: Tools = None
) -> tuple[str, list[str]]:
    """The text of the prompt and of each step piece, as the head reads them: text rows as they are; conversational
    rows rendered by the chat template with `tools` (see the module docstring), or without one read as their
    ``Role: content`` transcript (the text export's form). Each rendered piece ends with its last assistant message's
    content; the token that closes the turn, and whatever the template writes after it, go to the next piece."""
    if isinstance(prompt, str):
        return prompt, list(completions)
    conversations = [list(prompt)]
    for piece in completions:
        conversations.append([*conversations[-1], *piece])
    if tokenizer.chat_template:
        renders = [
            tokenizer.apply_chat_template(messages, tools=list(tools) if tools else None, tokenize=False).rstrip()
            for messages in conversations
        ]
    else:
        prompt_text = text_pair(conversations[0], conversations[-1][len(conversations[0]) :])[0]
        renders = [prompt_text, *(transcript(messages) for messages in conversations[1:])]
    cuts = [len(renders[0])]
    for index in range(1, len(renders)):
        if not renders[index].startswith(renders[index - 1]):
            raise ValueError(
                f"the chat template renders the conversation before step {index - 1} differently once it "
                "goes on, so its steps cannot be read one after another"
            )
        # A chat template closes an assistant turn with the end-of-sequence token the model writes to end it; the
        # step is read at the turn's last token before it (its action), and the closing token opens the next piece.
        turn = renders[index][len(renders[index - 1]) :]
        end = turn.rfind(tokenizer.eos_token) if tokenizer.chat_template and tokenizer.eos_token else -1
        cuts.append(len(renders[index - 1]) + end if end > 0 else len(renders[index]))
    whole = renders[-1]
    return whole[: cuts[0]], [whole[begin:end] for begin, end in zip(cuts[:-1], cuts[1:], strict=True)]


def step_windows(
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    completions: Pieces,
    separator: str,
    max_length: int,
    tools: Tools = None,
) -> list[StepWindow]:
    """`prompt` and the step pieces as windows of at most `max_length` tokens that together read every step once
    (one window when the whole trajectory fits)."""
    prompt_text, pieces = step_texts(tokenizer, prompt, completions, tools)
    return text_windows(tokenizer, prompt_text, pieces, separator, max_length)


def text_windows(
    tokenizer: PreTrainedTokenizerBase, prompt: str, pieces: Sequence[str], separator: str, max_length: int
) -> list[StepWindow]:
    """`step_windows` of a trajectory already laid out as text: each piece is read at its last token (after
    `separator`), after as much of the text before it as fits in `max_length` tokens."""
    separator_ids = tokenizer(separator, add_special_tokens=False)["input_ids"] if separator else []
    head = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    if head and ids[:1] == head:  # a chat template that writes <bos> itself: every window starts with one already
        ids = ids[1:]
    ends = []
    for index, piece in enumerate(pieces):
        piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"] + separator_ids
        if not piece_ids:
            raise ValueError(
                f"step {index} ({piece!r}) encodes to no tokens, so it cannot be read; set a step_separator"
            )
        ids.extend(piece_ids)
        ends.append(len(ids) - 1)
    budget = max_length - len(head)
    if budget < 2:
        raise ConfigError("max_length", f"must leave room for at least 2 tokens after <bos>, got {max_length}")
    windows, step = [], 0
    while step < len(ends):
        # The window ends at the first step not yet read and holds as much before it as fits; while that is the whole
        # trajectory so far, it runs on to the budget and reads every later step that ends inside it too.
        start = max(0, ends[step] + 1 - budget)
        stop = min(len(ids), start + budget)
        steps = [k for k in range(step, len(ends)) if ends[k] < stop]
        positions = [len(head) + ends[k] - start for k in steps]
        windows.append(StepWindow(head + ids[start:stop], positions, steps))
        step = steps[-1] + 1
    return windows


def training_examples(
    tokenizer: PreTrainedTokenizerBase,
    trajectories: Sequence[tuple[Prompt, Pieces, Sequence[float]]],
    separator: str,
    max_length: int,
    tools: Sequence[Tools] = (),
) -> list[dict[str, list]]:
    """``{"input_ids", "labels"}`` examples from ``(prompt, completions, targets)`` (with `tools`, one list of tool
    schemas or None per trajectory): one per window, labelled with each step's target at its read position and
    `IGNORE` elsewhere."""
    examples = []
    offered = list(tools) or [None] * len(trajectories)
    for (prompt, completions, targets), trajectory_tools in zip(trajectories, offered, strict=True):
        for window in step_windows(tokenizer, prompt, completions, separator, max_length, trajectory_tools):
            labels: list[float] = [IGNORE] * len(window.input_ids)
            for position, step in zip(window.positions, window.steps, strict=True):
                labels[position] = targets[step]
            examples.append({"input_ids": window.input_ids, "labels": labels})
    return examples


class StepCollator:
    """Pads a batch of examples on the right: pad token ids, a zero attention mask and `IGNORE` labels, as long
    (class ids) or float (regression targets) tensors."""

    def __init__(self, pad_token_id: int, regression: bool) -> None:
        self.pad_token_id = pad_token_id
        self.regression = regression

    def __call__(self, examples: Sequence[dict[str, list]]) -> dict[str, torch.Tensor]:
        import torch

        width = max(len(example["input_ids"]) for example in examples)
        input_ids = torch.full((len(examples), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
        labels = torch.full((len(examples), width), IGNORE, dtype=torch.float32 if self.regression else torch.long)
        for row, example in enumerate(examples):
            length = len(example["input_ids"])
            input_ids[row, :length] = torch.tensor(example["input_ids"])
            attention_mask[row, :length] = 1
            labels[row, :length] = torch.tensor(example["labels"], dtype=labels.dtype)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def regression_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    """Squared error of a one-output head at the read positions (labels other than `IGNORE`), summed and divided by
    the Trainer's count of read positions in the whole (accumulated) batch, or averaged when it gives none."""
    predictions = outputs.logits.squeeze(-1).float()
    read = labels != IGNORE
    errors = (predictions[read] - labels[read].to(predictions.dtype)) ** 2
    if num_items_in_batch is None:
        return errors.mean()
    return errors.sum() / num_items_in_batch


# --- scoring -----------------------------------------------------------------------------------------------------


def read_steps(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    trajectories: Sequence[tuple[Prompt, Pieces]],
    batch_size: int = 16,
    tools: Sequence[Tools] = (),
) -> list[torch.Tensor]:
    """The head's outputs at every step of each ``(prompt, completions)`` (with `tools`, one list of tool schemas or
    None per trajectory, in the style the head trained on): one float tensor of shape ``(steps, num_labels)`` per
    trajectory, on the CPU. The model's mode is left as it is (call ``eval()``)."""
    import torch

    style = step_style(model)
    if any(isinstance(prompt, str) != (style == "text") for prompt, _ in trajectories):
        raise ValueError(f"this head was trained on {style} rows and reads only those")
    separator, max_length = model.config.step_separator, model.config.step_max_length
    offered = list(tools) or [None] * len(trajectories)
    windows = [
        (index, window)
        for index, ((prompt, completions), trajectory_tools) in enumerate(zip(trajectories, offered, strict=True))
        for window in step_windows(tokenizer, prompt, completions, separator, max_length, trajectory_tools)
    ]
    outputs = [torch.empty((len(completions), model.config.num_labels)) for _, completions in trajectories]
    collator = StepCollator(tokenizer.pad_token_id, regression=False)
    with torch.no_grad():
        for first in range(0, len(windows), batch_size):
            chunk = windows[first : first + batch_size]
            batch = collator([{"input_ids": w.input_ids, "labels": [IGNORE] * len(w.input_ids)} for _, w in chunk])
            logits = model(
                input_ids=batch["input_ids"].to(model.device), attention_mask=batch["attention_mask"].to(model.device)
            ).logits.float()
            for row, (index, window) in enumerate(chunk):
                outputs[index][window.steps] = logits[row, window.positions].cpu()
    return outputs


def step_style(model: PreTrainedModel) -> str:
    """The style of rows a per-step head trained on, and so reads. A head saved before conversational rows existed
    has no ``step_style`` in its config and trained on text."""
    return model.config.to_dict().get("step_style", "text")


def load_step_model(path: str | Path, device: str | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A per-step head directory's model (in eval mode, on `device`: CUDA when there is one) and tokenizer."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    model = AutoModelForTokenClassification.from_pretrained(path)
    for setting in ("step_separator", "step_max_length"):
        if not hasattr(model.config, setting):
            raise ValueError(f"{path} is not a per-step head: its config.json has no {setting}")
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu")).eval()
    return model, prepare_tokenizer(AutoTokenizer.from_pretrained(path))
