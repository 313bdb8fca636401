"""An annotator's own labels of every kind, newest first, and editing them (each edit is a new revision).

Only the user's own labels are ever read here: every query filters on the annotator, so another annotator's label
is a 404, not a 403. The list is one UNION query over the five label tables, then one query per kind on the page.
"""

from __future__ import annotations

from collections import Counter

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import CharField, F, Max, Value
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods
from django.views.decorators.vary import vary_on_headers

from feedback_app import labelling
from feedback_app.access import get_project_for_member
from feedback_app.models import Comparison, Critique, Intervention, LabelKind, Project, Rating, StepLabel
from feedback_app.models.labels import LabelBase
from feedback_app.views.compare import CHOICE_MESSAGE, STRENGTH_MESSAGE

PAGE_SIZE = 25
# Step-label values in the order a history row counts them.
STEP_VALUES = ((1, "+1"), (0, "0"), (-1, "−1"))

LABEL_MODELS: dict[str, type[LabelBase]] = {
    LabelKind.COMPARISON: Comparison,
    LabelKind.STEP_LABEL: StepLabel,
    LabelKind.CRITIQUE: Critique,
    LabelKind.RATING: Rating,
    LabelKind.INTERVENTION: Intervention,
}
RELATED = {
    LabelKind.COMPARISON: ("trajectory_a__task",),
    LabelKind.STEP_LABEL: ("step",),
    LabelKind.CRITIQUE: ("step",),
    LabelKind.RATING: (),
    LabelKind.INTERVENTION: ("step",),
}


# Edit forms: one per kind, each built from a label (`initial_from`) and turned into revise() changes (`changes`).


class ComparisonEditForm(forms.Form):
    choice = forms.ChoiceField(
        choices=[("left", "Left is better"), ("right", "Right is better"), ("tie", "Tie"), ("both_bad", "Both bad")],
        error_messages={"required": CHOICE_MESSAGE, "invalid_choice": CHOICE_MESSAGE},
    )
    strength = forms.TypedChoiceField(
        choices=[(1, "1 slight"), (2, "2 clear"), (3, "3 decisive")],
        coerce=int,
        empty_value=None,
        required=False,
        help_text="Only for a preference: a tie or both bad is kept without one.",
        error_messages={"invalid_choice": STRENGTH_MESSAGE},
    )
    rationale = forms.CharField(required=False, max_length=5000, widget=forms.Textarea(attrs={"rows": 2}))

    @staticmethod
    def initial_from(label: Comparison) -> dict:
        shown = labelling.shown_choice(label.choice, label.displayed_order)
        return {"choice": shown, "strength": label.strength, "rationale": label.rationale}

    def changes(self, label: Comparison) -> dict:
        data = self.cleaned_data
        choice = labelling.canonical_choice(data["choice"], label.displayed_order)
        return {"choice": choice, "strength": data["strength"], "rationale": data["rationale"].strip()}


class StepLabelEditForm(forms.Form):
    value = forms.TypedChoiceField(
        choices=[(1, "+1 good"), (0, "0 neutral"), (-1, "-1 bad")],
        coerce=int,
        error_messages={"invalid_choice": "A step label is +1, 0 or -1."},
    )

    @staticmethod
    def initial_from(label: StepLabel) -> dict:
        return {"value": label.value}

    def changes(self, label: StepLabel) -> dict:
        return {"value": self.cleaned_data["value"]}


class CritiqueEditForm(forms.Form):
    text = forms.CharField(max_length=20000, widget=forms.Textarea(attrs={"rows": 3}))
    tags = forms.CharField(required=False, max_length=500, help_text="Comma-separated.")

    @staticmethod
    def initial_from(label: Critique) -> dict:
        return {"text": label.text, "tags": ", ".join(label.tags)}

    def changes(self, label: Critique) -> dict:
        tags = [tag.strip() for tag in self.cleaned_data["tags"].split(",") if tag.strip()]
        return {"text": self.cleaned_data["text"].strip(), "tags": tags}


class RatingEditForm(forms.Form):
    score = forms.TypedChoiceField(
        choices=[("", "no score"), *[(n, str(n)) for n in range(1, 6)]],
        coerce=int,
        empty_value=None,
        required=False,
        error_messages={"invalid_choice": "A score is from 1 to 5."},
    )
    thumb = forms.ChoiceField(choices=[("", "no thumb"), ("up", "thumb up"), ("down", "thumb down")], required=False)
    comment = forms.CharField(required=False, max_length=5000, widget=forms.Textarea(attrs={"rows": 2}))

    def clean(self) -> dict:
        data = super().clean()
        if data.get("score") is None and not data.get("thumb") and "score" not in self.errors:
            self.add_error("score", "Give a score from 1 to 5, a thumb, or both.")
        return data

    @staticmethod
    def initial_from(label: Rating) -> dict:
        thumb = "" if label.thumb_up is None else ("up" if label.thumb_up else "down")
        return {"score": label.score or "", "thumb": thumb, "comment": label.comment}

    def changes(self, label: Rating) -> dict:
        data = self.cleaned_data
        thumb_up = {"": None, "up": True, "down": False}[data["thumb"]]
        return {"score": data["score"], "thumb_up": thumb_up, "comment": data["comment"].strip()}


