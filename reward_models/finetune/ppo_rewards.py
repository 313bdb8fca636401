"""The reward side of PPO (`reward_models.finetune.ppo`): what each turn of a rollout earns, the value critic that
PPO keeps training, and the advantages.

Per-turn rewards. An episode of ``T`` turns gets ``r_0 .. r_{T-1}``:

- ``reward_source="model"``: the reward model's score of the whole trajectory, read as the reward model was trained
  on it (the `preference` export's conversational layout: the prompt is the episode's prompt, the completion the rest
  of its conversation, every turn, tool result and observation, the final one included, through the reward model's
  chat template with the episode's tools), normalised by the running mean and standard deviation of the scores seen
  so far, on the last turn; plus, with a PRM, a shaping term on every turn from the PRM's P(good) (the PRM reads the
  `stepwise` layout, one piece per step, in the style it trained on, as in training). ``prm_shaping`` picks it:

  - ``"penalty"`` (the default): ``prm_weight * min(P(good) - 0.5, 0)``, a charge for each step the PRM finds bad and
    nothing for a good one: the "clip" mechanism of Gao et al. 2024 (On Designing Effective RL Reward at Training
    Time for LLM Reasoning). No number of extra steps can earn reward, so the policy cannot profit from length.
  - ``"signed"``: ``prm_weight * (P(good) - 0.5)``, the same shaping `reward_models.value` uses for unrewarded
    trajectories. A PRM that finds most steps good pays for every extra turn, which can outweigh the reward model's
    one score per episode; in the loop bench, PRMs trained on eight step-labelled trajectories a round called
    every step good, or every step bad.
  - ``"centred"``: ``prm_weight * (P(good) - m)``, ``m`` the running mean of P(good) over every step scored so far:
    about zero over an average trajectory whatever its length.
  The reward model applies the layout it was trained in (``reward_models.policy.turns.JUDGE_LAYOUTS``); one that
  reads the policy's reasoning can be paid by it, so the loop bench trains its reward models on ``moves`` (maps and
  actions only). And ``invalid_penalty`` is charged on each turn the environment flags invalid
  (`charge_invalid_turns`): a turn with no usable action costs that much whatever a judge makes of its text.
- ``reward_source="oracle"``: the environment's own per-step rewards (the gridworld: 1 on reaching the goal), the
  upper bound that a perfect judge would give.
- Either way, minus ``kl_beta`` times the turn's KL estimate to the reference policy, ``sum over its tokens of
  log pi_old - log pi_ref`` (the k1 estimator on the sampled tokens).

The value critic reads V(s_t), the value of the history *before* decision ``t``: GAE needs a state value, and a
value read after the decision (as `reward_models.value` trains it, ``Q(h_t, a_t)``) would cancel the very advantage
of the decision it has seen. It is the same kind of model as `reward_models.value`'s (a one-output token
classification head, step settings in its ``config.json``), reading the conversation in its style (`critic_texts`):
in the conversational style at the end of the chat template's prompt for turn ``t`` (the generation prompt, with the
episode's tools), in the text style at the token that ends ``...User: <observation t>\\nAssistant:``. A critic
trained by `reward_models.value` starts from its weights and PPO's value loss retrains it at these positions; a new
critic reads conversations when the policy's tokenizer has a chat template.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reward_models.common.batching import pad_right
from reward_models.conversation import Conversation, Message
from reward_models.policy.turns import JUDGE_LAYOUTS, judge_view, render_prompt, transcript
from reward_models.rollout import episode_messages

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reward_models.rollout import Episode

REWARD_LAYOUTS = JUDGE_LAYOUTS
PRM_SHAPINGS = ("penalty", "signed", "centred")


# --- the judges' inputs -------------------------------------------------------------------------------------------


def reward_model_inputs(episode: Episode, layout: str = "full") -> tuple[list[Message], list[Message]]:
    """(prompt, completion) of the `preference` export for one episode, as `RewardModel.score` reads them (with
    the episode's tools)."""
    messages = judge_view(episode_messages(episode), layout)
    cut = len(episode.prompt)
    return messages[:cut], messages[cut:]


def critic_texts(
    tokenizer: PreTrainedTokenizerBase,
    conversation: Conversation,
    tools: Sequence[dict] | None,
    style: str,
    *,
    after_last: bool = False,
) -> tuple[str, list[str]]:
    """The text prompt and one piece per step for reading V before each decision: the prompt followed by pieces
    ``0..t`` is the conversation up to where decision ``t`` starts, rendered as the policy's prompt for it by the
    chat template with the tools (the conversational style), or as the transcript ending in ``Assistant:`` (text;
    the form `text_steps` gives the judges, cut one decision earlier). With `after_last`, one more piece reads V
    after the last step's replies: where the next decision would start, the value an episode cut short by a turn
    cap bootstraps from."""
    steps = range(conversation.num_steps)
    if style == "text":
        renders = [transcript(conversation.messages[:1])]
        renders += [transcript(conversation.before_step(step)) + "\nAssistant:" for step in steps]
        if after_last:
            renders.append(transcript(conversation.messages) + "\nAssistant:")
    else:
        offered = list(tools) if tools else None
        renders = [tokenizer.apply_chat_template(conversation.prompt, tools=offered, tokenize=False)]
        renders += [render_prompt(tokenizer, conversation.before_step(step), tools) for step in steps]
        if after_last:
            renders.append(render_prompt(tokenizer, conversation.messages, tools))
    for index in range(1, len(renders)):
        if not renders[index].startswith(renders[index - 1]):
            raise ValueError("the chat template renders an earlier turn differently as the conversation goes on")
    return renders[0], [renders[index][len(renders[index - 1]) :] for index in range(1, len(renders))]


# Stands in for a turn the policy left empty, so that the PRM still has a token to read the step at.
EMPTY_DECISION = "action"


def prm_messages(episode: Episode) -> list[Message]:
    """An episode's conversation as the PRM reads it (an empty turn, with neither text nor tool calls, is written
    as ``EMPTY_DECISION``; `JudgeRewards` scores such a step as bad whatever the PRM says)."""
    return [
        {**message, "content": EMPTY_DECISION} if _empty_turn(message) else message
        for message in episode_messages(episode)
    ]


def _empty_turn(message: Message) -> bool:
    return (
        message["role"] == "assistant" and not (message.get("content") or "").strip() and not message.get("tool_calls")
    )


# --- rewards -------------------------------------------------------------------------------------------------------


@dataclass
class RunningMoments:
    """Running mean and variance (Chan et al.'s parallel update), to put reward-model scores on a stable scale
    across iterations; kept in the loop checkpoint."""

    count: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, values: Sequence[float]) -> None:
        if not values:
            return
        n = len(values)
        batch_mean = sum(values) / n
        batch_m2 = sum((value - batch_mean) ** 2 for value in values)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta**2 * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count > 1 else 1.0

    def normalise(self, value: float) -> float:
        return (value - self.mean) / max(self.std, 1e-6)

    def state(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}


