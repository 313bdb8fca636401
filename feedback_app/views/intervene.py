"""Intervening on a trajectory: correct the action at one step (and, in takeover mode, play more steps by hand), then
let the current policy continue from there on a rollout worker.

The page replays the episode in the environment on the server to show the state after the annotator's actions and
the legal actions there: one environment reset and a handful of steps per click, which is cheap for the gridworld.
The status page polls every second until the continuation is done, then shows the child trajectory with the
annotator's steps marked.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseClientRedirect

from feedback_app import labelling
from feedback_app.access import get_project_for_member, sees_outcomes
from feedback_app.interventions import (
    NotReplayable,
    legal_actions_at,
    offered_tools,
    replay_correction,
    task_spec,
    turn_message,
)
from feedback_app.models import Intervention, Membership, Step, Trajectory
from feedback_app.models.labels import InterventionStatus
from feedback_app.views.chat_turn import attach_errors, editor_message, read_editor
from feedback_app.views.steps import errors_by_field, step_or_404, trajectory_for_member
from feedback_app.views.workspace import get_own_assignment

TEMPLATE = "feedback_app/intervene.html"
STATUS_TEMPLATE = "feedback_app/_intervention_status.html"
PLAY_FIELDS = ("corrected_action", "takeover_actions", "step")
FORM_FIELDS = (*PLAY_FIELDS, "corrected_reasoning", "reason")
# Keys for the gridworld's moves: arrows and w a s d. Any other environment's actions get the digits 1–9.
MOVE_KEYS = {"up": "w ArrowUp", "left": "a ArrowLeft", "down": "s ArrowDown", "right": "d ArrowRight"}


@dataclass
class Play:
    """What the annotator has played so far at the intervened step, and the state it leads to."""

    corrected_action: str = ""
    takeover_actions: list[str] = field(default_factory=list)
    takeover: bool = False
    render: dict[str, Any] = field(default_factory=dict)
    legal_actions: list[str] = field(default_factory=list)
    replayed: bool = False  # `render` is the state after the annotator's actions, not the step's own
    ended: bool = False
    errors: dict[str, list[str]] = field(default_factory=dict)
    not_replayable: str = ""  # why the environment cannot continue this trajectory, when it cannot

    @property
    def buttons(self) -> list[tuple[str, str]]:
        """Each legal action with the keys that play it."""
        digits = iter("123456789")
        return [(action, MOVE_KEYS.get(action) or next(digits, "")) for action in self.legal_actions]

    @property
    def played(self) -> list[str]:
        return [self.corrected_action, *self.takeover_actions] if self.corrected_action else []


@require_http_methods(["GET", "POST"])
@login_required
@vary_on_headers("HX-Request")
def intervene(request: HttpRequest, project_pk: int, trajectory_pk: int, index: int) -> HttpResponse:
    """GET: the page (or, for htmx, the play panel after a pick, undo or mode switch). POST: store the
    intervention, enqueue its continuation, and go to its status page."""
    trajectory, membership = trajectory_for_member(request, project_pk, trajectory_pk)
    step = step_or_404(trajectory, index)
    params = request.POST if request.method == "POST" else request.GET
    assignment = _assignment(request, membership, params.get("assignment", ""))
    prefix = list(trajectory.steps.filter(index__lt=index).order_by("index"))
    tools = offered_tools(trajectory)
    interactive = request.method == "GET"
    # A task with tools is corrected with a chat turn (text and tool calls); the others by picking actions.
    editor = read_editor(params, tools, interactive=interactive) if tools else None
    play = _play(trajectory, step, prefix, params, interactive=interactive and editor is None)
    if request.method == "GET" or play.not_replayable:
        context = _context(request, membership, trajectory, step, prefix, play, assignment) | {"editor": editor}
        template_name = TEMPLATE + "#play" if request.htmx and not play.not_replayable else TEMPLATE
        refused = play.errors or (play.not_replayable and request.method == "POST")
        return render(request, template_name, context, status=400 if refused else 200)

    values = {"corrected_reasoning": params.get("corrected_reasoning", ""), "reason": params.get("reason", "")}
    try:
        client_token = uuid.UUID(params.get("client_token", ""))
    except ValueError:
        client_token = None
    correction: dict[str, Any] = {"corrected_action": play.corrected_action, "takeover_actions": play.takeover_actions}
    try:
        if editor is not None:
            message, readable = editor_message(editor, tools)
            if not readable:
                raise ValidationError({})
            correction = {"corrected_message": message, "reason": values["reason"]}
        else:
            correction |= values
        stored = labelling.intervene(
            request.user,
            trajectory,
            step_index=step.index,
            assignment=assignment,
            client_token=client_token,
            **correction,
        )
    except ValidationError as exc:
        found = exc.message_dict if hasattr(exc, "error_dict") else {"form": exc.messages}
        if editor is not None:
            found = attach_errors(editor, found)
        errors = errors_by_field(ValidationError(found), FORM_FIELDS) if found else {}
        context = _context(request, membership, trajectory, step, prefix, play, assignment)
        context |= {"errors": errors, "values": values, "client_token": client_token or uuid.uuid4(), "editor": editor}
        template_name = TEMPLATE + "#form" if request.htmx else TEMPLATE
        return render(request, template_name, context, status=400)
    status_url = reverse("intervention-status", args=[membership.project.pk, stored.label.pk])
    return HttpResponseClientRedirect(status_url) if request.htmx else HttpResponseRedirect(status_url, status=303)


@require_GET
@login_required
@vary_on_headers("HX-Request")
def intervention_status(request: HttpRequest, project_pk: int, intervention_pk: int) -> HttpResponse:
    """The continuation's progress (polled every second while it runs), then the child trajectory or the error.
    Only the intervention's author and the project's researchers and admins may see it."""
    project, membership = get_project_for_member(request, project_pk)
    intervention = (
        Intervention.objects.select_related("step", "trajectory", "trajectory__task", "child_trajectory")
        .filter(project=project, pk=intervention_pk)
        .first()
    )
    if intervention is None or not (intervention.annotator_id == request.user.pk or membership.can_manage):
        raise Http404("No such intervention.")
    child_steps: list[Step] = []
    if intervention.status == InterventionStatus.DONE and intervention.child_trajectory_id:
        child_steps = list(intervention.child_trajectory.steps.order_by("index"))
        branch = intervention.step.index
        human = range(branch, branch + 1 + len(intervention.takeover_actions))
        for child_step in child_steps:
            child_step.by_human = child_step.index in human
            child_step.from_parent = child_step.index < branch
    context = {
        "project": project,
        "intervention": intervention,
        "trajectory": intervention.trajectory,
        "child": intervention.child_trajectory,
        "child_steps": child_steps,
        "last_human_step": intervention.step.index + 1 + len(intervention.takeover_actions),
        "polling": intervention.status in (InterventionStatus.PENDING, InterventionStatus.RUNNING),
        "show_outcomes": sees_outcomes(membership),
    }
    template_name = STATUS_TEMPLATE + "#status" if request.htmx else STATUS_TEMPLATE
    return render(request, template_name, context)


# Helpers -----------------------------------------------------------------------------------------------------------


def _play(trajectory: Trajectory, step: Step, prefix: list[Step], params: QueryDict, *, interactive: bool) -> Play:
    """The annotator's actions from the submitted fields, after a pick, an undo or a mode switch (`interactive`),
    replayed in the environment to find the state they lead to and the legal actions there."""
    play = Play(
        corrected_action=params.get("corrected_action", "").strip(),
        takeover_actions=[action.strip() for action in params.getlist("takeover_actions") if action.strip()],
        takeover=params.get("mode") == "takeover",
    )
    if interactive:
        if params.get("switch") in ("takeover", "correct"):
            play.takeover = params["switch"] == "takeover"
        pick = params.get("pick", "").strip()
        if pick and play.takeover and play.corrected_action:
            play.takeover_actions.append(pick)
        elif pick:
            play.corrected_action = pick
        if params.get("undo"):
            if play.takeover_actions:
                play.takeover_actions.pop()
            else:
                play.corrected_action = ""
    if not play.takeover:
        play.takeover_actions = []
    play.render = step.render
    try:
        if not play.corrected_action:
            play.legal_actions = legal_actions_at(trajectory, step.index)
            return play
        env = trajectory.project.environment.load()
        results = replay_correction(
            env,
            task_spec(trajectory.task),
            [earlier.message for earlier in prefix],
            turn_message(env, play.corrected_action),
            [turn_message(env, action) for action in play.takeover_actions],
        )
    except NotReplayable as exc:
        play.not_replayable = " ".join(exc.messages)
        return play
    except ValidationError as exc:
        play.errors = errors_by_field(exc, PLAY_FIELDS)
        if not play.legal_actions and "step" not in play.errors:
            play.legal_actions = legal_actions_at(trajectory, step.index)
        return play
    play.render = env.render(results[-1].observation)
    play.replayed = True
    play.ended = results[-1].done
    play.legal_actions = [] if play.ended else env.legal_actions()
    return play


def _context(request, membership: Membership, trajectory, step, prefix, play: Play, assignment) -> dict:
    project = membership.project
    show_outcomes = sees_outcomes(membership)
    earlier = Intervention.objects.filter(annotator=request.user, step=step).order_by("-created_at", "-id")
    return {
        "project": project,
        "trajectory": trajectory,
        "step": step,
        # The page's own URL, for the fragments (the play panel, the form) that are rendered on their own.
        "intervene_url": reverse("intervene", args=[project.pk, trajectory.pk, step.index]),
        "prefix": prefix,
        "play": play,
        "errors": play.errors,
        "values": {},
        "assignment": assignment,
        "client_token": uuid.uuid4(),
        "earlier_interventions": earlier,
        "show_outcomes": show_outcomes,
        "show_policy_names": show_outcomes or not project.blind,
        "back_url": reverse("label-next", args=[project.pk])
        if assignment is not None
        else reverse("trajectory-steps", args=[project.pk, trajectory.pk]),
    }


def _assignment(request: HttpRequest, membership: Membership, raw: str):
    if not raw:
        return None
    if not raw.isdigit():
        raise Http404("No such assignment.")
    return get_own_assignment(request, membership.project, int(raw))
