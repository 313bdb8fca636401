"""Simulated annotators labelling a real server's queue over HTTP at the configured mistake rate, alone, as a crowd
and from the command line, and the client they label through (the teacher's own answers: test_teacher)."""

from __future__ import annotations

import json
import random

import pytest
from django.core.management import CommandError, call_command

from feedback_app.annotator_time import AnnotatorTime
from feedback_app.simulated.annotator import SimulatedAnnotator, run_crowd
from feedback_app.simulated.api_client import ApiClient, ApiError
from feedback_app.simulated.teacher import ScriptedTeacher, TeacherConfig
from reward_models.envs import GridWorld
from tests.feedback_app.simulated.test_teacher import binomial_bounds
from tests.trajectories import save_steps

# --- Through a real server --------------------------------------------------------------------------------------


def _store_trajectory(project, task, actions: list[str]):
    from feedback_app.models import Step, Trajectory

    trajectory = Trajectory.objects.create(project=project, task=task, source="import", num_steps=len(actions))
    save_steps(trajectory, [Step(index=i, observation=f"obs {i}", action=action) for i, action in enumerate(actions)])
    return trajectory


@pytest.fixture
def gridworld_pairs(project):
    """Comparisons of three trajectories per gridworld task (the shortest path, and the same cut one and two steps
    short), stored in a random order so the better one is sometimes the lower id; queued with strategy
    "uncertainty". Returns the oracle's preferred trajectory id for each queued pair."""
    from feedback_app.models import QueueItem, Task

    env, rng, better = GridWorld(), random.Random(0), {}
    project.gold_fraction = 0.0
    project.save(update_fields=["gold_fraction"])
    seed, pairs = 0, []
    while len(pairs) < 81:
        spec = env.make_task(seed)
        seed += 1
        oracle = env.oracle(spec)
        if oracle.shortest_path_length() < 3:
            continue
        task = Task.objects.create(project=project, seed=spec["seed"], instruction=spec["instruction"], spec=spec)
        path = []
        while not oracle.success(path):
            path.append(oracle.best_actions(path)[0])
        versions = [path, path[:-1], path[:-2]]
        rng.shuffle(versions)
        stored = [(_store_trajectory(project, task, actions), oracle.progress_return(actions)) for actions in versions]
        for i, (one, one_return) in enumerate(stored):
            for other, other_return in stored[i + 1 :]:
                pairs.append((one, other))
                better[frozenset((one.pk, other.pk))] = one.pk if one_return > other_return else other.pk
    QueueItem.objects.enqueue_comparisons(project, pairs, query_strategy="uncertainty", overlap=1)
    return better


def _actions(trajectory) -> tuple:
    return tuple(trajectory.steps.order_by("index").values_list("action", flat=True))


def test_a_simulated_annotator_labels_the_queue_over_http_at_its_mistake_rate(
    live_server, project, annotator, gridworld_pairs
):
    from feedback_app import labelling
    from feedback_app.models import ApiToken, Comparison, QueueItem

    class Recording(ScriptedTeacher):
        def compare(self, oracle, actions_a, actions_b):
            judged.append((tuple(actions_a), tuple(actions_b)))
            return super().compare(oracle, actions_a, actions_b)

    judged = []
    _, key = ApiToken.issue(annotator, "simulated")
    teacher = Recording(TeacherConfig(epsilon=0.25, seed=1))
    counts = SimulatedAnnotator(ApiClient(live_server.url, key), project.pk, teacher).run(kinds=("comparison",))

    n = len(gridworld_pairs)
    assert counts["comparison"] == counts["items"] == n and counts["skipped"] == counts["lost"] == 0
    assert not QueueItem.objects.filter(project=project, completed_count=0).exists()
    labels = list(
        Comparison.objects.filter(project=project).select_related(
            "assignment__item__trajectory", "assignment__item__other_trajectory"
        )
    )
    assert len(labels) == n
    agreed = 0
    for label in labels:
        oracle_choice = (
            "a"
            if gridworld_pairs[frozenset((label.trajectory_a_id, label.trajectory_b_id))] == (label.trajectory_a_id)
            else "b"
        )
        agreed += label.choice == oracle_choice
        # Labels carry the queue item's strategy and the left/right order the compare page would have shown.
        assert (label.annotator, label.query_strategy) == (annotator, "uncertainty")
        assert label.displayed_order == labelling.displayed_order(label.assignment)
        # Whichever side it was shown on, the teacher judged the pair in the item's own order.
        item = label.assignment.item
        assert (_actions(item.trajectory), _actions(item.other_trajectory)) in judged
    low, high = binomial_bounds(n, 0.75)
    assert low <= agreed <= high, (agreed, n)
    assert {label.displayed_order for label in labels} == {"ab", "ba"}
    # The client follows the API's absolute `next` links (bench/loop.py once joined one to its base URL and failed
    # on the first listing longer than a page).
    client, seen, path = ApiClient(live_server.url, key), [], f"/api/projects/{project.pk}/comparisons/?page_size=2"
    while path:
        page = client.get(path)
        seen += [label["id"] for label in page["results"]]
        path = page["next"]
    assert sorted(seen) == sorted(label.pk for label in labels) and n > 2