class JudgeRewards:
    """The judge models' per-turn rewards for a batch of episodes (the ``model`` reward source): the reward model's
    score on the last turn, and the PRM's shaping on every turn. Either may be left out (an empty path), not both."""

    def __init__(
        self,
        reward_model_path: str,
        prm_path: str,
        *,
        prm_weight: float,
        layout: str,
        normalise: bool,
        device: Any,
        prm_shaping: str = "penalty",
    ) -> None:
        from reward_models.prm import load_prm
        from reward_models.reward.model import load_reward_model

        if not (reward_model_path or prm_path):
            raise ValueError("a reward model or a PRM is needed")
        self.reward_model = load_reward_model(reward_model_path, device=str(device)) if reward_model_path else None
        self.prm = load_prm(prm_path, device=str(device)) if prm_path else None
        self.prm_weight = prm_weight
        self.layout = layout
        self.normalise = normalise
        if prm_shaping not in PRM_SHAPINGS:
            raise ValueError(f"prm_shaping must be one of {', '.join(PRM_SHAPINGS)}, got {prm_shaping!r}")
        self.prm_shaping = prm_shaping
        self.moments = RunningMoments()
        self.prm_moments = RunningMoments()  # of P(good) over every step scored, for prm_shaping="centred"

    def __call__(self, episodes: Sequence[Episode]) -> tuple[list[list[float]], dict[str, float]]:
        """Each episode's per-turn rewards (KL not included) and the raw figures to log."""
        tools = [episode.tools or None for episode in episodes]
        rewards = [[0.0] * episode.length for episode in episodes]
        figures: dict[str, float] = {}
        if self.reward_model is not None:
            inputs = [reward_model_inputs(episode, self.layout) for episode in episodes]
            scores, _ = self.reward_model.score(
                [prompt for prompt, _ in inputs], [completion for _, completion in inputs], tools
            )
            self.moments.update(scores)
            for turns, score in zip(rewards, scores, strict=True):
                turns[-1] += self.moments.normalise(score) if self.normalise else score
            figures["reward_model_score"] = sum(scores) / len(scores)
        if self.prm is not None:
            step_scores = self.prm.conversation_scores([prm_messages(episode) for episode in episodes], tools)
            for good, episode in zip(step_scores, episodes, strict=True):
                for index, step in enumerate(episode.steps):
                    # A turn with no text and no tool call did nothing; the PRM never saw one in training.
                    good[index] = 0.0 if _empty_turn(step.message) else good[index]
            flat = [probability for good in step_scores for probability in good]
            self.prm_moments.update(flat)
            baseline = self.prm_moments.mean if self.prm_shaping == "centred" else 0.5
            ceiling = 0.0 if self.prm_shaping == "penalty" else math.inf
            for turns, good in zip(rewards, step_scores, strict=True):
                for index, probability in enumerate(good):
                    turns[index] += self.prm_weight * min(probability - baseline, ceiling)
            figures["prm_good_share"] = sum(probability >= 0.5 for probability in flat) / len(flat)
            figures["prm_mean"] = self.prm_moments.mean
        return rewards, figures


