"""The researcher's dashboard: project overview, models (registry and lineage graph) and leaderboard."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import timedelta
from functools import partial

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from feedback_app.models import (
    Assignment,
    DatasetSnapshot,
    Evaluation,
    PolicyVersion,
    QueueItem,
    RegisteredModel,
    StepLabel,
    TrainingRun,
)
from tests.feedback_app.labels import gold_comparison_item, stored_comparison

pytestmark = pytest.mark.django_db
SVG = "{http://www.w3.org/2000/svg}"
PAGES = ["project-dashboard", "project-models", "project-leaderboard"]


_compare = partial(stored_comparison, seconds=12.0)


@pytest.fixture
def registry(project, external_policy, researcher):
    """base (agent-v1) -> DPO run (from a snapshot) -> v2; a reward-model run -> rm; v3 a child of v2 made by hand."""
    snapshot = DatasetSnapshot.objects.create(
        project=project, name="prefs-1", export_kind="preference", row_count=40, content_hash="ab" * 32
    )
    rm_run = TrainingRun.objects.create(project=project, kind="reward_model", status="succeeded", snapshot=snapshot)
    rm = RegisteredModel.objects.create(
        project=project, name="rm-1", kind="reward_model", path="/m/rm", run=rm_run, snapshot=snapshot, base_model="x"
    )
    dpo = TrainingRun.objects.create(
        project=project,
        kind="dpo",
        status="succeeded",
        snapshot=snapshot,
        base_policy=external_policy,
        inputs={"judges": {"reward_model": rm.pk}},
    )
    v2 = PolicyVersion.objects.create(
        project=project, name="v2", kind="local", weights_path="/m/v2", parent=external_policy, produced_by=dpo
    )
    v3 = PolicyVersion.objects.create(project=project, name="v3", kind="external", parent=v2)
    failed = TrainingRun.objects.create(project=project, kind="ppo", status="failed", base_policy=v2)
    TrainingRun.objects.create(project=project, kind="rollout", status="succeeded", base_policy=v2)
    return {"snapshot": snapshot, "rm_run": rm_run, "rm": rm, "dpo": dpo, "v2": v2, "v3": v3, "failed": failed}


@pytest.fixture
def labelled(project, annotator, other_annotator, external_policy, registry, make_trajectory):
    """v2 beats the base in 7 of 9 comparisons (and one tie); a gold item says the base is better; v3 is never
    compared. Some step labels; an open queue item; held-out figures."""
    v2 = registry["v2"]
    pairs = [(make_trajectory(policy_version=v2, success=True), make_trajectory(success=False)) for _ in range(5)]
    for i, (new, old) in enumerate(pairs):
        _compare(project, annotator, new, old, "a" if i < 4 else "b")
        _compare(project, other_annotator, new, old, "a" if i < 3 else ("tie" if i == 3 else "b"))
    gold_new, gold_old = make_trajectory(policy_version=v2), make_trajectory()
    gold_item = gold_comparison_item(project, gold_new, gold_old, "b", completed_count=1)
    done = Assignment.objects.create(
        item=gold_item, annotator=annotator, slot=0, status="done", leased_until=timezone.now()
    )
    _compare(project, annotator, gold_new, gold_old, "b", assignment=done)
    step_trajectory = make_trajectory(n_steps=3)
    for user in (annotator, other_annotator):
        for step in step_trajectory.steps.all():
            StepLabel.objects.create(project=project, annotator=user, step=step, value=1, seconds_spent=3.0)
    open_item = QueueItem.objects.create(
        project=project, kind="comparison", trajectory=pairs[0][0], other_trajectory=pairs[1][1], overlap=3
    )
    Assignment.objects.create(
        item=open_item, annotator=annotator, slot=0, leased_until=timezone.now() + timedelta(minutes=5)
    )
    Evaluation.objects.create(project=project, policy_version=v2, name="heldout_success", decoding="greedy", value=0.8)
    Evaluation.objects.create(
        project=project, policy_version=v2, name="heldout_success", decoding="greedy", value=0.7, stderr=0.05, n=40
    )
    Evaluation.objects.create(project=project, policy_version=v2, name="rm_score", value=1.25, stderr=0.1, n=10)
    return {**registry, "pairs": pairs}


# --- who may see what ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_a_researcher_sees_each_dashboard_page(client, project, researcher, labelled, page):
    client.force_login(researcher)
    response = client.get(reverse(page, args=[project.pk]))
    assert response.status_code == 200
    assert b'class="dash-nav"' in response.content


@pytest.mark.parametrize("page", PAGES)
def test_an_annotator_is_refused_each_dashboard_page(client, project, annotator, labelled, page):
    client.force_login(annotator)
    assert client.get(reverse(page, args=[project.pk])).status_code == 403


@pytest.mark.parametrize("page", PAGES)
def test_an_outsider_gets_404_for_each_dashboard_page(client, project, outsider, labelled, page):
    client.force_login(outsider)
    assert client.get(reverse(page, args=[project.pk])).status_code == 404


@pytest.mark.parametrize("page", PAGES)
def test_an_anonymous_visitor_is_sent_to_log_in(client, project, page):
    response = client.get(reverse(page, args=[project.pk]))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_project_page_links_researchers_to_the_dashboard_but_not_annotators(
    client, project, researcher, annotator
):
    url = reverse("project-dashboard", args=[project.pk])
    client.force_login(researcher)
    assert url in client.get(reverse("project-detail", args=[project.pk])).content.decode()
    client.force_login(annotator)
    assert url not in client.get(reverse("project-detail", args=[project.pk])).content.decode()


# --- overview --------------------------------------------------------------------------------------------------------


def _svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(svg) for svg in re.findall(r"<svg .*?</svg>", html, flags=re.S)]


def test_overview_counts_labels_per_day_and_kind(client, project, researcher, labelled):
    client.force_login(researcher)
    response = client.get(reverse("project-dashboard", args=[project.pk]))
    labels_chart = _svgs(response.content.decode())[0]
    today = timezone.localdate().strftime("%m-%d")
    bars = {
        r.get("data-series"): r.find(f"{SVG}title").text
        for r in labels_chart.iter(f"{SVG}rect")
        if r.get("data-category") == today
    }
    # 10 comparisons + 1 gold answer; 6 step labels.
    assert bars == {"Comparison": f"{today} · Comparison: 11", "Step label": f"{today} · Step label: 6"}
    assert response.context["labels_total"] == 17


def test_overview_shows_queue_depth_by_kind(client, project, researcher, labelled):
    client.force_login(researcher)
    queue = client.get(reverse("project-dashboard", args=[project.pk])).context["queue"]
    # The gold item is complete; the open item needs all 3 of its labels and one lease is out.
    assert queue == [{"kind": "Comparison", "items": 1, "labels_needed": 3, "leased": 1}]


def test_overview_shows_throughput_agreement_and_gold_per_annotator(client, project, researcher, labelled):
    client.force_login(researcher)
    response = client.get(reverse("project-dashboard", args=[project.pk]))
    rows = {row["username"]: row for row in response.context["annotators"]}
    assert set(rows) == {"annotator", "annotator2"}
    mine = rows["annotator"]
    assert mine["labels"] == 5 + 1 + 3
    assert mine["per_day"] == pytest.approx(9 / 7)
    assert mine["per_hour"] == pytest.approx(9 / ((6 * 12 + 3 * 3) / 3600))
    assert (mine["gold"].correct, mine["gold"].total) == (1, 1)
    assert rows["annotator2"]["gold"].total == 0
    # Agreement with the other annotator on the five pairs: they differ on the fourth only.
    assert (mine["comparison_agreement"].agreed, mine["comparison_agreement"].compared) == (4, 5)
    assert (mine["step_agreement"].agreed, mine["step_agreement"].compared) == (3, 3)
    (throughput,) = [
        s for s in _svgs(response.content.decode()) if s.get("aria-label").startswith("Labels per annotator")
    ]
    assert {g.get("data-series") for g in throughput.iter(f"{SVG}g") if g.get("class") == "legend-item"} == {
        "annotator",
        "annotator2",
    }


def test_overview_gives_the_median_time_per_kind_of_label_without_the_simulated_annotators(
    client, project, researcher, annotator, labelled, make_trajectory, django_user_model
):
    from feedback_app.annotator_time import AnnotatorTime

    new, old = labelled["pairs"][0]
    _compare(project, annotator, make_trajectory(), old, "a", seconds=40.0)  # comparisons: 11 x 12 s and one 40 s
    simulated = django_user_model.objects.create_user(username="sim-careful")
    _compare(project, simulated, new, old, "a", seconds=900.0)
    client.force_login(researcher)
    response = client.get(reverse("project-dashboard", args=[project.pk]))
    rows = {row["kind"]: row for row in response.context["label_time"]}
    assert (rows["Comparison"]["timed"], rows["Comparison"]["median"]) == (12, 12.0)
    assert (rows["Step label"]["timed"], rows["Step label"]["median"]) == (6, 3.0)
    assert (rows["Critique"]["timed"], rows["Critique"]["median"]) == (0, None)
    assert rows["Critique"]["default"] == AnnotatorTime().critique
    argument = response.context["label_time_argument"]
    assert argument == "comparison=12,step_label=3"
    assert AnnotatorTime.parse(argument).comparison == 12
    assert f'<code id="annotator-seconds">{argument}</code>' in response.content.decode()


def test_overview_counts_trajectories_per_policy_version(client, project, researcher, labelled):
    client.force_login(researcher)
    policies = client.get(reverse("project-dashboard", args=[project.pk])).context["policies"]
    by_name = {p["name"]: p for p in policies}
    assert by_name["v2"]["n"] == 6 and by_name["v2"]["successes"] == 5 and by_name["v2"]["success_rate"] == 1.0
    assert by_name["agent-v1"]["n"] == 7 and by_name["agent-v1"]["failures"] == 5
    assert "v3" not in by_name


def test_overview_of_an_empty_project_renders(client, project, researcher):
    client.force_login(researcher)
    response = client.get(reverse("project-dashboard", args=[project.pk]))
    assert response.status_code == 200
    assert b"No data" in response.content and b"The queue is empty" in response.content


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


@pytest.mark.parametrize("page", PAGES)
def test_page_queries_do_not_grow_with_the_number_of_labels(
    client, project, researcher, annotator, other_annotator, labelled, make_trajectory, page
):
    client.force_login(researcher)
    url = reverse(page, args=[project.pk])
    before = _queries(client, url)
    v2 = labelled["v2"]
    for _ in range(15):
        new, old = make_trajectory(policy_version=v2), make_trajectory()
        _compare(project, annotator, new, old, "a")
        _compare(project, other_annotator, new, old, "b")
    assert _queries(client, url) == before


def test_overview_makes_a_bounded_number_of_queries(
    client, project, researcher, labelled, django_assert_max_num_queries
):
    client.force_login(researcher)
    # 16, and up to 6 for the time per label (a count, then one median per kind of label that has timed labels).
    with django_assert_max_num_queries(22):
        client.get(reverse("project-dashboard", args=[project.pk]))


# --- models ----------------------------------------------------------------------------------------------------------


def _lineage(html: str) -> ET.Element:
    (svg,) = re.findall(r'<svg [^>]*class="lineage".*?</svg>', html, flags=re.S)
    return ET.fromstring(svg)


def test_models_page_draws_the_lineage_from_snapshot_to_run_to_version(client, project, researcher, labelled):
    client.force_login(researcher)
    graph = _lineage(client.get(reverse("project-models", args=[project.pk])).content.decode())
    nodes = {g.get("data-key"): g for g in graph.iter(f"{SVG}g") if g.get("class") == "lineage-node"}
    s, dpo, rm_run, failed = (labelled[k].pk for k in ("snapshot", "dpo", "rm_run", "failed"))
    base, v2, v3, rm = labelled["v2"].parent_id, labelled["v2"].pk, labelled["v3"].pk, labelled["rm"].pk
    assert set(nodes) == {
        f"snapshot-{s}",
        f"run-{dpo}",
        f"run-{rm_run}",
        f"run-{failed}",
        f"policy-{base}",
        f"policy-{v2}",
        f"policy-{v3}",
        f"model-{rm}",
    }  # the rollout run made no model: not drawn
    edges = {(p.get("data-source"), p.get("data-target")) for p in graph.iter(f"{SVG}path") if p.get("data-source")}
    assert edges == {
        (f"snapshot-{s}", f"run-{dpo}"),
        (f"snapshot-{s}", f"run-{rm_run}"),
        (f"policy-{base}", f"run-{dpo}"),  # the parent goes into the run that made the child ...
        (f"run-{dpo}", f"policy-{v2}"),
        (f"run-{rm_run}", f"model-{rm}"),
        (f"model-{rm}", f"run-{dpo}"),
        (f"policy-{v2}", f"policy-{v3}"),  # ... or straight to a child no run made
        (f"policy-{v2}", f"run-{failed}"),
    }


def test_lineage_nodes_link_to_their_run_pages(client, project, researcher, labelled):
    client.force_login(researcher)
    graph = _lineage(client.get(reverse("project-models", args=[project.pk])).content.decode())
    links = {
        a.find(f"{SVG}g").get("data-key"): a.get("href")
        for a in graph.iter(f"{SVG}a")
        if a.find(f"{SVG}g") is not None
    }
    dpo_url = reverse("training-run", args=[project.pk, labelled["dpo"].pk])
    assert links[f"run-{labelled['dpo'].pk}"] == dpo_url
    assert links[f"policy-{labelled['v2'].pk}"] == dpo_url
    assert links[f"model-{labelled['rm'].pk}"] == reverse("training-run", args=[project.pk, labelled["rm_run"].pk])
    assert f"policy-{labelled['v3'].pk}" not in links  # made by hand: no run page
    assert f"snapshot-{labelled['snapshot'].pk}" not in links


def test_models_page_lists_the_registry(client, project, researcher, labelled):
    client.force_login(researcher)
    html = client.get(reverse("project-models", args=[project.pk])).content.decode()
    for fragment in ('id="policy-', 'id="model-', "rm-1", "prefs-1", "abababababab", "DPO run"):
        assert fragment in html


def test_models_page_escapes_names(client, project, researcher, external_policy):
    PolicyVersion.objects.create(project=project, name="<script>x</script>", kind="external", parent=external_policy)
    client.force_login(researcher)
    html = client.get(reverse("project-models", args=[project.pk])).content.decode()
    assert "<script>x</script>" not in html
    _lineage(html)  # still well-formed


# --- leaderboard -----------------------------------------------------------------------------------------------------


def test_leaderboard_ranks_versions_by_bradley_terry_strength(client, project, researcher, labelled):
    client.force_login(researcher)
    rows = client.get(reverse("project-leaderboard", args=[project.pk])).context["rows"]
    assert [(row["rank"], row["policy"].name) for row in rows] == [(1, "v2"), (2, "agent-v1"), (None, "v3")]
    top = rows[0]["strength"]
    # 10 comparisons: 7 wins, 1 tie, 2 losses; the gold comparison is left out.
    assert (top.games, top.wins) == (10.0, 7.5)
    assert top.low < top.strength < top.high and top.strength > 0


def test_leaderboard_shows_success_reward_model_score_and_win_rate_beside_strength(
    client, project, researcher, labelled
):
    client.force_login(researcher)
    response = client.get(reverse("project-leaderboard", args=[project.pk]))
    v2 = response.context["rows"][0]
    assert v2["greedy"].value == 0.7  # the newest held-out figure
    assert v2["rm_score"].value == 1.25
    # As on the training page: every current comparison against the parent, gold included, ties half.
    assert v2["win_rate"]["n"] == 11 and v2["win_rate"]["value"] == pytest.approx(7.5 / 11)
    html = response.content.decode()
    row = re.search(rf'<tr id="rank-policy-{labelled["v3"].pk}">.*?</tr>', html, flags=re.S).group(0)
    assert "no comparisons" in row
    (chart,) = [svg for svg in _svgs(html) if svg.get("aria-label").startswith("Bradley-Terry")]
    assert [g.get("data-label") for g in chart.iter(f"{SVG}g") if g.get("class") == "interval"] == ["v2", "agent-v1"]


def test_leaderboard_and_training_page_queries_do_not_grow_with_the_versions(
    client, project, researcher, labelled, django_assert_max_num_queries
):
    client.force_login(researcher)
    pages = [reverse("project-leaderboard", args=[project.pk]), reverse("training", args=[project.pk])]
    before = []
    for url in pages:
        with CaptureQueriesContext(connection) as queries:
            client.get(url)
        before.append(len(queries))
    parent = labelled["v3"]
    for n in range(5):
        parent = PolicyVersion.objects.create(project=project, name=f"v{4 + n}", kind="external", parent=parent)
    for url, count in zip(pages, before, strict=True):
        with django_assert_max_num_queries(count):
            client.get(url)


def test_leaderboard_without_comparisons_lists_every_version_unranked(client, project, researcher, registry):
    client.force_login(researcher)
    response = client.get(reverse("project-leaderboard", args=[project.pk]))
    assert [row["rank"] for row in response.context["rows"]] == [None, None, None]
    assert response.content.decode().count("no comparisons") >= 3


def test_a_researcher_sets_the_query_strategy_from_the_overview(client, project, researcher):
    client.force_login(researcher)
    page = client.get(reverse("project-dashboard", args=[project.pk])).content.decode()
    assert 'name="query_strategy"' in page and 'value="disagreement"' in page
    response = client.post(reverse("project-query-strategy", args=[project.pk]), {"query_strategy": "disagreement"})
    assert response.status_code == 302
    project.refresh_from_db()
    assert project.query_strategy == "disagreement"


def test_a_bad_query_strategy_is_refused_naming_the_field(client, project, researcher):
    client.force_login(researcher)
    response = client.post(reverse("project-query-strategy", args=[project.pk]), {"query_strategy": "loudest"})
    assert response.status_code == 400 and response.content.decode().startswith("query_strategy: ")
    project.refresh_from_db()
    assert project.query_strategy == "random"


def test_annotators_and_outsiders_cannot_set_the_query_strategy(client, project, annotator, outsider):
    url = reverse("project-query-strategy", args=[project.pk])
    client.force_login(annotator)
    assert client.post(url, {"query_strategy": "uncertainty"}).status_code == 403
    client.force_login(outsider)
    assert client.post(url, {"query_strategy": "uncertainty"}).status_code == 404
    project.refresh_from_db()
    assert project.query_strategy == "random"