def _a_wrong_second_step(task) -> tuple:
    """The task's oracle, and four moves of which only the second is wrong: a shortest path's first move, a move off
    it, then the path's next two moves."""
    oracle = GridWorld().oracle({"seed": task.seed, "instruction": task.instruction, **task.spec})
    path = []
    while not oracle.success(path):
        path.append(oracle.best_actions(path)[0])
    wrong = next(a for a in ("up", "down", "left", "right") if a not in oracle.best_actions(path[:1]))
    return oracle, [path[0], wrong, *path[1:3]]


def test_a_simulated_annotator_labels_steps_critiques_and_intervenes_on_a_step_item(
    live_server, project, task, annotator
):
    from feedback_app.models import ApiToken, Assignment, Critique, Intervention, QueueItem, StepLabel

    oracle, actions = _a_wrong_second_step(task)
    wrong = actions[1]
    trajectory = _store_trajectory(project, task, actions)
    (item,) = QueueItem.objects.enqueue_trajectories(project, [trajectory], query_strategy="disagreement", overlap=1)
    _, key = ApiToken.issue(annotator, "simulated")

    time_model = AnnotatorTime(step_label=4, critique=50, intervention=35)
    client = ApiClient(live_server.url, key)
    counts = SimulatedAnnotator(client, project.pk, ScriptedTeacher(), time=time_model).run()

    assert counts == {
        "items": 1,
        "comparison": 0,
        "step_label": len(actions),
        "critique": 1,
        "intervention": 1,
        "skipped": 0,
        "lost": 0,
        "seconds": 4 * len(actions) + 50 + 35,
    }
    # Each label records the time the model gives its kind, as a person's records the time they took.
    assert set(StepLabel.objects.values_list("seconds_spent", flat=True)) == {4.0}
    assert Critique.objects.get().seconds_spent == 50 and Intervention.objects.get().seconds_spent == 35
    expected = [1 if ok else -1 for ok in oracle.step_correct(actions)]
    assert expected[1] == -1
    values = list(
        StepLabel.objects.filter(annotator=annotator).order_by("step__index").values_list("value", flat=True)
    )
    assert values == expected
    critique = Critique.objects.get(annotator=annotator)
    assert critique.text.startswith(f"step 2 is wrong : {wrong} moves away from the goal") and critique.step.index == 1
    intervention = Intervention.objects.get(annotator=annotator)
    assert intervention.step.index == 1 and intervention.corrected_action in oracle.best_actions(actions[:1])
    assignment = Assignment.objects.get(item=item)
    assert assignment.status == "done"
    item.refresh_from_db()
    assert item.completed_count == 1
    for model in (StepLabel, Critique, Intervention):
        assert set(model.objects.values_list("query_strategy", "assignment")) == {("disagreement", assignment.pk)}


def test_a_first_error_mark_labels_the_steps_up_to_the_first_wrong_one_for_the_mark_s_time(
    live_server, project, task, annotator
):
    from feedback_app.models import ApiToken, Assignment, QueueItem, StepLabel

    _, actions = _a_wrong_second_step(task)
    (item,) = QueueItem.objects.enqueue_trajectories(project, [_store_trajectory(project, task, actions)], overlap=1)
    _, key = ApiToken.issue(annotator, "simulated")
    teacher = ScriptedTeacher(TeacherConfig(first_error_marks=True, critiques=False, interventions=False))

    counts = SimulatedAnnotator(ApiClient(live_server.url, key), project.pk, teacher).run()

    labels = list(StepLabel.objects.order_by("step__index").values_list("step__index", "value", "seconds_spent"))
    mark = AnnotatorTime().first_error
    assert labels == [(0, 1, mark / 2), (1, -1, mark / 2)], "the steps after the first error stay unlabelled"
    assert (counts["step_label"], counts["items"], counts["seconds"]) == (2, 1, mark)
    assert Assignment.objects.get(item=item).status == "done"


