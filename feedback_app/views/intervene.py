"""Intervening on a trajectory: correct the action at one step (and, in takeover mode, play more steps by hand), then
let the current policy continue from there on a rollout worker.

The page replays the episode in the environment on the server to show the state after the annotator's actions and
the legal actions there: one environment reset and a handful of steps per click, which is cheap for the gridworld.
The status page polls every second until the continuation is done, then shows the child trajectory with the
annotator's steps marked.
"""

from __future__ import annotations

import json
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
from feedback_app.corrections import legal_actions_at, offered_tools, replay_turns
from feedback_app.models import Intervention, Membership, Step, Trajectory
from feedback_app.models.labels import InterventionStatus
from feedback_app.models.trajectories import NotReplayable
from feedback_app.templatetags.tandem import mark_repeated_observations
from feedback_app.views.chat_turn import (
    TurnEditor,
    attach_errors,
    editor_from_message,
    editor_message,
    read_editor,
)
from feedback_app.views.steps import errors_by_field, step_or_404, trajectory_for_member
from feedback_app.views.workspace import get_own_assignment
from reward_models.conversation import message_tool_calls
from reward_models.envs.base import describe_message
from reward_models.envs.corrections import turn_message

TEMPLATE = "feedback_app/intervene.html"
STATUS_TEMPLATE = "feedback_app/_intervention_status.html"
PLAY_FIELDS = ("corrected_action", "takeover_actions", "step")
FORM_FIELDS = (*PLAY_FIELDS, "corrected_reasoning", "reason")
# Keys for the gridworld's moves: arrows and w a s d. Any other environment's actions get the digits 1–9.
MOVE_KEYS = {"up": "w ArrowUp", "left": "a ArrowLeft", "down": "s ArrowDown", "right": "d ArrowRight"}


