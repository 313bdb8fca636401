"""Launch forms generated from the run kinds' config dataclasses: inputs, parsing, and what a posted form keeps."""

from __future__ import annotations

import pytest

from feedback_app.launch_forms.forms import LAUNCH_KINDS, config_from_form, run_form
from training.launch import LaunchError


def setting(kind: str, name: str):
    return next(s for s in run_form(kind).settings if s.name == name)


def test_each_setting_gets_the_input_its_type_needs():
    assert setting("reward_model", "use_margin").input == "checkbox"
    assert setting("reward_model", "max_steps").input == "int"
    assert setting("reward_model", "learning_rate").input == "float"
    assert setting("rollout", "split").input == "text"
    sources, task_ids = setting("sft", "sources"), setting("rollout", "task_ids")
    assert (sources.input, sources.item_type, task_ids.input, task_ids.item_type) == ("list", str, "list", int)


@pytest.mark.parametrize(
    ("kind", "name", "choices"),
    [
        ("reward_model", "ties", ("drop", "tie_loss")),
        ("reward_model", "layout", ("full", "decisions", "actions", "moves")),
        ("reward_model", "ensemble_mode", ("seed", "bootstrap")),
        ("reward_model", "precision", ("auto", "fp32", "bf16", "fp16")),
        ("preference_model", "layout", ("full", "decisions", "actions", "moves")),
        ("dpo", "balance", ("none", "action")),
        ("dpo", "precision", ("auto", "fp32", "bf16", "fp16")),
        ("ppo", "reward_source", ("model", "oracle")),
        ("ppo", "prm_shaping", ("penalty", "signed", "centred")),
        ("grpo", "algorithm", ("grpo", "rloo")),
    ],
)
def test_a_setting_with_a_fixed_set_of_values_is_a_choice_of_them(kind, name, choices):
    chosen = setting(kind, name)
    assert chosen.input == "choice" and set(chosen.choices) == set(choices)
    assert chosen.parse(choices[-1]) == choices[-1]
    with pytest.raises(ValueError, match=f"must be one of {', '.join(chosen.choices)}"):
        chosen.parse("actoin")


def test_inputs_parse_to_typed_values_or_say_what_is_wrong():
    assert setting("reward_model", "use_margin").parse("false") is False
    assert setting("reward_model", "max_steps").parse(" -1 ") == -1
    assert setting("reward_model", "learning_rate").parse("3e-5") == 3e-5
    assert setting("rollout", "task_ids").parse("4, 5,,6") == [4, 5, 6]
    assert setting("sft", "sources").parse("intervention,demonstration") == ["intervention", "demonstration"]
    with pytest.raises(ValueError, match="whole number"):
        setting("reward_model", "max_steps").parse("2.5")
    with pytest.raises(ValueError, match="finite"):
        setting("reward_model", "learning_rate").parse("nan")
    with pytest.raises(ValueError, match="whole numbers separated by commas"):
        setting("rollout", "task_ids").parse("4, five")
    with pytest.raises(ValueError, match="true or false"):
        setting("reward_model", "use_margin").parse("maybe")


def test_a_posted_form_keeps_only_what_differs_from_the_defaults():
    form = run_form("dpo")
    config, errors = config_from_form(
        form,
        {"config.beta": "0.5", "config.max_steps": "50", "config.use_lora": "false", "config.name": " dpo-1 "},
    )
    assert errors == {}
    assert config == {"max_steps": 50, "name": "dpo-1"}  # beta 0.5 and use_lora false are DPO's defaults
    config, errors = config_from_form(form, {"config.beta": "strong", "config.seed": "1"})
    assert errors == {"config.beta": "must be a number, not 'strong'"} and config == {"seed": 1}
    config, _ = config_from_form(run_form("rollout"), {"config.name": "a rollout names nothing"})
    assert config == {}


def test_only_the_dashboards_run_kinds_have_a_form():
    assert "bootstrap" not in LAUNCH_KINDS and "evaluation" not in LAUNCH_KINDS
    with pytest.raises(LaunchError) as raised:
        run_form("bootstrap")
    assert "kind" in raised.value.errors