def test_a_crowd_stops_at_its_time_budget_and_leaves_the_rest_queued(
    live_server, project, annotator, other_annotator, gridworld_pairs
):
    from feedback_app.models import ApiToken, Comparison

    keys = [ApiToken.issue(user, "simulated")[1] for user in (annotator, other_annotator)]
    each = AnnotatorTime().comparison
    members = [(keys[0], TeacherConfig(seed=1)), (keys[1], TeacherConfig(seed=2))]
    result = run_crowd(live_server.url, project.pk, members, environment=GridWorld(), max_seconds=5 * each)
    # Each member checks the budget before its next item: at most one item each past it.
    assert 5 <= result["total"]["comparison"] <= 6 and result["total"]["seconds"] <= 6 * each
    assert Comparison.objects.count() == result["total"]["comparison"] < len(gridworld_pairs)


def test_a_crowd_in_turn_answers_the_queue_in_order_one_item_each_and_stops_at_its_budget(
    live_server, project, annotator, other_annotator, gridworld_pairs
):
    from feedback_app.models import ApiToken, Comparison, QueueItem

    keys = [ApiToken.issue(user, "simulated")[1] for user in (annotator, other_annotator)]
    each = AnnotatorTime().comparison
    members = [(keys[0], TeacherConfig(seed=1)), (keys[1], TeacherConfig(seed=2))]
    result = run_crowd(
        live_server.url, project.pk, members, environment=GridWorld(), max_seconds=7 * each, in_turn=True
    )
    # The budget is checked before every item, in one thread: it stops on the dot.
    assert [counts["comparison"] for counts in result["members"]] == [4, 3]
    labels = list(Comparison.objects.order_by("pk").values_list("annotator", "assignment__item"))
    assert [user for user, _ in labels] == [annotator.pk, other_annotator.pk] * 3 + [annotator.pk]
    # The queue's own order (highest priority first, then oldest): nothing depends on when a lease lands.
    first = list(QueueItem.objects.filter(project=project).order_by("-priority", "pk").values_list("pk", flat=True))
    assert [item for _, item in labels] == first[:7]


def test_a_crowd_labels_each_item_once_per_slot(live_server, project, annotator, other_annotator, gridworld_pairs):
    from feedback_app.models import ApiToken, Comparison

    keys = [ApiToken.issue(user, "simulated")[1] for user in (annotator, other_annotator)]
    result = run_crowd(
        live_server.url,
        project.pk,
        [(keys[0], TeacherConfig(seed=1)), (keys[1], TeacherConfig(seed=2))],
        max_labels=10,
        environment=GridWorld(),
    )
    assert [counts["comparison"] for counts in result["members"]] == [10, 10]
    assert result["total"]["seconds"] == 20 * AnnotatorTime().comparison
    assert result["total"]["comparison"] == 20 == Comparison.objects.count()
    # Overlap 1: the two never labelled the same pair; a rational teacher always agrees with the oracle.
    pairs = {(c.trajectory_a_id, c.trajectory_b_id) for c in Comparison.objects.all()}
    assert len(pairs) == 20
    for label in Comparison.objects.all():
        assert gridworld_pairs[frozenset(pair := (label.trajectory_a_id, label.trajectory_b_id))] == (
            pair[0] if label.choice == "a" else pair[1]
        )


# --- The management command -------------------------------------------------------------------------------------


