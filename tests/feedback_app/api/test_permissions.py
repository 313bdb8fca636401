"""Who may do what through the API. Outsiders get 404 and never a byte of a project's contents; annotators read
their project without outcomes and see only their own labels; researchers see everything in their projects;
admins alone change a project's settings."""

from __future__ import annotations

import pytest

from feedback_app.models import (
    Assignment,
    Comparison,
    Evaluation,
    QueueItem,
    Rating,
    TrainingRun,
)

pytestmark = pytest.mark.django_db

SECRET_INSTRUCTION = "reach the goal"  # the `task` fixture's instruction
SECRET_OBSERVATION = "obs 0"  # make_trajectory's first observation


@pytest.fixture
def world(project, task, annotator, other_annotator, researcher, make_trajectory):
    from datetime import timedelta

    from django.utils import timezone

    first = make_trajectory(n_steps=2, success=True, outcome_return=0.9, oracle={"correct": [1, 0]})
    second = make_trajectory(n_steps=2, success=False, outcome_return=0.1)
    mine = Comparison.objects.create(
        project=project, annotator=annotator, trajectory_a=first, trajectory_b=second, choice="a"
    )
    theirs = Comparison.objects.create(
        project=project, annotator=other_annotator, trajectory_a=first, trajectory_b=second, choice="b"
    )
    run = TrainingRun.objects.create(project=project, kind="rollout", base_policy=first.policy_version)
    evaluation = Evaluation.objects.create(project=project, policy_version=first.policy_version, name="x", value=0.5)
    gold = QueueItem.objects.create(
        project=project, kind="rating", trajectory=first, is_gold=True, gold_answer={"score": 5}, overlap=2
    )
    leased = timezone.now() + timedelta(minutes=30)
    my_assignment = Assignment.objects.create(item=gold, annotator=annotator, slot=0, leased_until=leased)
    their_assignment = Assignment.objects.create(item=gold, annotator=other_annotator, slot=1, leased_until=leased)
    return {
        "trajectory": first,
        "other_trajectory": second,
        "mine": mine,
        "theirs": theirs,
        "run": run,
        "evaluation": evaluation,
        "my_assignment": my_assignment,
        "their_assignment": their_assignment,
        "policy": first.policy_version,
    }


def _project_urls(project, world) -> list[str]:
    base = f"/api/projects/{project.pk}"
    return [
        f"{base}/",
        f"{base}/tasks/",
        f"{base}/tasks/{world['trajectory'].task_id}/",
        f"{base}/policy-versions/",
        f"{base}/policy-versions/{world['policy'].pk}/",
        f"{base}/trajectories/",
        f"{base}/trajectories/{world['trajectory'].pk}/",
        f"{base}/comparisons/",
        f"{base}/comparisons/{world['mine'].pk}/",
        f"{base}/step-labels/",
        f"{base}/critiques/",
        f"{base}/ratings/",
        f"{base}/interventions/",
        f"{base}/assignments/",
        f"{base}/assignments/{world['my_assignment'].pk}/",
        f"{base}/runs/",
        f"{base}/runs/{world['run'].pk}/",
        f"{base}/evaluations/",
        f"{base}/evaluations/{world['evaluation'].pk}/",
    ]


def test_an_outsider_gets_404_and_no_contents_for_everything_in_a_project(
    project, world, outsider, api_as, token_client
):
    for client in (api_as(outsider), token_client(outsider), token_client(outsider, read_only=True)):
        for url in _project_urls(project, world):
            response = client.get(url)
            assert response.status_code == 404, url
            assert SECRET_INSTRUCTION not in response.content.decode()
            assert SECRET_OBSERVATION not in response.content.decode()
            assert project.name not in response.content.decode()