def oracle_rewards(episodes: Sequence[Episode]) -> list[list[float]]:
    """The environment's own per-step rewards."""
    return [[step.reward for step in episode.steps] for episode in episodes]


def charge_invalid_turns(rewards: list[list[float]], episodes: Sequence[Episode], penalty: float) -> int:
    """Subtract `penalty` from each turn the environment flagged invalid (``info["invalid"]``), in place; returns how
    many turns were flagged. Environments that flag nothing are left as they are."""
    flagged = 0
    for turns, episode in zip(rewards, episodes, strict=True):
        for index, step in enumerate(episode.steps):
            if step.info.get("invalid"):
                turns[index] -= penalty
                flagged += 1
    return flagged


# --- advantages ----------------------------------------------------------------------------------------------------


def gae(
    rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float, last_value: float = 0.0
) -> tuple[list[float], list[float]]:
    """Generalised advantage estimation over one episode's turns: ``delta_t = r_t + gamma V_{t+1} - V_t`` and
    ``A_t = delta_t + gamma lam A_{t+1}``, with ``V_T = last_value`` (0 when the environment ended the episode).
    Returns (advantages, returns), returns being ``A_t + V_t``, the critic's targets."""
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards but {len(values)} values")
    advantages = [0.0] * len(rewards)
    following_value, following_advantage = last_value, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * following_value - values[t]
        following_advantage = delta + gamma * lam * following_advantage
        advantages[t] = following_advantage
        following_value = values[t]
    return advantages, [advantage + value for advantage, value in zip(advantages, values, strict=True)]