def test_the_command_runs_a_crowd_from_a_json_file(live_server, project, gridworld_pairs, tmp_path, capsys):
    from feedback_app.models import ApiToken, Comparison, Membership

    crowd = tmp_path / "crowd.json"
    crowd.write_text(json.dumps([{"name": "careful"}, {"name": "sloppy", "epsilon": 0.5, "beta": 2}]))
    call_command("simulate_annotators", project=str(project.pk), url=live_server.url, crowd=crowd, max_labels=3)
    out = capsys.readouterr().out
    assert "sim-careful: 3 items answered (3 comparisons" in out and "sim-sloppy: 3 items" in out
    assert "total: 6 items answered" in out and f"{6 * AnnotatorTime().comparison / 60:.1f} annotator minutes" in out
    members = Membership.objects.filter(project=project, user__username__in=["sim-careful", "sim-sloppy"])
    assert set(members.values_list("role", flat=True)) == {"annotator"} and members.count() == 2
    assert Comparison.objects.filter(annotator__username="sim-sloppy").count() == 3
    assert not ApiToken.objects.filter(name="simulate_annotators", revoked_at__isnull=True).exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"project": "no-such-project", "count": 1}, "project: no project with slug 'no-such-project'"),
        ({"count": 0}, "count: must be at least 1"),
        ({"count": 2, "epsilon": 1.5}, r"epsilon: must be in \[0, 1\]"),
        ({"count": 1, "max_labels": 0}, "max-labels: must be at least 1"),
        ({"count": 1, "annotator_seconds": "comparison=soon"}, "annotator-seconds: comparison: expected seconds"),
        ({"count": 1, "annotator_seconds": "coffee=5"}, "annotator-seconds: 'coffee=5': expected kind=seconds"),
    ],
)
def test_the_command_refuses_bad_options_naming_them(db, project, options, message):
    options = {"project": str(project.pk), **options}
    with pytest.raises(CommandError, match=message):
        call_command("simulate_annotators", **options)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "crowd: .* is not valid JSON"),
        ("[]", "crowd: give a non-empty JSON list"),
        ('[{"name": "a", "gama": 1}]', r"crowd\[0\]\.gama: unknown teacher setting"),
        ('[{"name": "a"}, {"name": "a"}]', r"crowd\[1\]\.name: 'a' is used twice"),
        ('[{"name": "a b"}]', r"crowd\[0\]\.name: letters, digits"),
    ],
)
def test_the_command_refuses_a_bad_crowd_file_naming_the_entry(db, project, tmp_path, content, message):
    crowd = tmp_path / "crowd.json"
    crowd.write_text(content)
    with pytest.raises(CommandError, match=message):
        call_command("simulate_annotators", project=project.slug, crowd=crowd)


def test_a_simulated_annotator_labels_a_tool_calling_trajectory_and_corrects_it_with_a_message(
    live_server, shop, annotator
):
    """On the tool shop an action is the assistant message itself: the teacher reads each turn's calls, names them
    in its critique, and corrects the first wrong one with the oracle's message, which the API checks against the
    tools' schemas."""
    from feedback_app.models import ApiToken, Critique, Intervention, QueueItem, StepLabel
    from reward_models.envs.base import message_action
    from reward_models.envs.toolshop import ToolShop

    project, trajectory, _ = shop
    env = ToolShop()
    steps = list(trajectory.steps.order_by("index"))
    oracle = env.oracle({"seed": 3, "instruction": trajectory.task.instruction})
    actions = [message_action(env, step.message) for step in steps]
    correct = oracle.step_correct(actions)
    assert False in correct, "the imported turns should hold a mistake"
    QueueItem.objects.enqueue_trajectories(project, [trajectory], overlap=1)
    _, key = ApiToken.issue(annotator, "simulated")

    counts = SimulatedAnnotator(ApiClient(live_server.url, key), project.pk, ScriptedTeacher()).run()

    assert counts["step_label"] == len(steps) and counts["critique"] == counts["intervention"] == 1
    values = list(StepLabel.objects.order_by("step__index").values_list("value", flat=True))
    assert values == [1 if ok else -1 for ok in correct]
    error = correct.index(False)
    critique = Critique.objects.get()
    assert critique.step == steps[error] and f"step {error + 1} is wrong : " in critique.text
    assert "(" in critique.text.split(" is wrong : ")[1]  # the call, written name(arguments)
    intervention = Intervention.objects.get()
    assert intervention.step == steps[error]
    assert intervention.corrected_message in [m for m in oracle.best_actions(actions[:error]) if isinstance(m, dict)]


def test_the_api_client_sends_a_request_again_after_a_busy_or_throttled_answer():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answers = [(503, b'{"detail": "busy"}'), (429, b'{"detail": "slow down"}'), (200, b'{"ok": true}')]
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            status, body = answers[len(seen) - 1]
            self.send_response(status)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ApiClient(f"http://127.0.0.1:{server.server_port}", "key")
        assert client.get("/api/projects/") == {"ok": True}
        assert seen == ["/api/projects/"] * 3
        answers[:] = [(503, b"{}")] * 2
        seen.clear()
        with pytest.raises(ApiError) as failed:
            ApiClient(f"http://127.0.0.1:{server.server_port}", "key", retries=1).get("/api/projects/")
        assert failed.value.status == 503 and len(seen) == 2
    finally:
        server.shutdown()