@dataclass
class PlayedTurn:
    """One of the annotator's chat turns as `step_card` shows a step: the message, its tool calls beside the tool
    messages that answered them."""

    index: int
    message: dict[str, Any]
    replies: list[dict[str, Any]]
    reasoning: str
    action: str
    observation: str = ""
    env_reward: float = 0.0
    render: dict[str, Any] = field(default_factory=dict)
    media: list[Any] = field(default_factory=list)
    tool_calls: list[Any] = field(default_factory=list)

    @property
    def dom_id(self) -> str:
        return f"played-{self.index + 1}"


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
    # Chat turns: the assistant messages played so far (the correction first), each shown as a card with what the
    # environment answered, and the number of the step the editor writes.
    turns: list[dict[str, Any]] = field(default_factory=list)
    cards: list[PlayedTurn] = field(default_factory=list)
    next_step: int = 0

    @property
    def turns_json(self) -> list[str]:
        return [json.dumps(turn, ensure_ascii=False) for turn in self.turns]

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
    # A task with tools is corrected with chat turns (text and tool calls); the others by picking actions.
    editor = None
    if tools:
        editor = read_editor(params, tools, interactive=interactive, start=step.message)
        play, editor = _chat_play(trajectory, step, prefix, params, editor, tools, interactive=interactive)
    else:
        play = _play(trajectory, step, prefix, params, interactive=interactive)
    if request.method == "GET" or play.not_replayable:
        context = _context(request, membership, trajectory, step, prefix, play, assignment) | {"editor": editor}
        template_name = TEMPLATE + "#play" if request.htmx and not play.not_replayable else TEMPLATE
        refused = play.errors or (editor and editor.has_errors) or (play.not_replayable and request.method == "POST")
        return render(request, template_name, context, status=400 if refused else 200)

    values = {"corrected_reasoning": params.get("corrected_reasoning", ""), "reason": params.get("reason", "")}
    try:
        client_token = uuid.UUID(params.get("client_token", ""))
    except ValueError:
        client_token = None
    correction: dict[str, Any] = {"corrected_action": play.corrected_action, "takeover_actions": play.takeover_actions}
    try:
        if editor is not None:
            if play.errors:
                raise ValidationError(play.errors)
            message, readable = editor_message(editor, tools)
            if not readable:
                raise ValidationError({})
            # Taking over, the turn in the editor is played after the ones played already, unless it is left empty.
            written = bool(message["content"] or message.get("tool_calls"))
            turns = [*play.turns, message] if written or not play.turns else play.turns
            correction = {"corrected_message": turns[0], "takeover_actions": turns[1:], "reason": values["reason"]}
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
        child_steps = mark_repeated_observations(intervention.child_trajectory.steps.order_by("index"))
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
        results = replay_turns(
            env,
            trajectory.task.reset_spec(),
            [earlier.message for earlier in prefix],
            [turn_message(env, action) for action in [play.corrected_action, *play.takeover_actions]],
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


def _chat_play(
    trajectory: Trajectory,
    step: Step,
    prefix: list[Step],
    params: QueryDict,
    editor: TurnEditor,
    tools: list[dict[str, Any]],
    *,
    interactive: bool,
) -> tuple[Play, TurnEditor]:
    """The chat turns the annotator has played at the intervened step, in takeover mode, and the editor of the next
    one, after a mode switch, "play this turn" or an undo (`interactive`). Played turns travel in the form as hidden
    ``played`` fields, one assistant message each as JSON, and are replayed in the environment to show what each
    got back; "play this turn" checks the editor's turn the same way before it joins them, and an undo puts the last
    one back in the editor. Correcting one step plays no turn here: the editor's turn is the correction."""
    play = Play(takeover=params.get("mode") == "takeover", render=step.render)
    turns: list[dict[str, Any]] = []
    for raw in params.getlist("played"):
        try:
            turn = json.loads(raw)
        except json.JSONDecodeError:
            turn = None
        if not isinstance(turn, dict) or turn.get("role") != "assistant":
            play.errors["takeover_actions"] = [
                "A turn you played came back garbled; stop taking over and take over again."
            ]
            turns = []
            break
        turns.append(turn)
    original = [earlier.message for earlier in prefix]
    try:
        task = trajectory.task.reset_spec()
        if interactive:
            if params.get("switch") in ("takeover", "correct"):
                play.takeover = params["switch"] == "takeover"
                if not play.takeover and turns:  # the correction stays in the editor; the turns after it go
                    editor, turns = editor_from_message(turns[0], tools), []
            if params.get("undo") and turns:
                editor = editor_from_message(turns.pop(), tools)
            elif params.get("play_turn") and play.takeover:
                turns, editor = _play_editor_turn(trajectory, task, original, turns, editor, tools, play)
        if not play.takeover:
            turns = []
        if turns:
            env, results = _replay_turns(trajectory, task, original, turns, tools)
            play.ended = results[-1].done
            for offset, (turn, result) in enumerate(zip(turns, results[-len(turns) :], strict=True)):
                reasoning, action = describe_message(env, turn, message_tool_calls(turn))
                replies = result.info.get("messages") if isinstance(result.info.get("messages"), list) else []
                play.cards.append(PlayedTurn(step.index + offset, turn, replies, reasoning, action))
        else:
            legal_actions_at(trajectory, step.index)  # the episode replays up to this step and has not ended
    except NotReplayable as exc:
        play.not_replayable = " ".join(exc.messages)
    except ValidationError as exc:
        play.errors |= errors_by_field(exc, PLAY_FIELDS)
    play.turns = turns
    play.next_step = step.index + 1 + len(turns)
    if play.ended:  # nothing is left to write: the form carries the played turns alone
        editor = editor_from_message({}, tools)
    return play, editor


def _play_editor_turn(trajectory, task, original, turns, editor, tools, play: Play) -> tuple[list, TurnEditor]:
    """Play the editor's turn: it joins the played turns and a fresh editor comes for the next one; or, when it
    cannot be played, it stays in the editor with each reason beside its field."""
    message, readable = editor_message(editor, tools)
    if not readable:
        return turns, editor
    try:
        _replay_turns(trajectory, task, original, [*turns, message], tools)
    except ValidationError as exc:
        rest = attach_errors(editor, exc.message_dict)
        play.errors |= errors_by_field(ValidationError(rest), PLAY_FIELDS) if rest else {}
        return turns, editor
    return [*turns, message], editor_from_message({}, tools)


def _replay_turns(trajectory: Trajectory, task: dict[str, Any], original: list, turns: list, tools: list):
    env = trajectory.project.environment.load()
    return env, replay_turns(env, task, original, turns, tools)


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
