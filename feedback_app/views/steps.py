"""The step-label page: one trajectory, step by step.

Each step gets +1 / 0 / -1 (the PRM800K scheme), with a "first error here" shortcut; critiques are anchored to the
whole trajectory, to a step, or to a character span of a step's text; a 1–5 score and a thumb rate the whole
trajectory. Every click is its own request that stores the label at once and swaps only the control it changed, so
nothing is lost if the annotator walks away. The annotator only ever sees their own labels.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.contrib.auth.decorators import login_required
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import reswap, retarget

from feedback_app import labelling, queue
from feedback_app.access import get_project_for_member, get_trajectory_for_member, sees_outcomes
from feedback_app.models import (
    Assignment,
    Critique,
    LabelKind,
    Membership,
    Project,
    Rating,
    Step,
    StepLabel,
    Trajectory,
)
from feedback_app.models.labels import StepLabelValue
from feedback_app.templatetags.tandem import mark_repeated_observations
from feedback_app.views.workspace import get_own_assignment

DEFAULT_TAGS = (
    "wrong direction",
    "hit wall",
    "loops",
    "reasoning contradicts action",
    "ignores the observation",
    "gives up",
)

CRITIQUE_FIELDS = ("text", "step", "span_field", "span_start", "span_end", "tags")


# Pages ---------------------------------------------------------------------------------------------------------------


@require_GET
@login_required
@vary_on_headers("HX-Request")
def label_next(request: HttpRequest, project_pk: int) -> HttpResponse:
    """The annotator's current step-label item (a reload resumes it), else the next one, else "nothing left"."""
    project, membership = get_project_for_member(request, project_pk)
    return _workspace(request, membership, _next_assignment(request, project))


@require_GET
@login_required
@vary_on_headers("HX-Request")
def trajectory_steps(request: HttpRequest, project_pk: int, trajectory_pk: int) -> HttpResponse:
    """The same page for any trajectory a member can see, outside the queue."""
    trajectory, membership = get_trajectory_for_member(request, project_pk, trajectory_pk)
    return _workspace(request, membership, None, trajectory=trajectory)


# Step labels -------------------------------------------------------------------------------------------------------


@require_POST
@login_required
def step_label(request: HttpRequest, project_pk: int, trajectory_pk: int, index: int) -> HttpResponse:
    """Store one step's +1 / 0 / -1 and answer with that step's label control."""
    trajectory, membership = trajectory_for_member(request, project_pk, trajectory_pk)
    step = step_or_404(trajectory, index)
    assignment = _posted_assignment(request, membership.project)
    errors: dict[str, list[str]] = {}
    try:
        value = _integer(request.POST.get("value"), "value", "A step label is +1, 0 or -1")
        labelling.label_step(
            request.user,
            trajectory,
            step.index,
            value,
            assignment=assignment,
            client_token=_client_token(request),
        )
    except ValidationError as exc:
        errors = errors_by_field(exc, ["value", "step"])
    if not request.htmx and not errors:
        return HttpResponseRedirect(_page_url(membership.project, trajectory, assignment), status=303)
    return _label_control(request, trajectory, step, assignment, errors)


@require_POST
@login_required
def first_error(request: HttpRequest, project_pk: int, trajectory_pk: int, index: int) -> HttpResponse:
    """Label every earlier step +1 and this one -1; answer with every step's label control (out-of-band swaps)."""
    trajectory, membership = trajectory_for_member(request, project_pk, trajectory_pk)
    step = step_or_404(trajectory, index)
    assignment = _posted_assignment(request, membership.project)
    try:
        labelling.label_first_error(
            request.user, trajectory, step.index, assignment=assignment, client_token=_client_token(request)
        )
    except ValidationError as exc:
        return _label_control(request, trajectory, step, assignment, errors_by_field(exc, ["step"]))
    if not request.htmx:
        return HttpResponseRedirect(_page_url(membership.project, trajectory, assignment), status=303)
    steps = _attach_my_labels(request.user, trajectory.steps.order_by("index"))
    context = {"project": membership.project, "trajectory": trajectory, "steps": steps, "assignment": assignment}
    return reswap(render(request, "feedback_app/_step_label_controls_oob.html", context), "none")


