"""PPO's settings (`PPOConfig`): the judges that reward it, the KL penalty, GAE, the value critic, the clipped
update, the rollouts and the selection of the best policy. `reward_models.finetune.ppo` trains with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reward_models.common.config import choice, require
from reward_models.finetune.config import PolicyTrainConfig
from reward_models.finetune.ppo_rewards import PRM_SHAPINGS, REWARD_LAYOUTS

REWARD_SOURCES = ("model", "oracle")
# Rollout tasks of iteration i are the training seeds from ROLLOUT_SEEDS + i * rollouts_per_step up; the selection
# tasks start at SELECTION_SEEDS, so no selection task is ever rolled out in training.
ROLLOUT_SEEDS = 200_000
SELECTION_SEEDS = 900_000


@dataclass
class PPOConfig(PolicyTrainConfig):
    output_dir: str = field(default="var/policies/ppo", metadata={"help": "Where checkpoints and the policy go."})
    learning_rate: float = field(default=5e-5, metadata={"help": "The policy's learning rate (AdamW)."})
    max_steps: int = field(default=40, metadata={"help": "PPO iterations (each: rollouts, then ppo_epochs passes)."})
    batch_size: int = field(default=64, metadata={"help": "Turns per policy minibatch (one optimiser step)."})
    save_steps: int = field(
        default=5, metadata={"help": "Checkpoint (and score the policy on the selection tasks) every N iterations."}
    )
    logging_steps: int = field(default=1, metadata={"help": "Record metrics every this many iterations."})

    # Rewards
    reward_source: str = choice(
        "model",
        REWARD_SOURCES,
        "model: the reward model (+ PRM); oracle: the environment's true reward (upper bound).",
    )
    reward_model_path: str = field(
        default="",
        metadata={"help": "A reward model directory (reward_models.reward); optional when a PRM alone is the judge."},
    )
    reward_layout: str = choice(
        "full",
        REWARD_LAYOUTS,
        "How PPO hands a trajectory to the reward model: full (the preference export), decisions, "
        "actions or moves; the reward model then applies the layout it was trained in.",
    )
    prm_path: str = field(
        default="",
        metadata={
            "help": "A process reward model directory: shaping beside the reward model, or the only judge (then "
            "prm_shaping signed or centred, since penalty alone never pays for a good step)."
        },
    )
    prm_weight: float = field(default=0.5, metadata={"help": "Weight of the PRM's shaping on each turn."})
    prm_shaping: str = choice(
        "penalty",
        PRM_SHAPINGS,
        "penalty: min(P(good) - 0.5, 0), a charge for bad steps only (no reward for length); signed: "
        "P(good) - 0.5 (a PRM that finds most steps good pays for longer episodes); centred: P(good) minus its "
        "running mean.",
    )
    invalid_penalty: float = field(
        default=0.1,
        metadata={
            "help": "With the model reward source, charged on each turn the environment flags invalid "
            "(info['invalid'], the gridworld's unparsable action): a format check no judge has to learn, and one the "
            "policy cannot talk its way past. The oracle source keeps the environment's reward as it is."
        },
    )
    normalize_reward: bool = field(
        default=True, metadata={"help": "Scale reward-model scores by their running mean and standard deviation."}
    )
    kl_beta: float = field(default=0.02, metadata={"help": "KL penalty to the reference policy, per turn."})
    kl_target: float = field(
        default=0.0, metadata={"help": "Adapt kl_beta towards this per-turn KL (0: keep kl_beta fixed)."}
    )
    kl_horizon: int = field(default=2000, metadata={"help": "Episodes over which the adaptive KL coefficient moves."})

    # Advantages and the critic
    gamma: float = field(default=1.0, metadata={"help": "Discount per turn."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda."})
    whiten_advantages: bool = field(default=True, metadata={"help": "Whiten advantages over each iteration's turns."})
    value_critic_path: str = field(
        default="",
        metadata={"help": "A value critic (reward_models.value) to start from; empty: the policy with a new head."},
    )
    critic_learning_rate: float = field(default=1e-3, metadata={"help": "The critic's learning rate (AdamW)."})
    critic_batch_size: int = field(default=16, metadata={"help": "Critic step windows per optimiser step."})
    critic_max_length: int = field(
        default=256, metadata={"help": "Longest critic window in tokens, for a new critic (a trained one keeps its)."}
    )

    # PPO
    clip_range: float = field(default=0.2, metadata={"help": "Clip of the probability ratio."})
    value_clip: float = field(default=0.2, metadata={"help": "Clip of the value change from the rollout's values."})
    ppo_epochs: int = field(default=2, metadata={"help": "Passes over each iteration's turns."})
    entropy_coef: float = field(default=0.0, metadata={"help": "Entropy bonus on the completion tokens."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clip (policy and critic)."})
    rollouts_per_step: int = field(default=32, metadata={"help": "Episodes per iteration."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of the rollouts."})
    max_turns: int = field(default=100, metadata={"help": "Cap on turns per episode (the environment's comes first)."})
    max_prompt_tokens: int = field(
        default=4096,
        metadata={
            "help": "Longer prompts are cut to this many tokens, in the rollouts and the update alike: the system "
            "turn stays and the oldest turns go first (0: never cut)."
        },
    )

    # Selection
    selection_tasks: int = field(
        default=64,
        metadata={
            "help": "Training tasks (never rolled out) scoring the policy at each checkpoint (0: keep the last)."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.reward_source == "oracle" or bool(self.reward_model_path or self.prm_path),
            "reward_model_path",
            "is required unless reward_source is oracle or a prm_path is given",
        )
        for name in ("reward_model_path", "prm_path", "value_critic_path"):
            path = getattr(self, name)
            require(not path or Path(path).is_dir(), name, f"no such directory: {path}")
        require(self.prm_weight >= 0, "prm_weight", "must be 0 or positive")
        require(self.invalid_penalty >= 0, "invalid_penalty", "must be 0 or positive")
        require(
            self.reward_source == "oracle" or bool(self.reward_model_path) or self.prm_shaping != "penalty",
            "prm_shaping",
            "a PRM alone needs signed or centred: penalty never pays for a good step",
        )
        require(self.kl_beta >= 0, "kl_beta", "must be 0 or positive")
        require(self.kl_target >= 0, "kl_target", "must be 0 (fixed kl_beta) or positive")
        require(self.kl_horizon > 0, "kl_horizon", "must be positive")
        require(0.0 <= self.gamma <= 1.0, "gamma", "must be between 0 and 1")
        require(0.0 <= self.lam <= 1.0, "lam", "must be between 0 and 1")
        require(0 < self.critic_learning_rate < 1, "critic_learning_rate", "must be between 0 and 1")
        for name in ("critic_batch_size", "ppo_epochs", "rollouts_per_step", "max_turns"):
            require(getattr(self, name) > 0, name, "must be positive")
        require(self.critic_max_length >= 8, "critic_max_length", "must be at least 8")
        require(self.clip_range > 0, "clip_range", "must be positive")
        require(self.value_clip > 0, "value_clip", "must be positive")
        require(self.entropy_coef >= 0, "entropy_coef", "must be 0 or positive")
        require(self.max_grad_norm > 0, "max_grad_norm", "must be positive")
        require(self.temperature > 0, "temperature", "must be positive")
        require(self.max_prompt_tokens >= 0, "max_prompt_tokens", "must be 0 (never cut) or positive")
        require(self.selection_tasks >= 0, "selection_tasks", "must be 0 (keep the last policy) or positive")
        require(
            ROLLOUT_SEEDS + self.max_steps * self.rollouts_per_step <= SELECTION_SEEDS,
            "max_steps",
            f"times rollouts_per_step must stay below {SELECTION_SEEDS - ROLLOUT_SEEDS} tasks",
        )
