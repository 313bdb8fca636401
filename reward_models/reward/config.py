"""The reward model's settings (`RewardConfig`) and the layout of its run directory (see `reward_models.reward`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from reward_models.common.config import choice, require
from reward_models.common.judge_config import JudgeConfig
from reward_models.policy.turns import JUDGE_LAYOUTS

KIND = "reward_model"
MEMBERS_DIR = "members"
MEMBER_FILE = "tandem_member.json"
# Written into the checkpoint folder: which ensemble member its checkpoints belong to.
CHECKPOINT_OWNER_FILE = "tandem_member.json"
TIE_MODES = ("drop", "tie_loss")
# What the model reads of a trajectory: `reward_models.policy.turns.JUDGE_LAYOUTS` says what each layout keeps.
LAYOUTS = JUDGE_LAYOUTS
ENSEMBLE_MODES = ("seed", "bootstrap")
# Members are centred on their mean reward over at most this many training completions.
CENTRING_SAMPLE = 256


@dataclass
class RewardConfig(JudgeConfig):
    # Labels
    use_margin: bool = field(
        default=True,
        metadata={"help": "Ask for r(chosen) - r(rejected) > the row's margin (its strength: 0, 0.5 or 1)."},
    )
    ties: str = choice(
        "drop", TIE_MODES, "Tie rows: drop them, or tie_loss (Bradley-Terry with target 1/2, pulling r_a to r_b)."
    )

    layout: str = choice(
        "full",
        LAYOUTS,
        "What the model reads: full, decisions, actions or moves (reward_models.policy.turns says what "
        "each keeps); scoring applies the same layout.",
    )

    # Ensemble
    ensemble_size: int = field(default=1, metadata={"help": "Members K; K > 1 gives each score an uncertainty."})
    ensemble_mode: str = choice(
        "seed", ENSEMBLE_MODES, "seed: members differ by seed; bootstrap: each also trains on a resample of the pairs."
    )

    # Memory and speed on large models
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Batches per optimiser step (effective batch = batch_size x this x GPUs)."}
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in the backward pass: less memory, ~30 % slower."}
    )

    # Evaluation
    ece_bins: int = field(default=10, metadata={"help": "Equal-width bins of the calibration error (ECE)."})

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.ensemble_size >= 1, "ensemble_size", "must be at least 1")
        require(self.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", "must be at least 1")
        require(self.ece_bins >= 1, "ece_bins", "must be at least 1")