class InterventionEditForm(forms.Form):
    # The corrected action itself is not editable here: a different action is a different branch of the rollout,
    # made on the intervention page where it is checked against the environment.
    corrected_reasoning = forms.CharField(required=False, max_length=5000, widget=forms.Textarea(attrs={"rows": 2}))
    reason = forms.CharField(required=False, max_length=5000, widget=forms.Textarea(attrs={"rows": 2}))

    @staticmethod
    def initial_from(label: Intervention) -> dict:
        return {"corrected_reasoning": label.corrected_reasoning, "reason": label.reason}

    def changes(self, label: Intervention) -> dict:
        return {name: self.cleaned_data[name].strip() for name in ("corrected_reasoning", "reason")}


EDIT_FORMS: dict[str, type[forms.Form]] = {
    LabelKind.COMPARISON: ComparisonEditForm,
    LabelKind.STEP_LABEL: StepLabelEditForm,
    LabelKind.CRITIQUE: CritiqueEditForm,
    LabelKind.RATING: RatingEditForm,
    LabelKind.INTERVENTION: InterventionEditForm,
}


@require_GET
@login_required
def history(request: HttpRequest, project_pk: int) -> HttpResponse:
    """The user's current labels, newest first, a trajectory's step labels in one row; `kind` keeps one kind, and
    `project` moves to the same list in another of the user's projects."""
    project, _ = get_project_for_member(request, project_pk)
    kind = request.GET.get("kind", "")
    if kind not in LABEL_MODELS:
        kind = ""
    other = request.GET.get("project", "")
    if other.isdigit() and len(other) <= 18 and int(other) != project.pk:  # 18 digits: within any id column
        target = get_project_for_member(request, int(other))[0]
        query = f"?kind={kind}" if kind else ""
        return HttpResponseRedirect(reverse("history", args=[target.pk]) + query)
    page = Paginator(_my_current_labels(request.user, project, kind), PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "project": project,
        "page": page,
        "rows": _rows(request.user, page.object_list),
        "kind": kind,
        "kinds": [(value, LabelKind(value).label) for value in LABEL_MODELS],
        "projects": Project.objects.filter(memberships__user=request.user).order_by("name").only("pk", "name"),
        "query": f"kind={kind}&" if kind else "",
    }
    return render(request, "feedback_app/history.html", context)


@require_http_methods(["GET", "POST"])
@login_required
@vary_on_headers("HX-Request")
def label_revisions(request: HttpRequest, project_pk: int, kind: str, label_pk: int) -> HttpResponse:
    """GET: one label's revision chain and its edit form. POST: store the edit as a new revision."""
    project, _ = get_project_for_member(request, project_pk)
    if kind not in LABEL_MODELS:
        raise Http404("No such kind of label.")
    model, form_class = LABEL_MODELS[kind], EDIT_FORMS[kind]
    label = model.objects.select_related(*RELATED[kind]).filter(pk=label_pk, annotator=request.user, project=project)
    label = label.first()
    if label is None:
        raise Http404("No such label of yours.")
    status, saved = 200, False
    if request.method == "GET":
        form = form_class(initial=form_class.initial_from(label))
    else:
        form = form_class(request.POST)
        status, label, saved = _edit(request, label, form)
    context = {
        "project": project,
        "row": _row(kind, label),
        "chain": _chain(label),
        "form": None if saved else form,
        "saved": saved,
    }
    template_name = "feedback_app/history.html#label" if request.htmx else "feedback_app/history_label.html"
    return render(request, template_name, context, status=status)


def _edit(request: HttpRequest, label: LabelBase, form: forms.Form) -> tuple[int, LabelBase, bool]:
    """Apply a valid edit as a new revision. Returns the status to answer with, the label to show, and whether a
    revision was written."""
    if not form.is_valid():
        return 400, label, False
    changes = form.changes(label)
    if all(getattr(label, name) == value for name, value in changes.items()):
        form.add_error(None, "Nothing changed, so no new revision was written.")
        return 400, label, False
    try:
        return 200, labelling.edit_label(request.user, label, **changes), True
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, messages)
        return (409 if "revision" in exc.message_dict else 400), label, False