def _label_control(request, trajectory: Trajectory, step: Step, assignment, errors: dict) -> HttpResponse:
    """One step's label control showing the user's current label, with `errors` beside it (then status 400)."""
    _attach_my_labels(request.user, [step])
    context = {"project": trajectory.project, "trajectory": trajectory, "step": step, "assignment": assignment}
    return render(
        request, "feedback_app/_step_label_control.html", context | {"errors": errors}, status=400 if errors else 200
    )


@require_POST
@login_required
@vary_on_headers("HX-Request")
def finish(request: HttpRequest, project_pk: int, assignment_pk: int) -> HttpResponse:
    """Hand in a step-label assignment and answer with the next item; unlabelled steps are marked beside each step."""
    project, membership = get_project_for_member(request, project_pk)
    assignment = get_own_assignment(request, project, assignment_pk, kind=LabelKind.STEP_LABEL)
    trajectory = assignment.item.trajectory
    trajectory.project = project
    try:
        labelling.finish_step_labels(request.user, assignment)
    except ValidationError as exc:
        steps = _attach_my_labels(request.user, trajectory.steps.order_by("index"))
        missing = _unlabelled(steps)
        for step in steps:
            step.needs_label = step.index in missing
        context = {
            "project": project,
            "trajectory": trajectory,
            "assignment": assignment,
            "unlabelled_steps": [step for step in steps if step.needs_label],
            "errors": errors_by_field(exc, ["steps"]),
        }
        return render(request, "feedback_app/_finish.html", context, status=400)
    except queue.LeaseLost as exc:
        response = _workspace(request, membership, _next_assignment(request, project), notice=str(exc), status=409)
        return retarget(response, "#workspace") if request.htmx else response
    if not request.htmx:
        return HttpResponseRedirect(reverse("label-next", args=[project.pk]), status=303)
    response = _workspace(request, membership, _next_assignment(request, project))
    return reswap(retarget(response, "#workspace"), "outerHTML show:window:top")


# Critiques and ratings --------------------------------------------------------------------------------------------


@require_POST
@login_required
def critique(request: HttpRequest, project_pk: int, trajectory_pk: int) -> HttpResponse:
    """Store a critique of the trajectory, a step, or a span of a step's field; answer with the critique panel."""
    trajectory, membership = trajectory_for_member(request, project_pk, trajectory_pk)
    assignment = _posted_assignment(request, membership.project)
    values = {
        "text": request.POST.get("text", ""),
        "step_index": request.POST.get("step_index", ""),
        "span_field": request.POST.get("span_field", ""),
        "span_start": request.POST.get("span_start", ""),
        "span_end": request.POST.get("span_end", ""),
        "tags": request.POST.getlist("tags"),
        "more_tags": request.POST.get("more_tags", ""),
    }
    errors: dict[str, list[str]] = {}
    try:
        labelling.add_critique(
            request.user,
            trajectory,
            text=values["text"],
            step_index=_optional_integer(values["step_index"], "step", "A step number"),
            span_field=values["span_field"],
            span_start=_optional_integer(values["span_start"], "span_start", "A span start"),
            span_end=_optional_integer(values["span_end"], "span_end", "A span end"),
            tags=[*values["tags"], *values["more_tags"].split(",")],
            assignment=assignment,
            client_token=_client_token(request),
        )
    except ValidationError as exc:
        errors = errors_by_field(exc, CRITIQUE_FIELDS)
    if not request.htmx and not errors:
        return HttpResponseRedirect(_page_url(membership.project, trajectory, assignment), status=303)
    context = _critique_context(request.user, membership.project, trajectory, assignment)
    if errors:
        context |= {"errors": errors, "values": values}
    return render(request, "feedback_app/_critique_panel.html", context, status=400 if errors else 200)


