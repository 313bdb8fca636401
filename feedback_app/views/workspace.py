"""What the annotator's pages share: which page serves each kind of queue item, the user's own assignments, and
skipping any kind of item."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from feedback_app import queue
from feedback_app.access import get_project_for_member
from feedback_app.hot_path import reads
from feedback_app.models import Assignment, LabelKind, Membership, Project
from feedback_app.models.queue import AssignmentStatus

# The URL name of the page that serves the next item of each kind (it takes project_pk). A single trajectory is
# queued for step-label review, on the page where its critiques, ratings and interventions are made too; items of
# those kinds (from older queues) go there as well. There is no queue page of interventions ("intervene-next").
NEXT_ITEM_PAGES = {
    LabelKind.COMPARISON: "compare-next",
    LabelKind.STEP_LABEL: "label-next",
    LabelKind.CRITIQUE: "label-next",
    LabelKind.RATING: "label-next",
    LabelKind.INTERVENTION: "label-next",
}


def next_item_url(project_pk: int, kind: str) -> str:
    return reverse(NEXT_ITEM_PAGES[kind], kwargs={"project_pk": project_pk})


def get_membership_and_assignment(
    request: HttpRequest, project_pk: int, assignment_pk: int, kind: str
) -> tuple[Project, Membership, Assignment]:
    """`get_project_for_member` and `get_own_assignment` in one statement, for the annotators' busiest request: the
    project, the user's membership, and the user's assignment `assignment_pk` of `kind` in it. 404 for outsiders,
    and for anyone else's assignment."""
    membership, assignment = reads.membership_and_assignment(project_pk, request.user, assignment_pk, kind)
    if membership is None:
        raise Http404("No such project.")
    if assignment is None:
        raise Http404("No such assignment of yours.")
    return membership.project, membership, assignment


def get_own_assignment(request: HttpRequest, project: Project, assignment_pk: int, kind: str | None = None):
    """One of the user's own assignments in `project` (with its item, and the item's project set to `project`);
    404 for anyone else's."""
    assignment = queue.own_assignment(project, request.user, assignment_pk, kind=kind)
    if assignment is None:
        raise Http404("No such assignment of yours.")
    return assignment


@require_POST
@login_required
def skip_assignment(request: HttpRequest, project_pk: int, assignment_pk: int) -> HttpResponse:
    """Give the item back with an optional reason, then go on to the next item of the same kind.

    The answer redirects (303) to the page that serves that kind; htmx follows it with the HX-Request header kept,
    so the page's own view answers with its workspace fragment, in one swap.
    """
    project, _ = get_project_for_member(request, project_pk)
    assignment = get_own_assignment(request, project, assignment_pk)
    # A labelled item stays labelled and a repeated skip changes nothing: either way the annotator moves on.
    if assignment.status in (AssignmentStatus.LEASED, AssignmentStatus.EXPIRED):
        queue.skip(assignment, request.POST.get("reason", "").strip())
    return HttpResponseRedirect(next_item_url(project.pk, assignment.item.kind), status=303)
