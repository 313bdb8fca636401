"""Policy fine-tuning runs through Tandem: snapshot or judge models -> run -> a new policy version with its lineage
and evaluations -> its review rollout queued; and the launch checks in front of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.snapshots import create_snapshot
from feedback_app.models import (
    Evaluation,
    PolicyVersion,
    RegisteredModel,
    RunKind,
    RunStatus,
    TrainingRun,
)
from feedback_app.models.trajectories import TaskSplit
from training.launch_checks import LaunchError
from training.policy_runs import TRAINERS, create_policy_run, policy_config, run_policy_training
from training.runs import RunRecorder, execute_run

pytestmark = pytest.mark.django_db

QUICK_SFT = {"max_steps": 4, "batch_size": 8, "save_steps": 2, "logging_steps": 1, "eval_tasks": 4}


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    return settings.ARTIFACT_ROOT


@pytest.fixture
def sft_snapshot(project, researcher, demonstrations):
    return create_snapshot(project, "sft", ExportFilters(), user=researcher, name="demos")


def _finish(run: TrainingRun) -> TrainingRun:
    execute_run(run.pk, run_policy_training, lambda pk: RunRecorder(pk, check_interval=0.0))
    run.refresh_from_db()
    return run


def test_an_sft_run_registers_a_child_version_with_evaluations_and_queues_its_review(
    project, researcher, tiny_policy, sft_snapshot, review_tasks
):
    run = create_policy_run(
        project, "sft", snapshot=sft_snapshot, config={**QUICK_SFT, "name": "tiny-sft"}, created_by=researcher
    )
    assert run.base_policy == tiny_policy and run.inputs["review"]["enabled"] is True

    run = _finish(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.progress_current == run.progress_total == 4
    version = PolicyVersion.objects.get(produced_by=run)
    assert (version.name, version.parent, version.kind) == ("tiny-sft", tiny_policy, "local")
    assert version.weights_path == run.artifact_dir and Path(version.weights_path, "config.json").is_file()
    assert not Path(version.weights_path, "checkpoints").exists()
    figures = {(e.policy_version_id, e.decoding): e for e in Evaluation.objects.filter(run=run)}
    assert set(figures) == {(p.pk, d) for p in (tiny_policy, version) for d in ("greedy", "sampled")}
    assert all(e.name == "heldout_success" and e.n == 4 and 0 <= e.value <= 1 for e in figures.values())
    assert figures[(version.pk, "greedy")].value == run.summary["metrics"]["final"]["greedy_success"]

    review = TrainingRun.objects.get(pk=run.summary["review_run"])
    assert (review.kind, review.base_policy, review.status) == (RunKind.ROLLOUT, version, RunStatus.QUEUED)
    assert review.config["compare_with_parent"] is True and review.config["split"] == TaskSplit.REVIEW
    assert review.inputs == {"review_of": run.pk}

    # The version loads as a policy and plays.
    from reward_models.policy.local import LocalCausalLMPolicy

    assert LocalCausalLMPolicy(version.weights_path).history_window == 0


def test_finishing_a_run_twice_registers_one_version_and_one_review(project, tiny_policy, sft_snapshot, review_tasks):
    run = _finish(create_policy_run(project, "sft", snapshot=sft_snapshot, config=QUICK_SFT))
    TrainingRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)  # died before it was marked done

    run = _finish(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert PolicyVersion.objects.filter(produced_by=run).count() == 1
    assert TrainingRun.objects.filter(kind=RunKind.ROLLOUT, inputs__review_of=run.pk).count() == 1
    assert Evaluation.objects.filter(run=run).count() == 4


def test_review_can_be_turned_off_per_run(project, tiny_policy, sft_snapshot, review_tasks):
    run = _finish(
        create_policy_run(project, "sft", snapshot=sft_snapshot, config=QUICK_SFT, review={"enabled": False})
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.summary["review_run"] is None
    assert not TrainingRun.objects.filter(kind=RunKind.ROLLOUT).exists()


def test_a_launch_names_each_bad_field_and_stores_nothing(project, tiny_policy, sft_snapshot, external_policy):
    cases = [
        ({"kind": "sft"}, "snapshot"),
        ({"kind": "sft", "snapshot": sft_snapshot, "base_policy": external_policy}, "base_policy"),
        ({"kind": "ppo", "snapshot": sft_snapshot}, "snapshot"),
        ({"kind": "dpo", "snapshot": sft_snapshot}, "snapshot"),
        ({"kind": "grpo"}, "judges.reward_model_path"),
        ({"kind": "nash_md"}, "judges.preference_model_path"),
        ({"kind": "sft", "snapshot": sft_snapshot, "config": {"learning_rate": 3}}, "config.learning_rate"),
        ({"kind": "sft", "snapshot": sft_snapshot, "config": {"warp": 1}}, "config.warp"),
        ({"kind": "sft", "snapshot": sft_snapshot, "config": {"policy_path": "/x"}}, "config.policy_path"),
        ({"kind": "dpo", "snapshot": sft_snapshot, "config": {"level": "step"}}, "snapshot"),
        ({"kind": "sft", "snapshot": sft_snapshot, "config": {"name": "tiny"}}, "config.name"),
        ({"kind": "sft", "snapshot": sft_snapshot, "review": {"num_tasks": 0}}, "review.num_tasks"),
        ({"kind": "sft", "snapshot": sft_snapshot, "review": {"enabled": "yes"}}, "review.enabled"),
        ({"kind": "sft", "snapshot": sft_snapshot, "review": {"when": 1}}, "review.when"),
        ({"kind": "evaluate"}, "kind"),
    ]
    for launch, field in cases:
        kind = launch.pop("kind")
        with pytest.raises(LaunchError) as raised:
            create_policy_run(project, kind, **launch)
        assert field in raised.value.errors, (kind, launch, raised.value.errors)
    assert not TrainingRun.objects.exists()


def test_a_judge_model_of_the_wrong_kind_is_refused_by_setting(project, tiny_policy):
    judge_run = TrainingRun.objects.create(project=project, kind="prm", status=RunStatus.SUCCEEDED)
    prm = RegisteredModel.objects.create(project=project, name="prm", kind="prm", path="/m", run=judge_run)
    with pytest.raises(LaunchError) as raised:
        create_policy_run(project, "ppo", judges={"reward_model_path": prm, "critic": prm})
    assert raised.value.errors == {
        "judges.reward_model_path": "is a prm, not a reward_model",
        "judges.critic": "a ppo run takes no 'critic' judge model (it takes: reward_model_path, prm_path, "
        "value_critic_path)",
    }


def test_tandem_fills_in_the_policy_data_environment_and_judges(project, tiny_policy, sft_snapshot, tmp_path):
    project.environment.config = {"size": 6}
    project.environment.save()
    run = create_policy_run(project, "sft", snapshot=sft_snapshot, config={"max_steps": 3})
    config = policy_config(run)
    assert config.policy_path == tiny_policy.weights_path
    assert config.snapshot_hash == sft_snapshot.content_hash and Path(config.data_path).is_file()
    assert config.environment == "reward_models.envs.gridworld.GridWorld"
    assert config.environment_config == {"size": 6}
    assert config.output_dir.endswith(f"sft-run-{run.pk}") and config.max_steps == 3


def test_every_trainer_names_a_config_and_its_judge_settings():
    from reward_models.finetune.config import PolicyTrainConfig

    assert set(TRAINERS) == {"dpo", "kto", "sft", "ppo", "nash_md", "spo", "grpo"}
    for kind, trainer in TRAINERS.items():
        config_class, main = trainer.config_class, trainer.main
        assert issubclass(config_class, PolicyTrainConfig) and callable(main), kind
        for setting in [*trainer.judge_inputs, *trainer.implied]:
            assert setting in config_class.__dataclass_fields__, (kind, setting)
        for implied in trainer.export_kinds.values():
            assert set(implied) <= set(config_class.__dataclass_fields__), kind