def whiten(values: Sequence[float]) -> list[float]:
    """Zero mean and unit standard deviation (left centred when the spread is nil)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((value - mean) ** 2 for value in values) / n)
    return [(value - mean) / (std + 1e-8) for value in values]


# --- the value critic ------------------------------------------------------------------------------------------------


@dataclass
class CriticWindow:
    episode: int  # index of the episode in the batch
    input_ids: list[int]
    positions: list[int]  # where each of `steps` is read in input_ids
    steps: list[int]


def load_critic(
    path: str, step_max_length: int, field_name: str, *, dtype: str = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A trainable value critic: the one in `path` when it is a per-step head (a `reward_models.value` run),
    otherwise the causal LM in `path` (the policy) with a fresh one-output head, reading the step's last token, in
    the conversational style when the tokenizer has a chat template. Its weights are loaded in `dtype` (bfloat16
    or float16 only for a critic whose base stays frozen under LoRA)."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

    from reward_models.common.config import ConfigError
    from reward_models.steps import prepare_tokenizer

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except OSError as exc:
        raise ConfigError(field_name, f"{path} is not a model directory ({exc})") from None
    is_head = hasattr(config, "step_max_length")
    if is_head and config.num_labels != 1:
        raise ConfigError(field_name, f"{path} has {config.num_labels} outputs; a value critic has one")
    model = AutoModelForTokenClassification.from_pretrained(
        path,
        local_files_only=True,
        num_labels=1,
        id2label={0: "value"},
        label2id={"value": 0},
        dtype=getattr(torch, dtype),
    )
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True))
    if not is_head:
        model.config.step_separator = ""
        model.config.step_max_length = step_max_length
        model.config.step_style = "conversational" if tokenizer.chat_template else "text"
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.use_cache = False
    return model, tokenizer


def critic_windows(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, trajectories: Sequence[tuple[str, Sequence[str]]]
) -> list[CriticWindow]:
    """Every trajectory's step windows from its `critic_texts` (`reward_models.steps.text_windows`, with the
    critic's own settings)."""
    from reward_models.steps import text_windows

    separator, max_length = model.config.step_separator, model.config.step_max_length
    return [
        CriticWindow(index, window.input_ids, window.positions, window.steps)
        for index, (prompt, pieces) in enumerate(trajectories)
        for window in text_windows(tokenizer, prompt, pieces, separator, max_length)
    ]


def episode_values(
    critic: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    episodes: Sequence[Episode],
    batch_size: int,
) -> tuple[list[list[float]], list[float], list[CriticWindow]]:
    """V before each turn of every episode; the value each episode's GAE bootstraps from after its last turn (V of
    the state after it for an episode the turn cap cut short, 0 for one the environment ended); and the windows the
    critic trains on, which read only the turns (the returns are its targets there). `critic` is the unwrapped
    model; its forward runs without gradients."""
    from reward_models.steps import step_style

    style = step_style(critic)
    trajectories = [
        critic_texts(tokenizer, episode.conversation(), episode.tools or None, style, after_last=episode.truncated)
        for episode in episodes
    ]
    windows = critic_windows(critic, tokenizer, trajectories)
    read = critic_values(
        critic,
        windows,
        [episode.length + int(episode.truncated) for episode in episodes],
        tokenizer.pad_token_id,
        batch_size,
    )
    values = [episode_read[: episode.length] for episode_read, episode in zip(read, episodes, strict=True)]
    last_values = [
        episode_read[episode.length] if episode.truncated else 0.0
        for episode_read, episode in zip(read, episodes, strict=True)
    ]
    training_windows = []
    for window in windows:
        kept = [k for k, step in enumerate(window.steps) if step < episodes[window.episode].length]
        if kept:
            positions, steps = [window.positions[k] for k in kept], [window.steps[k] for k in kept]
            training_windows.append(CriticWindow(window.episode, window.input_ids, positions, steps))
    return values, last_values, training_windows


def critic_forward(model: PreTrainedModel, windows: Sequence[CriticWindow], pad_token_id: int) -> torch.Tensor:
    """The critic's values at every read position of `windows`, in order (window by window), with gradients."""
    import torch

    device = next(model.parameters()).device
    input_ids, attention_mask = pad_right([window.input_ids for window in windows], pad_token_id)
    values = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits[..., 0].float()
    rows = torch.tensor([row for row, window in enumerate(windows) for _ in window.positions], device=device)
    columns = torch.tensor([position for window in windows for position in window.positions], device=device)
    return values[rows, columns]


def critic_values(
    model: PreTrainedModel,
    windows: Sequence[CriticWindow],
    lengths: Sequence[int],
    pad_token_id: int,
    batch_size: int,
) -> list[list[float]]:
    """V before each step of every episode (``lengths[i]`` steps for episode ``i``), without gradients."""
    import torch

    values = [[0.0] * length for length in lengths]
    with torch.no_grad():
        for first in range(0, len(windows), batch_size):
            chunk = windows[first : first + batch_size]
            read = critic_forward(model, chunk, pad_token_id).tolist()
            cursor = 0
            for window in chunk:
                for step in window.steps:
                    values[window.episode][step] = read[cursor]
                    cursor += 1
    return values