def test_an_outsider_gets_404_when_writing_into_a_project(project, world, outsider, api_as):
    client = api_as(outsider)
    base = f"/api/projects/{project.pk}"
    trajectory = world["trajectory"]
    attempts = [
        ("post", f"{base}/tasks/", {"instruction": "x"}),
        ("post", f"{base}/comparisons/", {"trajectory_a": trajectory.pk, "trajectory_b": trajectory.pk + 1}),
        ("post", f"{base}/ratings/", {"trajectory": trajectory.pk, "score": 3}),
        ("patch", f"{base}/comparisons/{world['mine'].pk}/", {"choice": "b"}),
        ("patch", f"{base}/", {"name": "taken over"}),
        ("delete", f"{base}/", None),
        ("post", f"{base}/runs/", {"policy_version": world["policy"].pk}),
    ]
    for method, url, body in attempts:
        response = getattr(client, method)(url, body, format="json")
        assert response.status_code == 404, (method, url, response.status_code)
    response = client.post(f"{base}/trajectories/import", b"{}", content_type="application/x-ndjson")
    assert response.status_code == 404
    assert not Rating.objects.exists()
    assert Comparison.objects.get(pk=world["mine"].pk).is_current


def test_the_project_list_shows_only_my_projects(project, world, outsider, annotator, api_as):
    assert api_as(outsider).get("/api/projects/").json()["results"] == []
    rows = api_as(annotator).get("/api/projects/").json()["results"]
    assert [(row["id"], row["role"]) for row in rows] == [(project.pk, "annotator")]


def test_an_annotator_reads_trajectories_without_outcomes_or_policy_names(project, world, annotator, api_as):
    client = api_as(annotator)
    trajectory = world["trajectory"]
    listed = client.get(f"/api/projects/{project.pk}/trajectories/").json()["results"]
    detail = client.get(f"/api/projects/{project.pk}/trajectories/{trajectory.pk}/").json()
    hidden = {"success", "outcome_return", "oracle", "total_env_reward", "metadata", "policy_version", "policy_name"}
    for row in [*listed, detail]:
        assert hidden.isdisjoint(row), hidden & set(row)
    assert [step["observation"] for step in detail["steps"]] == ["obs 0", "obs 1"]
    assert all("env_reward" not in step and "logprob" not in step for step in detail["steps"])
    assert "agent-v1" not in client.get(f"/api/projects/{project.pk}/trajectories/{trajectory.pk}/").content.decode()


def test_in_a_project_that_is_not_blind_an_annotator_sees_policy_names_but_not_outcomes(
    project, world, annotator, api_as
):
    project.blind = False
    project.save()
    client = api_as(annotator)
    detail = client.get(f"/api/projects/{project.pk}/trajectories/{world['trajectory'].pk}/").json()
    assert detail["policy_name"] == "agent-v1"
    assert "success" not in detail and "oracle" not in detail
    assert client.get(f"/api/projects/{project.pk}/policy-versions/").status_code == 200


def test_an_annotator_may_not_filter_by_outcome_or_by_policy_in_a_blind_project(project, world, annotator, api_as):
    client = api_as(annotator)
    base = f"/api/projects/{project.pk}/trajectories/"
    assert client.get(base + "?success=true").status_code == 400
    assert client.get(base + f"?policy_version={world['policy'].pk}").status_code == 400


def test_a_researcher_sees_outcomes_and_may_filter_by_them(project, world, researcher, api_as):
    client = api_as(researcher)
    detail = client.get(f"/api/projects/{project.pk}/trajectories/{world['trajectory'].pk}/").json()
    assert (detail["success"], detail["outcome_return"], detail["oracle"]) == (True, 0.9, {"correct": [1, 0]})
    assert detail["policy_name"] == "agent-v1"
    assert "env_reward" in detail["steps"][0]
    rows = client.get(f"/api/projects/{project.pk}/trajectories/?success=false").json()["results"]
    assert [row["id"] for row in rows] == [world["other_trajectory"].pk]


@pytest.mark.parametrize(
    "path",
    ["runs/", "evaluations/", "policy-versions/"],
)
def test_an_annotator_gets_403_for_researcher_resources(project, world, annotator, api_as, path):
    response = api_as(annotator).get(f"/api/projects/{project.pk}/{path}")
    assert response.status_code == 403
    assert "rollout" not in response.content.decode()


