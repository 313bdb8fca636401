"""Choice settings: every config's base refuses a value outside a `choice` field's choices, naming the field, and
`config_errors` names every such field at once."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from reward_models.common.config import ConfigError, check_choices, choice, config_errors
from reward_models.finetune.ppo_config import PPOConfig
from reward_models.reward.config import RewardConfig


@dataclass
class Settings:
    mode: str = choice("fast", ("fast", "careful"), "How to go.")
    note: str = "free text"

    def __post_init__(self) -> None:
        check_choices(self)


def test_a_choice_field_keeps_its_default_choices_and_help_for_the_forms():
    (mode, note) = fields(Settings)
    assert Settings().mode == "fast"
    assert mode.metadata == {"choices": ("fast", "careful"), "help": "How to go."}
    assert "choices" not in note.metadata


def test_a_value_outside_the_choices_is_refused_with_the_field_and_the_choices():
    assert Settings(mode="careful").mode == "careful"
    with pytest.raises(ConfigError) as raised:
        Settings(mode="reckless")
    assert raised.value.field == "mode"
    assert str(raised.value) == "mode: must be one of fast, careful, not 'reckless'"


def test_the_judge_and_policy_bases_check_their_subclasses_choice_settings():
    with pytest.raises(ConfigError, match="ensemble_mode: must be one of seed, bootstrap, not 'bagging'"):
        RewardConfig(data_path="d", base_model="b", output_dir="o", ensemble_mode="bagging")
    errors = config_errors(
        PPOConfig, {"policy_path": "p", "reward_source": "oracle", "reward_layout": "sideways", "prm_shaping": "x"}
    )
    assert set(errors) == {"reward_layout", "prm_shaping"}
    assert errors["prm_shaping"].startswith("must be one of penalty, signed, centred")
