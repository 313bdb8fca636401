"""CRUD through the API: projects, tasks, policy versions, trajectories, every label kind (append-only, with
revisions and idempotent retries), assignments, runs and evaluations; cursor pagination and throttling."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from feedback_app.models import (
    Assignment,
    Comparison,
    Critique,
    Evaluation,
    Intervention,
    Membership,
    PolicyVersion,
    Project,
    QueueItem,
    Rating,
    StepLabel,
    Task,
    TrainingRun,
    Trajectory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def pair(make_trajectory):
    return make_trajectory(n_steps=2), make_trajectory(n_steps=2)


def _url(project, path: str) -> str:
    return f"/api/projects/{project.pk}/{path}"


# --- Projects, tasks, policy versions -----------------------------------------------------------------------------


def test_a_researcher_creates_a_project_and_becomes_its_admin(researcher, gridworld_spec, api_as):
    response = api_as(researcher).post(
        "/api/projects/", {"name": "Flight booking", "environment": gridworld_spec.name}, format="json"
    )
    assert response.status_code == 201, response.json()
    created = Project.objects.get(pk=response.json()["id"])
    assert created.slug == "flight-booking"
    assert Membership.objects.get(project=created, user=researcher).role == "admin"
    again = api_as(researcher).post("/api/projects/", {"name": "Flight Booking", "environment": gridworld_spec.name})
    assert again.status_code == 400 and "slug" in again.json()["name"][0]


def test_an_annotator_only_user_may_not_create_projects(annotator, gridworld_spec, api_as):
    response = api_as(annotator).post("/api/projects/", {"name": "Mine", "environment": gridworld_spec.name})
    assert response.status_code == 403
    assert not Project.objects.filter(name="Mine").exists()


def test_bad_project_settings_are_refused_with_the_field_named(project, admin_member, api_as):
    response = api_as(admin_member).patch(
        _url(project, ""), {"feedback_kinds": ["comparison", "vibes"], "gold_fraction": 2}, format="json"
    )
    assert response.status_code == 400
    assert set(response.json()) == {"feedback_kinds", "gold_fraction"}


def test_an_admin_deletes_a_project_only_while_it_holds_no_trajectories(project, task, pair, admin_member, api_as):
    client = api_as(admin_member)
    response = client.delete(_url(project, ""))
    assert response.status_code == 409 and "still used" in response.json()["detail"]
    assert Trajectory.objects.count() == 2
    Trajectory.objects.all().delete()
    assert client.delete(_url(project, "")).status_code == 204
    assert not Project.objects.filter(pk=project.pk).exists() and not Task.objects.exists()


def test_tasks_are_created_changed_and_deleted_by_researchers(project, researcher, api_as):
    client = api_as(researcher)
    response = client.post(_url(project, "tasks/"), {"instruction": "go left", "seed": 11, "split": "review"})
    assert response.status_code == 201
    task_id = response.json()["id"]
    clash = client.post(_url(project, "tasks/"), {"instruction": "again", "seed": 11}, format="json")
    assert clash.status_code == 400 and "seed" in clash.json()
    assert client.patch(_url(project, f"tasks/{task_id}/"), {"instruction": "go right"}).json()["instruction"] == (
        "go right"
    )
    assert client.get(_url(project, "tasks/?split=review")).json()["results"][0]["id"] == task_id
    assert client.delete(_url(project, f"tasks/{task_id}/")).status_code == 204


def test_a_task_with_trajectories_is_not_deleted(project, task, make_trajectory, researcher, api_as):
    make_trajectory()
    response = api_as(researcher).delete(_url(project, f"tasks/{task.pk}/"))
    assert response.status_code == 409 and "still used" in response.json()["detail"]
    assert Task.objects.filter(pk=task.pk).exists()


def test_policy_versions_are_validated_like_the_model(project, gridworld_spec, researcher, api_as):
    client = api_as(researcher)
    response = client.post(_url(project, "policy-versions/"), {"name": "v1", "kind": "local"}, format="json")
    assert response.status_code == 400 and "weights_path" in response.json()
    other = Project.objects.create(name="Other", environment=gridworld_spec)
    foreign = PolicyVersion.objects.create(project=other, name="theirs", kind="external")
    response = client.post(
        _url(project, "policy-versions/"), {"name": "v1", "kind": "external", "parent": foreign.pk}, format="json"
    )
    assert response.status_code == 400 and "parent" in response.json()
    response = client.post(_url(project, "policy-versions/"), {"name": "v1", "kind": "external"}, format="json")
    assert response.status_code == 201
    assert client.post(_url(project, "policy-versions/"), {"name": "v1", "kind": "external"}).status_code == 400


def test_a_policy_version_with_trajectories_is_not_deleted(
    project, make_trajectory, external_policy, researcher, api_as
):
    make_trajectory()
    assert api_as(researcher).delete(_url(project, f"policy-versions/{external_policy.pk}/")).status_code == 409


# --- Trajectories and pagination ----------------------------------------------------------------------------------


def test_a_researcher_adds_one_trajectory_and_a_retry_returns_it(project, researcher, api_as):
    row = {
        "external_id": "ep-1",
        "task": {"external_id": "t-1", "instruction": "book"},
        "policy": "agent-x",
        "steps": [{"observation": "home", "action": "search"}, {"observation": "results", "action": "book"}],
        "outcome": {"success": True, "return": 1.0},
    }
    client = api_as(researcher)
    first = client.post(_url(project, "trajectories/"), row, format="json")
    assert first.status_code == 201
    body = first.json()
    assert [step["action"] for step in body["steps"]] == ["search", "book"]
    assert (body["success"], body["policy_name"], body["num_steps"]) == (True, "agent-x", 2)
    again = client.post(_url(project, "trajectories/"), row, format="json")
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    assert Trajectory.objects.filter(project=project).count() == 1


def test_a_bad_trajectory_row_gets_400_naming_the_field(project, researcher, api_as):
    row = {"external_id": "ep-1", "task": {"instruction": "book"}, "steps": [{"action": "go", "reward": "lots"}]}
    response = api_as(researcher).post(_url(project, "trajectories/"), row, format="json")
    assert response.status_code == 400
    assert "reward" in str(response.json()["steps"])


def test_cursor_pagination_walks_every_row_once_newest_first(project, make_trajectory, researcher, api_as):
    made = [make_trajectory(n_steps=1).pk for _ in range(5)]
    client = api_as(researcher)
    seen, url = [], _url(project, "trajectories/?page_size=2")
    while url:
        page = client.get(url).json()
        assert len(page["results"]) <= 2
        seen += [row["id"] for row in page["results"]]
        url = page["next"]
    assert seen == sorted(made, reverse=True)


def test_trajectories_filter_by_task_and_source(project, task, make_trajectory, researcher, api_as):
    other_task = Task.objects.create(project=project, instruction="other", seed=8)
    mine = make_trajectory(task=other_task, source="human")
    make_trajectory()
    rows = api_as(researcher).get(_url(project, f"trajectories/?task={other_task.pk}&source=human")).json()["results"]
    assert [row["id"] for row in rows] == [mine.pk]


# --- Labels -------------------------------------------------------------------------------------------------------


def test_an_annotator_stores_a_comparison_as_themself(project, pair, annotator, other_annotator, api_as):
    body = {"trajectory_a": pair[0].pk, "trajectory_b": pair[1].pk, "choice": "a", "annotator": other_annotator.pk}
    response = api_as(annotator).post(_url(project, "comparisons/"), body, format="json")
    assert response.status_code == 201
    stored = Comparison.objects.get()
    assert stored.annotator == annotator and response.json()["annotator_username"] == "annotator"


def test_a_pair_sent_in_reverse_is_stored_canonically_with_the_same_meaning(project, pair, annotator, api_as):
    body = {"trajectory_a": pair[1].pk, "trajectory_b": pair[0].pk, "choice": "a", "displayed_order": "ab"}
    response = api_as(annotator).post(_url(project, "comparisons/"), body, format="json")
    assert response.status_code == 201
    stored = Comparison.objects.get()
    assert (stored.trajectory_a, stored.trajectory_b) == pair
    assert (stored.choice, stored.displayed_order) == ("b", "ba")  # pair[1] is still the preferred one, on the left


def test_a_retried_post_with_the_same_client_token_is_stored_once(project, pair, annotator, api_as):
    client = api_as(annotator)
    body = {"trajectory_a": pair[0].pk, "trajectory_b": pair[1].pk, "choice": "a", "client_token": str(uuid.uuid4())}
    first = client.post(_url(project, "comparisons/"), body, format="json")
    again = client.post(_url(project, "comparisons/"), body, format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert Comparison.objects.count() == 1


def test_a_second_label_of_the_same_item_revises_the_first_as_on_the_annotator_pages(project, pair, annotator, api_as):
    client = api_as(annotator)
    body = {"trajectory_a": pair[0].pk, "trajectory_b": pair[1].pk, "choice": "a"}
    first = client.post(_url(project, "comparisons/"), body, format="json").json()
    response = client.post(_url(project, "comparisons/"), {**body, "choice": "b"}, format="json")
    assert response.status_code == 201
    revised = response.json()
    assert (revised["revision"], revised["supersedes"], revised["choice"]) == (2, first["id"], "b")
    unchanged = client.post(_url(project, "comparisons/"), {**body, "choice": "b"}, format="json")
    assert (unchanged.status_code, unchanged.json()["id"]) == (200, revised["id"])
    # The pair sent the other way round is the same item: its choice is turned with it.
    swapped = {"trajectory_a": pair[1].pk, "trajectory_b": pair[0].pk, "choice": "a"}
    assert client.post(_url(project, "comparisons/"), swapped, format="json").json()["id"] == revised["id"]
    assert list(Comparison.objects.order_by("pk").values_list("choice", "is_current")) == [("a", False), ("b", True)]


def test_patch_stores_a_new_revision_and_keeps_the_old_one(project, pair, annotator, api_as):
    client = api_as(annotator)
    body = {"trajectory_a": pair[0].pk, "trajectory_b": pair[1].pk, "choice": "a", "rationale": "shorter"}
    first = client.post(_url(project, "comparisons/"), body, format="json").json()
    response = client.patch(_url(project, f"comparisons/{first['id']}/"), {"choice": "tie"}, format="json")
    assert response.status_code == 200
    revised = response.json()
    assert revised["id"] != first["id"]
    assert (revised["revision"], revised["supersedes"], revised["choice"], revised["rationale"]) == (
        2,
        first["id"],
        "tie",
        "shorter",
    )
    old = Comparison.objects.get(pk=first["id"])
    assert (old.choice, old.is_current) == ("a", False)
    current = client.get(_url(project, "comparisons/")).json()["results"]
    assert [row["id"] for row in current] == [revised["id"]]
    everything = client.get(_url(project, "comparisons/?revisions=all")).json()["results"]
    assert {row["id"] for row in everything} == {first["id"], revised["id"]}


def test_put_revises_too_and_a_superseded_revision_cannot_be_revised(project, pair, annotator, api_as):
    client = api_as(annotator)
    rating = client.post(_url(project, "ratings/"), {"trajectory": pair[0].pk, "score": 2}, format="json").json()
    response = client.put(_url(project, f"ratings/{rating['id']}/"), {"score": 4, "comment": "better on reread"})
    assert response.status_code == 200 and response.json()["revision"] == 2
    stale = client.patch(_url(project, f"ratings/{rating['id']}/"), {"score": 5}, format="json")
    assert stale.status_code == 409
    assert Rating.objects.filter(is_current=True).get().score == 4


def test_what_a_label_is_about_cannot_be_revised(project, pair, annotator, api_as):
    client = api_as(annotator)
    rating = client.post(_url(project, "ratings/"), {"trajectory": pair[0].pk, "score": 2}, format="json").json()
    response = client.patch(_url(project, f"ratings/{rating['id']}/"), {"trajectory": pair[1].pk}, format="json")
    assert response.status_code == 400
    assert Rating.objects.get().trajectory == pair[0]


def test_labels_cannot_be_deleted(project, pair, annotator, api_as):
    client = api_as(annotator)
    rating = client.post(_url(project, "ratings/"), {"trajectory": pair[0].pk, "thumb_up": True}, format="json").json()
    assert client.delete(_url(project, f"ratings/{rating['id']}/")).status_code == 405
    assert Rating.objects.count() == 1


def test_a_label_of_a_kind_the_project_does_not_collect_is_refused(project, pair, annotator, api_as):
    project.feedback_kinds = ["comparison"]
    project.save()
    response = api_as(annotator).post(_url(project, "ratings/"), {"trajectory": pair[0].pk, "score": 3})
    assert response.status_code == 400 and "does not collect rating" in str(response.json())


def test_a_trajectory_of_another_project_reads_as_missing(project, gridworld_spec, annotator, api_as):
    other = Project.objects.create(name="Other", environment=gridworld_spec)
    foreign_task = Task.objects.create(project=other, instruction="x")
    foreign = Trajectory.objects.create(project=other, task=foreign_task, source="import")
    response = api_as(annotator).post(_url(project, "ratings/"), {"trajectory": foreign.pk, "score": 3})
    assert response.status_code == 400 and "does not exist" in response.json()["trajectory"][0]


def test_step_labels_and_critiques_are_checked_against_their_step(project, pair, annotator, api_as):
    client = api_as(annotator)
    step = pair[0].steps.get(index=1)
    response = client.post(_url(project, "step-labels/"), {"step": step.pk, "value": -1}, format="json")
    assert response.status_code == 201 and response.json()["trajectory"] == pair[0].pk
    assert client.post(_url(project, "step-labels/"), {"step": step.pk, "value": 5}).status_code == 400
    rows = client.get(_url(project, f"step-labels/?trajectory={pair[0].pk}")).json()["results"]
    assert [row["step"] for row in rows] == [step.pk]

    span = {"trajectory": pair[0].pk, "step": step.pk, "span_field": "reasoning", "span_start": 0, "span_end": 50}
    response = client.post(_url(project, "critiques/"), {**span, "text": "too vague"}, format="json")
    assert response.status_code == 400 and "span_end" in response.json()
    wrong_step = {"trajectory": pair[1].pk, "step": step.pk, "text": "wrong place"}
    assert client.post(_url(project, "critiques/"), wrong_step, format="json").status_code == 400
    ok = client.post(_url(project, "critiques/"), {**span, "span_end": 5, "text": "vague", "tags": ["style"]})
    assert ok.status_code == 201
    assert Critique.objects.get().tags == ["style"] and StepLabel.objects.count() == 1


def test_a_rating_needs_a_score_or_a_thumb(project, pair, annotator, api_as):
    response = api_as(annotator).post(_url(project, "ratings/"), {"trajectory": pair[0].pk, "comment": "meh"})
    assert response.status_code == 400 and "score" in response.json()


def test_an_intervention_copies_the_original_step_and_queues_its_continuation(
    project, pair, annotator, api_as, django_capture_on_commit_callbacks, monkeypatch
):
    from training import tasks

    queued = []
    monkeypatch.setattr(tasks.continue_intervention, "delay", lambda pk: queued.append(pk))
    step = pair[0].steps.get(index=1)
    body = {"trajectory": pair[0].pk, "step": step.pk, "corrected_action": "left", "reason": "wall ahead"}
    with django_capture_on_commit_callbacks(execute=True):
        response = api_as(annotator).post(_url(project, "interventions/"), body, format="json")
    assert response.status_code == 201, response.json()
    stored = Intervention.objects.get()
    assert (stored.original_action, stored.corrected_action, stored.status) == ("up", "left", "pending")
    assert queued == [stored.pk]


def test_revising_an_intervention_keeps_its_action_and_its_continuation(project, pair, annotator, api_as):
    step = pair[0].steps.get(index=1)
    client = api_as(annotator)
    body = {"trajectory": pair[0].pk, "step": step.pk, "corrected_action": "left", "reason": "wall"}
    first = client.post(_url(project, "interventions/"), body, format="json").json()
    child = pair[1]
    Intervention.objects.filter(pk=first["id"]).update(status="done", child_trajectory=child)
    refused = client.patch(_url(project, f"interventions/{first['id']}/"), {"corrected_action": "down"}, format="json")
    assert refused.status_code == 400 and "reason" in str(refused.json())
    response = client.patch(_url(project, f"interventions/{first['id']}/"), {"reason": "a wall ahead"}, format="json")
    assert response.status_code == 200
    revised = Intervention.objects.get(pk=response.json()["id"])
    assert (revised.revision, revised.corrected_action, revised.reason) == (2, "left", "a wall ahead")
    assert (revised.status, revised.child_trajectory) == ("done", child)


def test_revising_an_intervention_not_yet_continued_continues_the_new_revision(
    project, pair, annotator, api_as, django_capture_on_commit_callbacks, monkeypatch
):
    # The old revision's continuation gives way to the newest (training.interventions), so the new one must be sent;
    # the annotator pages revise through the same function.
    from feedback_app import labelling
    from training import tasks

    queued = []
    monkeypatch.setattr(tasks.continue_intervention, "delay", lambda pk: queued.append(pk))
    step = pair[0].steps.get(index=1)
    client = api_as(annotator)
    body = {"trajectory": pair[0].pk, "step": step.pk, "corrected_action": "left", "reason": "wall"}
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(_url(project, "interventions/"), body, format="json").json()
        revised = client.patch(_url(project, f"interventions/{first['id']}/"), {"reason": "a wall"}, format="json")
        again = labelling.edit_label(annotator, Intervention.objects.get(pk=revised.json()["id"]), reason="walls")
    assert revised.status_code == 200
    assert queued == [first["id"], revised.json()["id"], again.pk]
    assert Intervention.objects.get(is_current=True).status == "pending"


def test_an_illegal_correction_is_refused_naming_the_field(project, pair, annotator, api_as):
    step = pair[0].steps.get(index=1)
    body = {"trajectory": pair[0].pk, "step": step.pk, "corrected_action": "fly away"}
    response = api_as(annotator).post(_url(project, "interventions/"), body, format="json")
    assert response.status_code == 400 and "corrected_action" in response.json()
    assert not Intervention.objects.exists()


def test_a_label_that_answers_an_assignment_marks_it_done(project, pair, annotator, other_annotator, api_as):
    item = QueueItem.objects.create(project=project, kind="rating", trajectory=pair[0], query_strategy="uncertainty")
    mine = Assignment.objects.create(
        item=item, annotator=annotator, slot=0, leased_until=timezone.now() + timedelta(minutes=5)
    )
    theirs_item = QueueItem.objects.create(project=project, kind="rating", trajectory=pair[1])
    theirs = Assignment.objects.create(
        item=theirs_item, annotator=other_annotator, slot=0, leased_until=timezone.now() + timedelta(minutes=5)
    )
    client = api_as(annotator)
    refused = client.post(_url(project, "ratings/"), {"trajectory": pair[1].pk, "score": 3, "assignment": theirs.pk})
    assert refused.status_code == 400 and "not yours" in refused.json()["assignment"][0]
    wrong_item = client.post(_url(project, "ratings/"), {"trajectory": pair[1].pk, "score": 3, "assignment": mine.pk})
    assert wrong_item.status_code == 400 and "another item" in wrong_item.json()["assignment"][0]
    response = client.post(_url(project, "ratings/"), {"trajectory": pair[0].pk, "score": 3, "assignment": mine.pk})
    assert response.status_code == 201
    mine.refresh_from_db()
    item.refresh_from_db()
    assert (mine.status, item.completed_count) == ("done", 1)
    assert Rating.objects.get().query_strategy == "uncertainty"


# --- Runs and evaluations -----------------------------------------------------------------------------------------


def test_a_researcher_launches_a_rollout_run_that_is_queued_on_commit(
    project, review_tasks, tiny_policy, researcher, api_as, django_capture_on_commit_callbacks, monkeypatch
):
    from training import tasks

    queued = []
    monkeypatch.setattr(tasks.rollout, "delay", lambda pk: queued.append(pk))
    body = {"policy_version": tiny_policy.pk, "config": {"num_tasks": 2, "samples_per_task": 1}}
    with django_capture_on_commit_callbacks(execute=True):
        response = api_as(researcher).post(_url(project, "runs/"), body, format="json")
    assert response.status_code == 201, response.json()
    run = TrainingRun.objects.get()
    assert (run.kind, run.status, run.config["num_tasks"], run.created_by) == ("rollout", "queued", 2, researcher)
    assert queued == [run.pk]


def test_a_rollout_with_bad_settings_or_an_external_policy_is_refused(
    project, tiny_policy, external_policy, researcher, api_as
):
    client = api_as(researcher)
    bad = client.post(_url(project, "runs/"), {"policy_version": tiny_policy.pk, "config": {"num_tasks": 0}})
    assert bad.status_code == 400 and "num_tasks" in bad.json()["config"][0]
    unknown = client.post(_url(project, "runs/"), {"policy_version": tiny_policy.pk, "config": {"warp": 9}})
    assert unknown.status_code == 400 and "warp" in unknown.json()["config"][0]
    external = client.post(_url(project, "runs/"), {"policy_version": external_policy.pk}, format="json")
    assert external.status_code == 400 and "policy_version" in external.json()
    assert not TrainingRun.objects.exists()


def test_a_queued_run_is_cancelled_and_a_finished_one_cannot_be(project, external_policy, researcher, api_as):
    run = TrainingRun.objects.create(project=project, kind="rollout", base_policy=external_policy)
    client = api_as(researcher)
    response = client.post(_url(project, f"runs/{run.pk}/cancel/"))
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert client.post(_url(project, f"runs/{run.pk}/cancel/")).status_code == 409


def test_evaluations_are_recorded_and_filtered(project, external_policy, researcher, api_as):
    client = api_as(researcher)
    body = {"policy_version": external_policy.pk, "name": "heldout_success", "value": 0.47, "stderr": 0.035, "n": 200}
    assert client.post(_url(project, "evaluations/"), body, format="json").status_code == 201
    assert client.post(_url(project, "evaluations/"), {"name": "x", "value": 1.0}).status_code == 400
    rows = client.get(_url(project, "evaluations/?name=heldout_success")).json()["results"]
    assert [(row["value"], row["n"]) for row in rows] == [(0.47, 200)]
    assert Evaluation.objects.count() == 1


# --- Throttling ---------------------------------------------------------------------------------------------------


def test_requests_past_the_rate_get_429(project, researcher, api_as, monkeypatch):
    from rest_framework.throttling import UserRateThrottle

    monkeypatch.setitem(UserRateThrottle.THROTTLE_RATES, "user", "2/minute")
    client = api_as(researcher)
    codes = [client.get(_url(project, "tasks/")).status_code for _ in range(3)]
    assert codes == [200, 200, 429]


def test_an_outsider_past_the_rate_still_gets_404_not_429(project, outsider, researcher, api_as, monkeypatch):
    from rest_framework.throttling import UserRateThrottle

    monkeypatch.setitem(UserRateThrottle.THROTTLE_RATES, "user", "2/minute")
    client = api_as(outsider)
    paths = [
        f"/api/projects/{project.pk}/",
        f"/api/projects/{project.pk}/tasks/",
        f"/api/projects/{project.pk}/exports/preference",
        f"/api/projects/{project.pk}/snapshots",
    ]
    assert [client.get(path).status_code for path in paths * 2] == [404] * 8
    member = api_as(researcher)
    assert [member.get(f"/api/projects/{project.pk}/tasks/").status_code for _ in range(3)] == [200, 200, 429]


def test_only_a_label_s_own_annotator_may_revise_it_whatever_the_body(project, pair, annotator, researcher, api_as):
    body = {"trajectory_a": pair[0].pk, "trajectory_b": pair[1].pk, "choice": "a"}
    label = api_as(annotator).post(_url(project, "comparisons/"), body, format="json").json()
    for change in ({"choice": "b"}, {"choice": "sideways"}):
        response = api_as(researcher).patch(_url(project, f"comparisons/{label['id']}/"), change, format="json")
        assert response.status_code == 403, change
    assert Comparison.objects.get().choice == "a"