@require_POST
@login_required
def rating(request: HttpRequest, project_pk: int, trajectory_pk: int) -> HttpResponse:
    """Store the trajectory's 1–5 score and/or thumb; a click on one keeps the other as it was."""
    trajectory, membership = trajectory_for_member(request, project_pk, trajectory_pk)
    assignment = _posted_assignment(request, membership.project)
    current = _my_rating(request.user, trajectory)
    errors: dict[str, list[str]] = {}
    try:
        score = _optional_integer(request.POST.get("score", ""), "score", "A score")
        thumb = request.POST.get("thumb", "")
        if thumb not in ("", "up", "down"):
            raise ValidationError({"thumb": f"A thumb is up or down, not {thumb!r}."})
        labelling.rate(
            request.user,
            trajectory,
            score=score if score is not None else (current.score if current else None),
            thumb_up={"up": True, "down": False}.get(thumb, current.thumb_up if current else None),
            comment=current.comment if current else "",
            assignment=assignment,
            client_token=_client_token(request),
        )
    except ValidationError as exc:
        errors = errors_by_field(exc, ["score", "thumb"])
    if not request.htmx and not errors:
        return HttpResponseRedirect(_page_url(membership.project, trajectory, assignment), status=303)
    context = {
        "project": membership.project,
        "trajectory": trajectory,
        "assignment": assignment,
        "rating": _my_rating(request.user, trajectory),
        "rating_token": uuid.uuid4(),
        "errors": errors,
    }
    return render(request, "feedback_app/_rating.html", context, status=400 if errors else 200)


# Helpers -----------------------------------------------------------------------------------------------------------


def _next_assignment(request: HttpRequest, project: Project) -> Assignment | None:
    assignment = queue.next_assignment(request.user, project, kind=LabelKind.STEP_LABEL)
    if assignment is not None:
        assignment.item.trajectory = Trajectory.objects.select_related("task", "policy_version", "parent").get(
            pk=assignment.item.trajectory_id
        )
    return assignment


def _workspace(
    request: HttpRequest,
    membership: Membership,
    assignment: Assignment | None,
    *,
    trajectory: Trajectory | None = None,
    notice: str = "",
    status: int = 200,
) -> HttpResponse:
    """The page, or for htmx only its #workspace fragment: the assignment's trajectory (or `trajectory`), or
    "nothing left" when there is neither."""
    project = membership.project
    trajectory = assignment.item.trajectory if assignment is not None else trajectory
    context = {"project": project, "membership": membership, "notice": notice}
    if trajectory is not None:
        context |= _page_context(request, trajectory, membership, assignment)
    template_name = "feedback_app/steps.html#workspace" if request.htmx else "feedback_app/steps.html"
    return render(request, template_name, context, status=status)


def _page_context(request: HttpRequest, trajectory: Trajectory, membership: Membership, assignment) -> dict:
    project = membership.project
    trajectory.project = project  # already fetched with the membership; saves a query per label call
    show_outcomes = sees_outcomes(membership)
    steps = _attach_my_labels(request.user, trajectory.steps.order_by("index"))
    kinds = set(project.feedback_kinds)
    return {
        "trajectory": trajectory,
        "steps": steps,
        "assignment": assignment,
        "show_outcomes": show_outcomes,
        "show_policy_names": show_outcomes or not project.blind,
        "collects_critiques": LabelKind.CRITIQUE in kinds,
        "collects_ratings": LabelKind.RATING in kinds,
        "collects_interventions": LabelKind.INTERVENTION in kinds,
        "rating": _my_rating(request.user, trajectory),
        "rating_token": uuid.uuid4(),
        **_critique_context(request.user, project, trajectory, assignment, steps=steps),
    }