def _my_current_labels(user, project: Project, kind: str = ""):
    """(kind, label_id, at) of the user's current labels in `project` (of `kind` only, when given), newest first:
    one query. A trajectory's step labels are one entry, its newest step label."""
    parts = []
    for name, model in LABEL_MODELS.items():
        if kind and name != kind:
            continue
        labels = model.objects.filter(project=project, annotator=user, is_current=True).order_by()
        if name == LabelKind.STEP_LABEL:
            labels = labels.values("step__trajectory_id").annotate(label_id=Max("pk"), at=Max("created_at"))
        else:
            labels = labels.annotate(label_id=F("pk"), at=F("created_at"))
        parts.append(labels.annotate(kind=Value(name, output_field=CharField())).values("kind", "label_id", "at"))
    return parts[0].union(*parts[1:], all=True).order_by("-at", "-label_id")


def _rows(user, entries) -> list[dict]:
    """The page's labels as rows, fetched with one query per kind present on the page; a step-label entry becomes
    its trajectory's row of current step labels."""
    wanted: dict[str, list[int]] = {}
    for entry in entries:
        wanted.setdefault(entry["kind"], []).append(entry["label_id"])
    fetched = {
        kind: LABEL_MODELS[kind].objects.select_related(*RELATED[kind]).in_bulk(pks) for kind, pks in wanted.items()
    }
    steps_of: dict[int, list[StepLabel]] = {}
    if newest := fetched.get(LabelKind.STEP_LABEL):
        trajectories = {label.step.trajectory_id for label in newest.values()}
        current = StepLabel.objects.filter(annotator=user, is_current=True, step__trajectory_id__in=trajectories)
        for label in current.select_related("step").order_by("step__index"):
            steps_of.setdefault(label.step.trajectory_id, []).append(label)
    rows = []
    for entry in entries:
        label = fetched[entry["kind"]][entry["label_id"]]
        row = _row(entry["kind"], label)
        if entry["kind"] == LabelKind.STEP_LABEL:
            row |= _step_group(steps_of[label.step.trajectory_id])
        rows.append(row)
    return rows


def _step_group(labels: list[StepLabel]) -> dict:
    """A trajectory's current step labels as one history row: the counts of each value, and every step's label."""
    counts = Counter(label.value for label in labels)
    tally = ", ".join(f"{display} ×{counts[value]}" for value, display in STEP_VALUES if counts[value])
    return {
        "kind_label": "Step labels",
        "step_number": None,
        "judgement": f"{len(labels)} step{pluralize(len(labels))}: {tally}",
        "steps": labels,
    }


def _row(kind: str, label: LabelBase) -> dict:
    return {"kind": kind, "kind_label": LabelKind(kind).label, "label": label, **_about(kind, label)}


def _about(kind: str, label) -> dict:
    """What the label is about (the trajectory to link to, the step) and its judgement in words."""
    if kind == LabelKind.COMPARISON:
        left, right = (
            (label.trajectory_a_id, label.trajectory_b_id)
            if label.displayed_order == "ab"
            else (label.trajectory_b_id, label.trajectory_a_id)
        )
        shown = labelling.shown_choice(label.choice, label.displayed_order)
        judgement = {"left": "left better", "right": "right better", "tie": "tie", "both_bad": "both bad"}[shown]
        return {
            "trajectories": (left, right),
            "judgement": judgement if label.strength is None else f"{judgement} · strength {label.strength}",
            "text": label.rationale,
        }
    if kind == LabelKind.STEP_LABEL:
        return {
            "trajectory_id": label.step.trajectory_id,
            "step_number": label.step.index + 1,
            "judgement": label.get_value_display(),
        }
    if kind == LabelKind.CRITIQUE:
        return {
            "trajectory_id": label.trajectory_id,
            "step_number": label.step.index + 1 if label.step_id else None,
            "judgement": ", ".join(label.tags),
            "text": label.text,
        }
    if kind == LabelKind.RATING:
        thumb = {True: "thumb up", False: "thumb down"}.get(label.thumb_up, "")
        judgement = " ".join(part for part in (f"score {label.score}" if label.score else "", thumb) if part)
        return {"trajectory_id": label.trajectory_id, "judgement": judgement, "text": label.comment}
    return {
        "trajectory_id": label.trajectory_id,
        "step_number": label.step.index + 1,
        "judgement": f"{label.original_action} → {label.corrected_action}",
        "text": label.reason,
    }


def _chain(label: LabelBase) -> list[LabelBase]:
    """Every revision of `label`, newest first, in one query: revisions share the annotator and the item fields."""
    model = type(label)
    attnames = [model._meta.get_field(name).attname for name in model.item_fields]
    same_item = {attname: getattr(label, attname) for attname in attnames}
    candidates = model.objects.filter(annotator_id=label.annotator_id, revision__lte=label.revision, **same_item)
    by_pk = {candidate.pk: candidate for candidate in candidates}
    chain, node = [], label
    while node is not None:
        chain.append(node)
        node = by_pk.get(node.supersedes_id)
    return chain