def test_an_annotator_may_not_create_tasks_import_or_launch(project, world, annotator, api_as):
    client = api_as(annotator)
    base = f"/api/projects/{project.pk}"
    assert client.post(f"{base}/tasks/", {"instruction": "x"}, format="json").status_code == 403
    assert client.post(f"{base}/runs/", {"policy_version": world["policy"].pk}, format="json").status_code == 403
    for path in ("trajectories/import", "preferences/import"):
        response = client.post(f"{base}/{path}", b"", content_type="application/x-ndjson")
        assert response.status_code == 403, path
    trajectory_row = {"external_id": "x", "task": {"instruction": "t"}, "steps": [{"action": "up"}]}
    assert client.post(f"{base}/trajectories/", trajectory_row, format="json").status_code == 403


def test_an_annotator_sees_only_their_own_labels(project, world, annotator, api_as):
    client = api_as(annotator)
    rows = client.get(f"/api/projects/{project.pk}/comparisons/").json()["results"]
    assert [row["id"] for row in rows] == [world["mine"].pk]
    assert client.get(f"/api/projects/{project.pk}/comparisons/{world['theirs'].pk}/").status_code == 404
    response = client.patch(f"/api/projects/{project.pk}/comparisons/{world['theirs'].pk}/", {"choice": "a"})
    assert response.status_code == 404
    assert Comparison.objects.get(pk=world["theirs"].pk).is_current


def test_a_researcher_sees_every_label_but_may_not_revise_someone_elses(project, world, researcher, api_as):
    client = api_as(researcher)
    rows = client.get(f"/api/projects/{project.pk}/comparisons/").json()["results"]
    assert {row["id"] for row in rows} == {world["mine"].pk, world["theirs"].pk}
    response = client.patch(
        f"/api/projects/{project.pk}/comparisons/{world['mine'].pk}/", {"choice": "tie"}, format="json"
    )
    assert response.status_code == 403
    assert Comparison.objects.filter(trajectory_a=world["trajectory"]).count() == 2


def test_an_annotator_sees_only_their_own_assignments_and_not_which_items_are_gold(
    project, world, annotator, researcher, api_as
):
    rows = api_as(annotator).get(f"/api/projects/{project.pk}/assignments/").json()["results"]
    assert [row["id"] for row in rows] == [world["my_assignment"].pk]
    assert "is_gold" not in rows[0]["item"] and "gold_answer" not in rows[0]["item"]
    assert (
        api_as(annotator).get(f"/api/projects/{project.pk}/assignments/{world['their_assignment'].pk}/").status_code
        == 404
    )
    everyone = api_as(researcher).get(f"/api/projects/{project.pk}/assignments/").json()["results"]
    assert {row["id"] for row in everyone} == {world["my_assignment"].pk, world["their_assignment"].pk}
    assert everyone[0]["item"]["is_gold"] is True


def test_only_an_admin_may_change_or_delete_a_project(project, world, researcher, admin_member, api_as):
    url = f"/api/projects/{project.pk}/"
    assert api_as(researcher).patch(url, {"guidelines": "new"}, format="json").status_code == 403
    assert api_as(researcher).delete(url).status_code == 403
    response = api_as(admin_member).patch(url, {"guidelines": "new"}, format="json")
    assert response.status_code == 200 and response.json()["guidelines"] == "new"


def test_a_read_only_token_keeps_the_users_role_boundaries(project, world, annotator, token_client):
    client = token_client(annotator, read_only=True)
    assert client.get(f"/api/projects/{project.pk}/runs/").status_code == 403
    rows = client.get(f"/api/projects/{project.pk}/comparisons/").json()["results"]
    assert [row["id"] for row in rows] == [world["mine"].pk]
    response = client.post(
        f"/api/projects/{project.pk}/ratings/", {"trajectory": world["trajectory"].pk, "score": 4}, format="json"
    )
    assert response.status_code == 403 and "read-only" in response.json()["detail"]