def _critique_context(user, project: Project, trajectory: Trajectory, assignment, *, steps=None) -> dict:
    critiques = list(
        Critique.objects.filter(annotator=user, trajectory=trajectory, is_current=True)
        .select_related("step")
        .order_by("created_at", "id")
    )
    for critique in critiques:
        if critique.span_field:
            critique.quote = getattr(critique.step, critique.span_field)[critique.span_start : critique.span_end]
    return {
        "project": project,
        "trajectory": trajectory,
        "assignment": assignment,
        "critique_steps": steps if steps is not None else trajectory.steps.order_by("index").only("pk", "index"),
        "critiques": critiques,
        "default_tags": DEFAULT_TAGS,
        "critique_token": uuid.uuid4(),
        "values": {"tags": []},
    }


def _attach_my_labels(user, steps: Iterable[Step]) -> list[Step]:
    """Give each step the user's own current label (`my_label`) and a fresh client token, in one query (and mark the
    observations that only repeat the step before's tool results)."""
    steps = mark_repeated_observations(steps)
    labels = dict(
        StepLabel.objects.filter(annotator=user, step__in=[step.pk for step in steps], is_current=True).values_list(
            "step_id", "value"
        )
    )
    for step in steps:
        step.my_label = labels.get(step.pk)
        step.client_token = uuid.uuid4()
    return steps


def _unlabelled(steps: list[Step]) -> set[int]:
    """The steps finish_step_labels still wants: every step up to the first -1 (or every step) without a label."""
    first_bad = next((step.index for step in steps if step.my_label == StepLabelValue.BAD), None)
    return {step.index for step in steps if step.my_label is None and (first_bad is None or step.index < first_bad)}


def _my_rating(user, trajectory: Trajectory) -> Rating | None:
    return Rating.objects.filter(annotator=user, trajectory=trajectory, is_current=True).first()


def trajectory_for_member(request: HttpRequest, project_pk: int, trajectory_pk: int) -> tuple[Trajectory, Membership]:
    """The trajectory (404 for outsiders), with its project taken from the membership instead of another query."""
    trajectory, membership = get_trajectory_for_member(request, project_pk, trajectory_pk)
    trajectory.project = membership.project
    return trajectory, membership


def step_or_404(trajectory: Trajectory, index: int) -> Step:
    step = trajectory.steps.filter(index=index).first()
    if step is None:
        raise Http404(f"Trajectory {trajectory.pk} has no step {index + 1}; it has {trajectory.num_steps} steps.")
    return step


def _posted_assignment(request: HttpRequest, project: Project) -> Assignment | None:
    pk = request.POST.get("assignment", "")
    if not pk:
        return None
    if not pk.isdigit():
        raise Http404("No such assignment.")
    return get_own_assignment(request, project, int(pk))


def _page_url(project: Project, trajectory: Trajectory, assignment: Assignment | None) -> str:
    if assignment is not None:
        return reverse("label-next", args=[project.pk])
    return reverse("trajectory-steps", args=[project.pk, trajectory.pk])


def _client_token(request: HttpRequest) -> uuid.UUID | None:
    token = request.POST.get("client_token", "")
    if not token:
        return None
    try:
        return uuid.UUID(token)
    except ValueError:
        raise ValidationError({"client_token": "The form's token is damaged; reload the page."}) from None


def _integer(raw, field: str, what: str) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ValidationError({field: f"{what} is a whole number, not {raw!r}."}) from None


def _optional_integer(raw: str, field: str, what: str) -> int | None:
    return None if raw in ("", None) else _integer(raw, field, what)


def errors_by_field(exc: ValidationError, fields: Iterable[str] = ()) -> dict[str, list[str]]:
    """Messages by field, so each shows beside its field. Messages about anything not in `fields` (the form, the
    assignment, the project's settings) go under "form", shown at the top of the form."""
    by_key = exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD_ERRORS: exc.messages}
    errors: dict[str, list[str]] = {}
    for key, messages in by_key.items():
        errors.setdefault(key if key in fields else "form", []).extend(messages)
    return errors
