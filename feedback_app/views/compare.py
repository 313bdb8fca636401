"""The compare page: two trajectories of one task side by side, step by step, and the annotator's preference.

One request per label: the submit stores the comparison and answers with the next item's workspace fragment.
Left and right are shuffled per assignment (labelling.displayed_order); the stored choice is in canonical a/b terms.
"""

from __future__ import annotations

import uuid
from itertools import groupby

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.template.loader import get_template
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from feedback_app import labelling, queue
from feedback_app.access import get_project_for_member, sees_outcomes
from feedback_app.models import Assignment, LabelKind, Membership, Project, Step, Trajectory
from feedback_app.views.workspace import get_own_assignment

TEMPLATE = "feedback_app/compare.html"
CHOICE_MESSAGE = "Choose left, right, tie or both bad."
STRENGTH_MESSAGE = "Strength is 1 (slight), 2 (clear) or 3 (decisive)."
STEP_CACHE_SECONDS = 3600


class ComparisonForm(forms.Form):
    # What the annotator saw: left/right. The view translates it to the stored a/b with the displayed order.
    choice = forms.ChoiceField(
        choices=[("left", "Left is better"), ("right", "Right is better"), ("tie", "Tie"), ("both_bad", "Both bad")],
        error_messages={"required": CHOICE_MESSAGE, "invalid_choice": CHOICE_MESSAGE},
    )
    strength = forms.TypedChoiceField(
        choices=[(1, "slight"), (2, "clear"), (3, "decisive")],
        coerce=int,
        error_messages={"required": STRENGTH_MESSAGE, "invalid_choice": STRENGTH_MESSAGE},
    )
    rationale = forms.CharField(required=False, max_length=5000)
    client_token = forms.UUIDField(error_messages={"required": "The form lost its token; reload the page."})


@require_GET
@login_required
@vary_on_headers("HX-Request")
def compare_next(request: HttpRequest, project_pk: int) -> HttpResponse:
    """The user's current comparison (a reload resumes it), else the next one from the queue."""
    project, membership = get_project_for_member(request, project_pk)
    assignment = queue.next_assignment(request.user, project, kind=LabelKind.COMPARISON)
    return _workspace(request, project, membership, assignment)


@require_POST
@login_required
@vary_on_headers("HX-Request")
def compare_submit(request: HttpRequest, project_pk: int, assignment_pk: int) -> HttpResponse:
    """Store the comparison and answer with the next item (a redirect to it without htmx)."""
    project, membership = get_project_for_member(request, project_pk)
    assignment = get_own_assignment(request, project, assignment_pk, kind=LabelKind.COMPARISON)
    form = ComparisonForm(request.POST)
    if not form.is_valid():
        return _workspace(request, project, membership, assignment, form=form, status=400)
    data = form.cleaned_data
    try:
        labelling.submit_comparison(
            request.user,
            assignment,
            choice=labelling.canonical_choice(data["choice"], labelling.displayed_order(assignment)),
            strength=data["strength"],
            rationale=data["rationale"],
            client_token=data["client_token"],
        )
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, messages)
        return _workspace(request, project, membership, assignment, form=form, status=400)
    except queue.LeaseLost as exc:
        following = queue.next_assignment(request.user, project, kind=LabelKind.COMPARISON)
        return _workspace(request, project, membership, following, notice=str(exc), status=409)
    if not request.htmx:
        return HttpResponseRedirect(reverse("compare-next", args=[project.pk]), status=303)
    following = queue.next_assignment(request.user, project, kind=LabelKind.COMPARISON)
    return _workspace(request, project, membership, following)


def _workspace(
    request: HttpRequest,
    project: Project,
    membership: Membership,
    assignment: Assignment | None,
    *,
    form: ComparisonForm | None = None,
    notice: str = "",
    status: int = 200,
) -> HttpResponse:
    """The page, or for htmx only its #workspace fragment, for `assignment` (None: the queue is empty)."""
    context = {
        "project": project,
        "assignment": assignment,
        "notice": notice,
        # Blind review hides policy names and outcomes from everyone; annotators never see outcomes. A new policy
        # version's comparisons against its parent are always blind.
        "show_policy_names": not project.blind and not _reviews_new_version(assignment),
        "show_outcomes": sees_outcomes(membership) and not project.blind and not _reviews_new_version(assignment),
    }
    if assignment is not None:
        context.update(_pair(assignment, context["show_outcomes"]))
        context["form"] = form or ComparisonForm(initial={"strength": 2, "client_token": uuid.uuid4()})
    template_name = TEMPLATE + "#workspace" if request.htmx else TEMPLATE
    return render(request, template_name, context, status=status)


def _reviews_new_version(assignment: Assignment | None) -> bool:
    return assignment is not None and assignment.item.query_strategy == queue.REVIEW_STRATEGY


def _pair(assignment: Assignment, show_outcomes: bool) -> dict:
    """Both trajectories in the order shown, and their rendered steps aligned by index: row i holds step i of each
    (None where that episode has ended)."""
    item = assignment.item
    # Only what the page shows: the oracle and metadata can be large, and annotators never see them.
    trajectories = (
        Trajectory.objects.select_related("task", "policy_version")
        .only("created_at", "success", "task__instruction", "policy_version__name")
        .in_bulk([item.trajectory_id, item.other_trajectory_id])
    )
    a, b = trajectories[item.trajectory_id], trajectories[item.other_trajectory_id]
    left, right = (a, b) if labelling.displayed_order(assignment) == "ab" else (b, a)
    columns = _rendered_steps([left, right], show_outcomes)
    left_steps, right_steps = columns[left.pk], columns[right.pk]
    length = max([*left_steps, *right_steps], default=-1) + 1
    rows = [(left_steps.get(i), right_steps.get(i)) for i in range(length)]
    return {"task": a.task, "left": left, "right": right, "rows": rows}


def _rendered_steps(trajectories: list[Trajectory], show_outcomes: bool) -> dict[int, dict[int, SafeString]]:
    """Each trajectory's steps rendered with _step.html, by index; one query for those not in the cache.

    Steps never change once stored, and a trajectory is shown in many comparisons (every pair it belongs to, times
    the overlap), so its rendered steps are cached. The key holds the creation time as well as the id, so a reused
    id (SQLite reuses them after a rollback) never finds another trajectory's steps.
    """
    keys = {
        t.pk: f"tandem:compare-steps:v1:{t.pk}:{t.created_at.timestamp()}:{int(show_outcomes)}" for t in trajectories
    }
    cached = cache.get_many(keys.values())
    columns = {pk: cached[key] for pk, key in keys.items() if key in cached}
    missing = [pk for pk in keys if pk not in columns]
    if missing:
        template = get_template("feedback_app/_step.html")
        steps = Step.objects.filter(trajectory__in=missing).order_by("trajectory_id", "index")
        for pk, group in groupby(steps, lambda step: step.trajectory_id):
            columns[pk] = {s.index: template.render({"step": s, "show_outcomes": show_outcomes}) for s in group}
        fresh = {pk: columns.setdefault(pk, {}) for pk in missing}
        cache.set_many({keys[pk]: column for pk, column in fresh.items()}, STEP_CACHE_SECONDS)
    return {pk: {index: mark_safe(html) for index, html in column.items()} for pk, column in columns.items()}
