from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from feedback_app.models import EnvironmentSpec, Project, TrainingRun

pytestmark = pytest.mark.django_db


def test_it_names_an_unknown_project():
    with pytest.raises(CommandError, match="project: no project with slug 'nope'"):
        call_command("bootstrap_policy", "nope", "--name", "v0")


def test_it_refuses_a_name_already_taken(project, external_policy):
    with pytest.raises(CommandError, match="name: .* already has a policy version called 'agent-v1'"):
        call_command("bootstrap_policy", project.slug, "--name", "agent-v1")


def test_it_refuses_a_project_whose_environment_has_no_built_in_policy(db):
    spec = EnvironmentSpec.objects.create(name="web", dotted_path="my_agents.envs.Browser")
    other = Project.objects.create(name="Browser agent", environment=spec)
    with pytest.raises(
        CommandError, match=r"the bootstrap trains policies for .*GridWorld, .*ToolShop, not my_agents\.envs"
    ):
        call_command("bootstrap_policy", other.slug, "--name", "v0")
    assert not TrainingRun.objects.exists(), "nothing is half-written"


def test_bad_settings_fail_before_a_run_is_recorded(project):
    with pytest.raises(CommandError, match="noise must be between 0 and 1"):
        call_command("bootstrap_policy", project.slug, "--name", "v0", "--noise", "1.5")
    assert not TrainingRun.objects.exists()
