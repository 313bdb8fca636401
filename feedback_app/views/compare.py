"""The compare page: two trajectories of one task side by side, step by step, and the annotator's preference.

One request per label: the submit stores the comparison and answers with the next item's workspace fragment.
Left and right are shuffled per assignment (labelling.displayed_order); the stored choice is in canonical a/b terms.
"""

from __future__ import annotations

import uuid

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from feedback_app import labelling, queue
from feedback_app.access import get_project_for_member, sees_outcomes
from feedback_app.hot_path import reads
from feedback_app.models import (
    Assignment,
    Comparison,
    LabelKind,
    Membership,
    Project,
    Step,
    Trajectory,
)
from feedback_app.models.projects import QueryStrategy
from feedback_app.models.queue import AssignmentStatus
from feedback_app.templatetags.tandem import mark_repeated_observations, step_card
from feedback_app.views.workspace import get_membership_and_assignment

TEMPLATE = "feedback_app/compare.html"
CHOICE_MESSAGE = "Choose left, right, tie or both bad."
STRENGTH_MESSAGE = "Strength is 1 (slight), 2 (clear) or 3 (decisive)."
EPISODE_ENDED = mark_safe('<p class="episode-ended">episode ended</p>')


class ComparisonForm(forms.Form):
    # What the annotator saw: left/right. The view translates it to the stored a/b with the displayed order.
    choice = forms.ChoiceField(
        choices=[("left", "Left is better"), ("right", "Right is better"), ("tie", "Tie"), ("both_bad", "Both bad")],
        error_messages={"required": CHOICE_MESSAGE, "invalid_choice": CHOICE_MESSAGE},
    )
    strength = forms.TypedChoiceField(
        choices=[(1, "slight"), (2, "clear"), (3, "decisive")],
        coerce=int,
        empty_value=None,
        required=False,
        error_messages={"invalid_choice": STRENGTH_MESSAGE},
    )
    rationale = forms.CharField(required=False, max_length=5000)
    client_token = forms.UUIDField(error_messages={"required": "The form lost its token; reload the page."})
    # The id of the stored answer this submit replaces, once the annotator has been shown it and confirmed.
    replaces = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1)

    def clean(self) -> dict:
        # A strength belongs to a preference; a tie or "both bad" is stored without one, whatever was ticked.
        data = super().clean()
        if data.get("choice") in ("left", "right") and data.get("strength") is None and "strength" not in self.errors:
            self.add_error("strength", STRENGTH_MESSAGE)
        return data


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
    project, membership, assignment = get_membership_and_assignment(
        request, project_pk, assignment_pk, LabelKind.COMPARISON
    )
    form = ComparisonForm(request.POST)
    if not form.is_valid():
        return _workspace(request, project, membership, assignment, form=form, status=400)
    data = form.cleaned_data
    if (answered := _answered_elsewhere(request.user, assignment, data)) is not None:
        confirmed = request.POST.copy()
        confirmed["replaces"] = str(answered.pk)
        form = ComparisonForm(confirmed)
        form.is_valid()
        notice = (
            f"You already answered this pair, in another tab or an earlier visit: {_answer_text(answered)}. "
            "Submit again to replace that answer with this one, or reload the page for the next pair."
        )
        return _workspace(request, project, membership, assignment, form=form, notice=notice, status=409)
    was_live = assignment.lease_is_live(timezone.now())
    try:
        stored = labelling.submit_comparison(
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
    # This submit finished the user's live lease, so there is none of this kind to resume (queue.next_assignment):
    # one query fewer. A repeated submit stored nothing, and gets the lease that the first one took.
    resume = not (was_live and stored.created)
    following = queue.next_assignment(request.user, project, kind=LabelKind.COMPARISON, resume=resume)
    return _workspace(request, project, membership, following)


def _answered_elsewhere(user, assignment: Assignment, data: dict) -> Comparison | None:
    """The stored answer to an item that was answered since this form was shown (a second tab, an old page), unless
    this submit repeats it (the same token) or the annotator confirmed replacing it; None when nothing stands in the
    way. A leased item has no answer yet: it needs no lookup."""
    if assignment.status != AssignmentStatus.DONE:
        return None
    item = assignment.item
    current = Comparison.objects.filter(
        annotator=user,
        trajectory_a_id=item.trajectory_id,
        trajectory_b_id=item.other_trajectory_id,
        is_current=True,
    ).first()
    if current is None or current.client_token == data["client_token"] or current.pk == data["replaces"]:
        return None
    return current


def _answer_text(label: Comparison) -> str:
    """A stored comparison as the annotator chose it, in the page's left/right terms."""
    shown = labelling.shown_choice(label.choice, label.displayed_order)
    words = {"left": "left is better", "right": "right is better", "tie": "a tie", "both_bad": "both bad"}[shown]
    strength = {1: "slight", 2: "clear", 3: "decisive"}.get(label.strength)
    return f"{words} ({strength})" if strength else words


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
    return assignment is not None and assignment.item.query_strategy == QueryStrategy.NEW_VS_PARENT


def _pair(assignment: Assignment, show_outcomes: bool) -> dict:
    """Both trajectories in the order shown, and their rendered steps aligned by index: row i holds i and step i of
    each (a note where that episode has ended)."""
    item = assignment.item
    trajectories = reads.pair_trajectories(item.trajectory_id, item.other_trajectory_id)
    a, b = trajectories[item.trajectory_id], trajectories[item.other_trajectory_id]
    left, right = (a, b) if labelling.displayed_order(assignment) == "ab" else (b, a)
    left_steps, right_steps = _rendered_steps(left, show_outcomes), _rendered_steps(right, show_outcomes)
    length = max([*left_steps, *right_steps], default=-1) + 1
    rows = [(i, left_steps.get(i, EPISODE_ENDED), right_steps.get(i, EPISODE_ENDED)) for i in range(length)]
    return {"task": a.task, "left": left, "right": right, "rows": rows}


def _rendered_steps(trajectory: Trajectory, show_outcomes: bool) -> dict[int, SafeString]:
    """The trajectory's steps rendered by `step_card`, by index (kept per process: `reads.rendered_steps`)."""

    def render(steps: list[Step]) -> dict[int, SafeString]:
        return {step.index: step_card(step, show_outcomes) for step in mark_repeated_observations(steps)}

    return reads.rendered_steps(trajectory, show_outcomes, render)
