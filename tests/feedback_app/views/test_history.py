"""My labels: every kind, newest first, paginated; editing writes a new revision and never overwrites."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from feedback_app import labelling, queue
from feedback_app.models import Comparison, Critique, Membership, Project, QueueItem, Rating, StepLabel
from tests.feedback_app.labels import stored_intervention

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def comparison(project, annotator, make_trajectory):
    QueueItem.objects.enqueue_comparisons(project, [(make_trajectory(2), make_trajectory(2))])
    assignment = queue.next_assignment(annotator, project, kind="comparison")
    return labelling.submit_comparison(annotator, assignment, choice="a", strength=3, rationale="shorter").label


@pytest.fixture
def my_labels(annotator, trajectory, comparison):
    """One label of each kind but interventions, created one second apart: step, critique, rating, comparison."""
    labels = [
        labelling.label_step(annotator, trajectory, 1, -1).label,
        labelling.add_critique(annotator, trajectory, text="went in circles", step_index=2, tags=["loop"]).label,
        labelling.rate(annotator, trajectory, score=2, thumb_up=False, comment="slow").label,
    ]
    base = timezone.now() - timedelta(minutes=10)
    for offset, label in enumerate([*labels, comparison]):
        type(label).objects.filter(pk=label.pk).update(created_at=base + timedelta(seconds=offset))
    return [*labels, comparison]


def history_url(project):
    return reverse("history", args=[project.pk])


def label_url(project, kind, label):
    return reverse("history-label", args=[project.pk, kind, label.pk])


def row_ids(body: str) -> list[str]:
    return re.findall(r'<li class="card history-row" id="label-([a-z_]+-\d+)"', body)


def test_anonymous_users_are_sent_to_log_in(client, project):
    response = client.get(history_url(project))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_it_lists_my_current_labels_of_every_kind_newest_first(client, annotator, project, my_labels):
    step_label, critique, rating, comparison = my_labels
    client.force_login(annotator)
    body = client.get(history_url(project)).content.decode()
    assert row_ids(body) == [
        f"comparison-{comparison.pk}",
        f"rating-{rating.pk}",
        f"critique-{critique.pk}",
        f"step_label-{step_label.pk}",
    ]
    assert "left better" in body or "right better" in body
    assert "strength 3" in body and "shorter" in body
    assert "-1 bad" in body and "step 2" in body
    assert "went in circles" in body and "loop" in body
    assert "score 2 thumb down" in body and "slow" in body
    assert body.count('title="revision number">r1</span>') == 4


def test_a_comparison_is_shown_the_way_its_annotator_saw_it(client, annotator, project, comparison):
    client.force_login(annotator)
    body = client.get(history_url(project)).content.decode()
    shown = labelling.shown_choice(comparison.choice, comparison.displayed_order)
    assert f"{shown} better" in body
    left = comparison.trajectory_a_id if comparison.displayed_order == "ab" else comparison.trajectory_b_id
    assert re.search(rf">{left}</a> \(left\)", body)


def test_it_shows_only_current_revisions_with_their_number(client, annotator, project, trajectory):
    first = labelling.label_step(annotator, trajectory, 0, 1).label
    second = labelling.edit_label(annotator, first, value=0)
    client.force_login(annotator)
    body = client.get(history_url(project)).content.decode()
    assert row_ids(body) == [f"step_label-{second.pk}"]
    assert 'title="revision number">r2</span>' in body


def test_an_annotator_never_sees_another_annotators_labels(
    client, annotator, other_annotator, project, trajectory, my_labels
):
    theirs = labelling.rate(other_annotator, trajectory, score=5, comment="their secret").label
    client.force_login(annotator)
    body = client.get(history_url(project)).content.decode()
    assert "their secret" not in body and f"rating-{theirs.pk}" not in body
    assert client.get(label_url(project, "rating", theirs)).status_code == 404
    response = client.post(label_url(project, "rating", theirs), {"score": "1", "thumb": "", "comment": "mine now"})
    assert response.status_code == 404
    assert Rating.objects.filter(annotator=other_annotator).count() == 1


def test_a_researcher_sees_only_their_own_labels_too(client, researcher, project, trajectory, my_labels):
    labelling.rate(researcher, trajectory, thumb_up=True)
    client.force_login(researcher)
    body = client.get(history_url(project)).content.decode()
    assert len(row_ids(body)) == 1 and "slow" not in body


def test_an_outsider_gets_404(client, outsider, project, my_labels):
    client.force_login(outsider)
    assert client.get(history_url(project)).status_code == 404
    assert client.get(label_url(project, "rating", my_labels[2])).status_code == 404


def test_an_unknown_kind_is_404(client, annotator, project, my_labels):
    client.force_login(annotator)
    assert client.get(reverse("history-label", args=[project.pk, "vote", my_labels[0].pk])).status_code == 404


def test_the_edit_form_shows_the_revision_chain(client, annotator, project, trajectory):
    first = labelling.label_step(annotator, trajectory, 0, 1).label
    second = labelling.edit_label(annotator, first, value=0)
    client.force_login(annotator)
    response = client.get(label_url(project, "step_label", second), **HTMX)
    body = response.content.decode()
    assert body.lstrip().startswith(f'<li class="card history-row" id="label-step_label-{second.pk}"')
    chain = re.findall(r'<span class="revision">r(\d)</span>', body)
    assert chain == ["2", "1"]
    assert 'name="value"' in body and "Save as revision 3" in body


def test_an_edit_writes_a_new_revision_and_keeps_the_old_one(client, annotator, project, comparison):
    client.force_login(annotator)
    shown = labelling.shown_choice(comparison.choice, comparison.displayed_order)
    other_side = "right" if shown == "left" else "left"
    response = client.post(
        label_url(project, "comparison", comparison),
        {"choice": other_side, "strength": "1", "rationale": "on second thought"},
        **HTMX,
    )
    assert response.status_code == 200
    old, new = Comparison.objects.order_by("revision")
    assert (old.pk, old.is_current, old.choice, old.rationale) == (comparison.pk, False, "a", "shorter")
    assert (new.revision, new.is_current, new.supersedes_id, new.choice, new.strength) == (2, True, old.pk, "b", 1)
    assert new.displayed_order == old.displayed_order and new.rationale == "on second thought"
    body = response.content.decode()
    assert f'id="label-comparison-{new.pk}"' in body and "Saved as revision 2" in body
    assert re.findall(r'<span class="revision">r(\d)</span>', body) == ["2", "1"]


@pytest.mark.parametrize(
    ("kind", "index", "data", "expected"),
    [
        ("step_label", 0, {"value": "1"}, {"value": 1}),
        (
            "critique",
            1,
            {"text": "loops twice", "tags": "loop, slow ,"},
            {"text": "loops twice", "tags": ["loop", "slow"]},
        ),
        ("rating", 2, {"score": "", "thumb": "up", "comment": ""}, {"score": None, "thumb_up": True, "comment": ""}),
    ],
)
def test_every_kind_can_be_edited(client, annotator, project, my_labels, kind, index, data, expected):
    label = my_labels[index]
    client.force_login(annotator)
    assert client.post(label_url(project, kind, label), data, **HTMX).status_code == 200
    model = type(label)
    new = model.objects.get(annotator=annotator, is_current=True, supersedes=label)
    assert {name: getattr(new, name) for name in expected} == expected
    assert model.objects.filter(annotator=annotator).count() == 2


def test_an_intervention_can_be_edited(client, annotator, project, trajectory):
    from feedback_app.models import Intervention

    step = trajectory.steps.get(index=1)
    intervention = stored_intervention(annotator, step, "down", original_action="up", reason="wall ahead")
    client.force_login(annotator)
    body = client.get(history_url(project)).content.decode()
    assert f"intervention-{intervention.pk}" in body and "up → down" in body
    response = client.post(
        label_url(project, "intervention", intervention), {"corrected_reasoning": "", "reason": "a wall"}, **HTMX
    )
    assert response.status_code == 200
    new = Intervention.objects.get(is_current=True)
    assert (new.revision, new.reason, new.corrected_action) == (2, "a wall", "down")


def test_an_invalid_edit_gets_400_with_the_message_beside_the_field(client, annotator, project, comparison):
    client.force_login(annotator)
    response = client.post(
        label_url(project, "comparison", comparison), {"choice": "up", "strength": "7", "rationale": "typed"}, **HTMX
    )
    assert response.status_code == 400
    body = response.content.decode()
    assert "Choose left, right, tie or both bad." in body
    assert "Strength is 1 (slight), 2 (clear) or 3 (decisive)." in body
    assert "typed</textarea>" in body
    assert Comparison.objects.count() == 1


def test_a_rating_needs_a_score_or_a_thumb(client, annotator, project, my_labels):
    client.force_login(annotator)
    response = client.post(label_url(project, "rating", my_labels[2]), {"score": "", "thumb": "", "comment": "x"})
    assert response.status_code == 400
    assert "Give a score from 1 to 5, a thumb, or both." in response.content.decode()
    assert Rating.objects.count() == 1


def test_an_edit_that_changes_nothing_writes_no_revision(client, annotator, project, my_labels):
    client.force_login(annotator)
    response = client.post(label_url(project, "step_label", my_labels[0]), {"value": "-1"}, **HTMX)
    assert response.status_code == 400
    assert "Nothing changed" in response.content.decode()
    assert StepLabel.objects.count() == 1


def test_editing_a_superseded_revision_is_refused_with_409(client, annotator, project, my_labels):
    critique = my_labels[1]
    labelling.edit_label(annotator, critique, text="changed elsewhere")
    client.force_login(annotator)
    response = client.post(label_url(project, "critique", critique), {"text": "stale edit", "tags": ""}, **HTMX)
    assert response.status_code == 409
    assert "This label was changed since you opened it" in response.content.decode()
    assert not Critique.objects.filter(text="stale edit").exists()


def test_without_htmx_the_label_has_a_page_of_its_own(client, annotator, project, my_labels):
    client.force_login(annotator)
    body = client.get(label_url(project, "rating", my_labels[2])).content.decode()
    assert "<html" in body and f'id="label-rating-{my_labels[2].pk}"' in body and "My labels" in body


def test_an_edit_without_the_csrf_token_is_refused(annotator, project, my_labels):
    client = Client(enforce_csrf_checks=True)
    client.force_login(annotator)
    response = client.post(label_url(project, "step_label", my_labels[0]), {"value": "1"})
    assert response.status_code == 403
    assert StepLabel.objects.count() == 1


def test_a_trajectory_s_step_labels_share_one_row_that_links_each_label(
    client, annotator, project, trajectory, make_trajectory
):
    first = [labelling.label_step(annotator, trajectory, index, value).label for index, value in enumerate([1, 1, -1])]
    revised = labelling.edit_label(annotator, first[1], value=0)
    other = labelling.label_step(annotator, make_trajectory(2), 0, 1).label
    client.force_login(annotator)
    body = client.get(history_url(project)).content.decode()
    assert row_ids(body) == [f"step_label-{other.pk}", f"step_label-{revised.pk}"]
    row = body[body.index(f'id="label-step_label-{revised.pk}"') :]
    row = row[: row.index("</li>")]
    assert "3 steps: +1 ×1, 0 ×1, −1 ×1" in row
    for label in (first[0], revised, first[2]):
        assert label_url(project, "step_label", label) in row
    assert reverse("trajectory-steps", args=[project.pk, trajectory.pk]) in row


def test_the_list_keeps_one_kind_and_moves_to_another_project(client, annotator, project, gridworld_spec, my_labels):
    step_label, critique, rating, comparison = my_labels
    other_project = Project.objects.create(name="Another project", environment=gridworld_spec)
    Membership.objects.create(user=annotator, project=other_project, role="annotator")
    client.force_login(annotator)
    body = client.get(history_url(project) + "?kind=critique").content.decode()
    assert row_ids(body) == [f"critique-{critique.pk}"]
    assert '<option value="critique" selected>' in body
    assert row_ids(client.get(history_url(project) + "?kind=nonsense").content.decode())  # every kind
    moved = client.get(history_url(project) + f"?kind=rating&project={other_project.pk}")
    assert moved.status_code == 302 and moved["Location"] == history_url(other_project) + "?kind=rating"
    assert "You have no labels of this kind in this project yet." in client.get(moved["Location"]).content.decode()


def test_another_project_of_which_the_user_is_no_member_is_404(client, annotator, project, gridworld_spec):
    elsewhere = Project.objects.create(name="Not theirs", environment=gridworld_spec)
    client.force_login(annotator)
    assert client.get(history_url(project) + f"?project={elsewhere.pk}").status_code == 404
    # A number past any id, or not a number, keeps the list where it is.
    for other in ("9" * 40, "-1", "x"):
        assert client.get(history_url(project) + f"?project={other}").status_code == 200


def test_it_paginates_newest_first(client, annotator, project, make_trajectory):
    trajectories = [make_trajectory(1) for _ in range(30)]
    labels = [labelling.rate(annotator, t, score=3).label for t in trajectories]
    client.force_login(annotator)
    first = client.get(history_url(project)).content.decode()
    second = client.get(history_url(project) + "?page=2").content.decode()
    assert row_ids(first) == [f"rating-{label.pk}" for label in labels[::-1][:25]]
    assert row_ids(second) == [f"rating-{label.pk}" for label in labels[::-1][25:]]
    assert "page 1 of 2 · 30 labels" in first and "?page=2" in first


def test_the_history_takes_the_same_number_of_queries_however_many_labels(
    client, annotator, project, make_trajectory, my_labels, django_assert_max_num_queries
):
    client.force_login(annotator)
    with django_assert_max_num_queries(12) as few:
        client.get(history_url(project))
    long = make_trajectory(12)
    for index in range(12):
        labelling.label_step(annotator, long, index, 1)
        labelling.add_critique(annotator, long, text=f"step {index}", step_index=index)
    with django_assert_max_num_queries(len(few.captured_queries)):
        body = client.get(history_url(project)).content.decode()
    # 12 critiques, the long trajectory's 12 step labels in one row, and the four labels of my_labels.
    assert len(row_ids(body)) == 17
    # The edit fragment reads the whole revision chain at once (step 1 was labelled above: this is revision 2).
    label = labelling.label_step(annotator, long, 0, 0).label
    for value in (1, -1, 0, 1):
        label = labelling.edit_label(annotator, label, value=value)
    with django_assert_max_num_queries(8):
        body = client.get(label_url(project, "step_label", label), **HTMX).content.decode()
    assert re.findall(r'<span class="revision">r(\d)</span>', body) == ["6", "5", "4", "3", "2", "1"]
