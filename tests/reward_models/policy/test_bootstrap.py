from __future__ import annotations

import json

import pytest
import torch

from reward_models.envs import GridWorld
from reward_models.policy.bootstrap import (
    BootstrapConfig,
    demonstrations,
    goal_reasoning,
    main,
    parse_args,
    vocabulary_corpus,
)
from reward_models.policy.turns import parse_decision


def load_weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def test_short_bootstrap_lowers_the_loss_and_writes_metrics(bootstrapped):
    policy_dir, metrics = bootstrapped
    assert metrics["final_loss"] < 0.6 * metrics["initial_loss"]
    assert 0.0 <= metrics["greedy_success"] <= 1.0 and 0.0 <= metrics["sampled_success"] <= 1.0
    assert metrics["train_steps"] == 60 and not metrics["stopped_by_time"]
    assert json.loads((policy_dir / "metrics.json").read_text())["greedy_success"] == metrics["greedy_success"]


def test_short_bootstrap_changes_every_weight_matrix(bootstrapped):
    from reward_models.policy.model import build_tiny_llama
    from reward_models.policy.tokenizer import build_word_tokenizer

    policy_dir, metrics = bootstrapped
    initial = build_tiny_llama(
        build_word_tokenizer(vocabulary_corpus(GridWorld())), seed=metrics["config"]["seed"]
    ).state_dict()
    trained = load_weights(policy_dir)
    for name, tensor in trained.items():
        assert not torch.equal(tensor, initial[name]), f"{name} did not change"


def test_bootstrap_is_deterministic_for_a_seed(tmp_path, short_bootstrap_config):
    tiny = {"n_episodes": 60, "max_train_steps": 6, "eval_tasks": 1, "batch_size": 16}
    first = main(short_bootstrap_config(tmp_path / "first", **tiny))
    second = main(short_bootstrap_config(tmp_path / "second", **tiny))
    first_weights, second_weights = load_weights(tmp_path / "first"), load_weights(tmp_path / "second")
    assert all(torch.equal(first_weights[name], second_weights[name]) for name in first_weights)
    for key in ("initial_loss", "final_loss", "greedy_success", "sampled_success"):
        assert first[key] == second[key]
    other_seed = main(short_bootstrap_config(tmp_path / "other", seed=8, **tiny))
    assert other_seed["initial_loss"] != first["initial_loss"]


def test_demonstrations_avoid_evaluation_seeds_and_follow_the_expert_without_noise():
    env = GridWorld()
    episodes, success = demonstrations(env, 50, noise=0.0, seed=0)
    assert success == 1.0
    assert not {e["task"]["seed"] for e in episodes} & set(env.eval_seeds())
    for episode in episodes:
        conversation = episode["conversation"]
        actions = [
            parse_decision(conversation.assistant(step)["content"])[1] for step in range(conversation.num_steps)
        ]
        assert env.oracle(episode["task"]).step_correct(actions) == [True] * len(actions)


def test_noisy_demonstrations_take_random_actions_at_about_the_noise_rate():
    env = GridWorld()
    episodes, _ = demonstrations(env, 300, noise=0.5, seed=0)
    correct = []
    for episode in episodes:
        conversation = episode["conversation"]
        actions = [
            parse_decision(conversation.assistant(step)["content"])[1] for step in range(conversation.num_steps)
        ]
        correct += env.oracle(episode["task"]).step_correct(actions)
    # A random move is optimal about a third of the time, so ~0.5 + 0.5 * 0.35 of moves are optimal.
    assert 0.55 < sum(correct) / len(correct) < 0.85


def test_goal_reasoning_states_the_offset_to_the_goal():
    assert goal_reasoning(". . G | . . . | A . .") == "goal is up 2 right 2"
    assert goal_reasoning("G . A | . . . | . . .") == "goal is down 0 left 2"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("noise", 1.5),
        ("grid_size", 2),
        ("n_episodes", 0),
        ("lr", 0.0),
        ("batch_size", 0),
        ("max_seconds", -1.0),
        ("history_window", -1),
        ("eval_temperature", 0.0),
        ("num_heads", 3),
    ],
)
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        BootstrapConfig(**{field: value})


def test_command_line_arguments_build_the_config(capsys):
    config = parse_args(["--seed", "3", "--noise", "0.2", "--output_dir", "out"])
    assert (config.seed, config.noise, config.output_dir) == (3, 0.2, "out")
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    shown = capsys.readouterr().out
    assert "--max_train_steps" in shown and "policy cut before its schedule ends is much worse" in " ".join(
        shown.split()
    )


def test_a_bootstrap_s_thread_count_holds_for_its_run_only():
    import torch

    from reward_models.policy.bootstrap import torch_threads

    before = torch.get_num_threads()
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(before + 2):
        raise RuntimeError("a failed run")
    assert torch.get_num_threads() == before
