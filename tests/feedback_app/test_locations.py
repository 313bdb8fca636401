"""A project loads models only from its own artifact folders and the admin's shared roots, and calls only the
endpoint hosts the admin allows. Each way a location gets in is tried: the API, the launch forms, the admin, the
management commands, and a row stored before the check (refused where it is used)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from feedback_app.models import Membership, PolicyVersion, Project, TrainingRun
from feedback_app.models.locations import LocationError, check_endpoint_url, check_model_path

pytestmark = pytest.mark.django_db

PUBLIC_IP = "93.184.216.34"


@pytest.fixture
def roots(settings, tmp_path):
    """ARTIFACT_ROOT in a temporary folder and no shared model roots: only project folders count."""
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    settings.TANDEM_SHARED_MODEL_ROOTS = []
    return settings.ARTIFACT_ROOT


@pytest.fixture
def other_project(gridworld_spec):
    return Project.objects.create(name="Other project", environment=gridworld_spec)


def _model_dir(root, *parts):
    path = root.joinpath(*parts)
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def own_dir(roots, project):
    return _model_dir(roots, "policies", str(project.pk), "dpo-run-1")


@pytest.fixture
def foreign_dir(roots, other_project):
    return _model_dir(roots, "models", str(other_project.pk), "reward_model-run-7")


def test_a_project_may_load_its_own_folders_and_the_shared_roots(settings, roots, project, own_dir, tmp_path):
    assert check_model_path(project.pk, str(own_dir)) == str(own_dir)
    judge = _model_dir(roots, "models", str(project.pk), "prm-run-2")
    assert check_model_path(project.pk, str(judge))
    shared = _model_dir(tmp_path, "shared", "qwen")
    with pytest.raises(LocationError, match="shared model roots"):
        check_model_path(project.pk, str(shared))
    settings.TANDEM_SHARED_MODEL_ROOTS = [str(tmp_path / "shared")]
    assert check_model_path(project.pk, str(shared))


@pytest.mark.parametrize("where", ["foreign", "etc", "missing", "dotdot", "symlink", "relative", "root"])
def test_every_other_path_is_refused(roots, project, own_dir, foreign_dir, tmp_path, where):
    own_folder = roots / "policies" / str(project.pk)
    link = own_folder / "innocent"
    link.symlink_to(foreign_dir)
    value = {
        "foreign": str(foreign_dir),
        "etc": "/etc",
        "missing": str(own_folder / "not-there"),
        "dotdot": f"{own_folder}/../../models/{foreign_dir.parent.name}/{foreign_dir.name}",
        "symlink": str(link),
        "relative": "var/artifacts/policies",
        "root": str(roots),
    }[where]
    with pytest.raises(LocationError):
        check_model_path(project.pk, value)


def test_endpoint_hosts_need_the_admins_allowlist(settings):
    settings.TANDEM_ENDPOINT_ALLOWLIST = []
    with pytest.raises(LocationError, match="TANDEM_ENDPOINT_ALLOWLIST"):
        check_endpoint_url(f"http://{PUBLIC_IP}/v1")
    settings.TANDEM_ENDPOINT_ALLOWLIST = ["*"]
    assert check_endpoint_url(f"https://{PUBLIC_IP}/v1")
    for internal in ("127.0.0.1:8000", "169.254.169.254", "10.1.2.3", "[::1]", "[fe80::1]", "0.0.0.0", "localhost"):
        with pytest.raises(LocationError):
            check_endpoint_url(f"http://{internal}/v1")
    for bad in ("ftp://example.com", "http://user:pw@" + PUBLIC_IP, "not a url", "http://:80", "http://x:99999"):
        with pytest.raises(LocationError):
            check_endpoint_url(bad)
    settings.TANDEM_ENDPOINT_ALLOWLIST = ["vllm", "10.0.0.0/8", "*.models.example"]
    assert check_endpoint_url("http://vllm:8000/v1")
    assert check_endpoint_url("http://10.1.2.3/v1")
    assert check_endpoint_url("https://a.models.example/v1")
    for refused in ("http://169.254.169.254/", "http://vllm2/v1", "http://models.example.evil/v1", "http://11.0.0.1"):
        with pytest.raises(LocationError):
            check_endpoint_url(refused)


# --- the ways in ---------------------------------------------------------------------------------------------------


def test_the_api_refuses_another_projects_weights_and_internal_endpoints(
    api_as, settings, project, researcher, own_dir, foreign_dir
):
    settings.TANDEM_ENDPOINT_ALLOWLIST = ["*"]
    client = api_as(researcher)
    url = f"/api/projects/{project.pk}/policy-versions/"
    stolen = client.post(url, {"name": "stolen", "kind": "local", "weights_path": str(foreign_dir)})
    assert stolen.status_code == 400 and "weights_path" in stolen.json()
    etc = client.post(url, {"name": "etc", "kind": "local", "weights_path": "/etc"})
    assert etc.status_code == 400 and "weights_path" in etc.json()
    metadata = client.post(
        url,
        {"name": "meta", "kind": "endpoint", "endpoint_url": "http://169.254.169.254/latest", "endpoint_model": "m"},
    )
    assert metadata.status_code == 400 and "endpoint_url" in metadata.json()
    mine = client.post(url, {"name": "mine", "kind": "local", "weights_path": str(own_dir)})
    assert mine.status_code == 201, mine.json()
    moved = client.patch(f"{url}{mine.json()['id']}/", {"weights_path": str(foreign_dir)})
    assert moved.status_code == 400 and "weights_path" in moved.json()
    assert PolicyVersion.objects.get(pk=mine.json()["id"]).weights_path == str(own_dir)


def test_a_judge_launch_refuses_another_projects_base_model(api_as, project, researcher, foreign_dir):
    from feedback_app.exports.filters import ExportFilters
    from feedback_app.exports.snapshots import create_snapshot

    snapshot = create_snapshot(project, "preference", ExportFilters(), user=researcher, name="empty")
    response = api_as(researcher).post(
        f"/api/projects/{project.pk}/runs/",
        {"kind": "reward_model", "snapshot": snapshot.pk, "base_model": str(foreign_dir)},
    )
    assert response.status_code == 400
    assert "base_model" in response.json()
    assert TrainingRun.objects.filter(project=project).count() == 0


def test_another_projects_registered_model_is_unknown_by_id(api_as, project, other_project, researcher, own_dir):
    from feedback_app.models import RegisteredModel

    run = TrainingRun.objects.create(project=other_project, kind="reward_model", config={})
    foreign = RegisteredModel.objects.create(
        project=other_project, name="rm", kind="reward_model", path="/x", run=run, base_model="/x"
    )
    PolicyVersion.objects.create(project=project, name="base", kind="local", weights_path=str(own_dir))
    response = api_as(researcher).post(
        f"/api/projects/{project.pk}/runs/", {"kind": "grpo", "judges": {"reward_model_path": foreign.pk}}
    )
    assert response.status_code == 400
    assert "judges" in response.json()
    assert api_as(researcher).get(f"/api/projects/{project.pk}/models/{foreign.pk}/").status_code == 404


def test_a_stored_row_pointing_elsewhere_is_refused_where_it_is_used(client, project, researcher, foreign_dir):
    from training.rollouts import RolloutConfig, create_rollout_run

    smuggled = PolicyVersion.objects.create(project=project, name="old", kind="local", weights_path=str(foreign_dir))
    with pytest.raises(LocationError):
        smuggled.policy_spec()
    with pytest.raises(LocationError):
        create_rollout_run(project, smuggled, RolloutConfig())
    client.force_login(researcher)
    response = client.post(
        reverse("training-launch", args=[project.pk]), {"kind": "rollout", "base_policy": smuggled.pk}
    )
    assert response.status_code == 400
    assert "outside this project" in response.content.decode()
    assert TrainingRun.objects.filter(project=project).count() == 0


def test_the_admin_refuses_a_path_outside_the_project(client, django_user_model, project, foreign_dir, own_dir):
    admin = django_user_model.objects.create_superuser("root", password="pw-root")
    Membership.objects.create(user=admin, project=project, role="admin")
    client.force_login(admin)
    url = reverse("admin:feedback_app_policyversion_add")
    form = {"project": project.pk, "name": "via-admin", "kind": "local", "generation": "{}", "notes": ""}
    refused = client.post(url, {**form, "weights_path": str(foreign_dir)})
    assert refused.status_code == 200  # the form again, with its error
    assert "outside this project" in refused.content.decode()
    assert not PolicyVersion.objects.filter(name="via-admin").exists()
    accepted = client.post(url, {**form, "weights_path": str(own_dir)})
    assert accepted.status_code == 302
    assert PolicyVersion.objects.filter(name="via-admin", weights_path=str(own_dir)).exists()


def test_a_bootstrapped_policy_lands_in_its_projects_folder(roots, project, settings):
    """The management commands name no paths: what they make lies in the project's own folder, where it loads."""
    from training.bootstrap import bootstrap_config

    config = bootstrap_config(TrainingRun(pk=5, project=project, config={}))
    assert config.output_dir == str(roots / "policies" / str(project.pk) / "bootstrap-run-5")


def test_the_migration_moves_an_old_bootstrap_policy_into_its_project(roots, project):
    import importlib

    from django.apps import apps

    old = _model_dir(roots, "policies", "bootstrap-run-3")
    version = PolicyVersion.objects.create(project=project, name="tiny-base", kind="local", weights_path=str(old))
    migration = importlib.import_module("feedback_app.migrations.0008_bootstrap_policies_in_project_folders")
    migration.move_bootstrap_policies(apps, None)
    version.refresh_from_db()
    moved = roots / "policies" / str(project.pk) / "bootstrap-run-3"
    assert version.weights_path == str(moved)
    assert (moved / "config.json").exists() and not old.exists()
    assert version.policy_spec()["path"] == str(moved)
