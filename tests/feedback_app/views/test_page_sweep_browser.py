"""Every page, in every role, in real Chromium under Tandem's Content-Security-Policy, with DEBUG off (and for the
researcher also with DEBUG on). A page fails when its visible text shows template syntax, when it logs a console
error (a CSP violation is one), when a request the test did not ask for fails, or when it is wider than the screen
(the project, its policies, snapshots and models carry long unbroken names). Members get each page or the 403 of
their role; an outsider gets 404 for everything in the project. The Django admin's pages share one set of scripts
and styles: the browser opens its index, its lists and one change and one add form, and the test client opens every
one of them.

The htmx forms' error paths run the same way: a 4xx answer is swapped into its own target, beside the field, and
the rest of the page stays, with DEBUG on as with it off."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone

from feedback_app.models import (
    ApiToken,
    Comparison,
    Critique,
    DatasetSnapshot,
    Evaluation,
    Membership,
    PolicyVersion,
    QueueItem,
    Rating,
    RegisteredModel,
    Role,
    StepLabel,
    TrainingRun,
)
from feedback_app.models.labels import InterventionStatus
from tests.feedback_app.gridworld_play import SEED_7_ACTIONS, play_gridworld
from tests.feedback_app.labels import stored_intervention

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TEMPLATE_SYNTAX = re.compile(r"\{#|#\}|\{%|%\}|\{\{|\}\}")
# No break anywhere: a name like this is what pushed pages 2,195 px wide.
LONG = "a_very_long_name_that_never_breaks_" * 3  # fits every name column (120 characters)
SCREEN = {"width": 1280, "height": 900}
# Elements that make htmx fetch after the page's load event; the app's pages fetch nothing else by script.
FETCHES_LATER = '[hx-trigger~="load"], [hx-trigger^="every"], [hx-trigger*="revealed"], [hx-trigger*="intersect"]'
ROLES = ("annotator", "researcher", "admin", "outsider")
# The elements that stick out past the screen, for the failure message.
WIDE = """[...document.querySelectorAll("body *")]
    .filter(e => e.getBoundingClientRect().right > innerWidth + 1
        || (e.scrollWidth > innerWidth + 1 && getComputedStyle(e).overflowX === "visible")).slice(-6)
    .map(e => `${e.tagName}.${e.className} ${Math.round(Math.max(e.getBoundingClientRect().right, e.scrollWidth))}`)"""


@dataclass
class World:
    """The project and everything its pages show, and the users of each role."""

    project: object
    users: dict[str, object]
    objects: dict[str, object] = field(default_factory=dict)


@pytest.fixture
def world(project, task, tiny_policy, annotator, researcher, outsider, django_user_model):
    admin_user = django_user_model.objects.create_superuser(username="admin", password="pw-admin")
    Membership.objects.create(user=admin_user, project=project, role=Role.ADMIN)
    project.name = "Sweep " + LONG
    project.guidelines = "# Guidelines\n\nPrefer the **shorter** path. Code like `{x}` is fine."
    project.save()
    tiny_policy.name = "policy-" + LONG
    tiny_policy.save()
    trajectories = [play_gridworld(task, tiny_policy, SEED_7_ACTIONS) for _ in range(4)]
    QueueItem.objects.enqueue_comparisons(
        project, [(trajectories[0], trajectories[1]), (trajectories[2], trajectories[3])]
    )
    QueueItem.objects.enqueue_trajectories(project, trajectories[:2])
    first, second = trajectories[:2]
    step = first.steps.get(index=2)
    comparison = Comparison.objects.create(
        project=project, annotator=annotator, trajectory_a=first, trajectory_b=second, choice="a", rationale=LONG
    )
    StepLabel.objects.create(project=project, annotator=annotator, step=step, value=-1)
    Critique.objects.create(project=project, annotator=annotator, trajectory=first, step=step, text="walks " + LONG)
    Rating.objects.create(project=project, annotator=annotator, trajectory=first, score=4, thumb_up=True)
    child = play_gridworld(task, tiny_policy, ["right", "right", "up", "right", "right", "right", "up"])
    child.parent, child.branch_step_index = first, 2
    child.save()
    intervention = stored_intervention(
        annotator, step, "up", reason="down walks away", status=InterventionStatus.DONE, child_trajectory=child
    )
    snapshot = DatasetSnapshot.objects.create(
        project=project, name="snapshot-" + LONG, export_kind="preference", row_count=40, content_hash="ab" * 32
    )
    metrics = [{"step": s, "loss": 1 / s, "total_flos": 1.2e10 * s, "learning_rate": 1e-4} for s in range(1, 9)]
    metrics.append({"step": 8, "train_runtime": 12.5, "train_loss": 0.4})
    run = TrainingRun.objects.create(
        project=project,
        kind="reward_model",
        status="succeeded",
        snapshot=snapshot,
        base_policy=tiny_policy,
        config={"name": "rm-" + LONG},
        metrics=metrics,
        summary={"metrics": {"accuracy": 0.75, "log_loss": 0.5}},
        progress_current=8,
        progress_total=8,
        log="trained " + LONG,
        started_at=timezone.now(),
        finished_at=timezone.now(),
    )
    model = RegisteredModel.objects.create(
        project=project,
        name="rm-" + LONG,
        kind="reward_model",
        path="/m/rm",
        run=run,
        snapshot=snapshot,
        base_model="b",
    )
    failed = TrainingRun.objects.create(
        project=project,
        kind="dpo",
        status="failed",
        snapshot=snapshot,
        base_policy=tiny_policy,
        error="Traceback (most recent call last):\n  ...\nValueError: row 13: the prompt must end with an observation",
    )
    child_policy = PolicyVersion.objects.create(
        project=project, name="child-" + LONG, kind="local", weights_path="/m/v2", parent=tiny_policy, produced_by=run
    )
    for policy, value in ((tiny_policy, 0.4), (child_policy, 0.6)):
        for decoding in ("greedy", "sampled"):
            Evaluation.objects.create(
                project=project, policy_version=policy, name="heldout_success", decoding=decoding, value=value, n=20
            )
    for user in (annotator, researcher, admin_user, outsider):
        ApiToken.issue(user, "token-" + LONG[:90])
    users = {"annotator": annotator, "researcher": researcher, "admin": admin_user, "outsider": outsider}
    objects = {
        "trajectory": first,
        "step": step,
        "comparison": comparison,
        "intervention": intervention,
        "run": run,
        "failed": failed,
        "model": model,
    }
    return World(project, users, objects)


@dataclass
class Page:
    path: str
    status: dict[str, int] = field(default_factory=dict)  # by role; 200 for any role not named
    ready: str = ""  # what shows once a page that draws itself in JavaScript has drawn (and fetched its data)
    # When the page counts as open: Tandem's pages once htmx has fetched what they load; the admin's, which fetch
    # nothing after their load event, at that event.
    wait: str = "networkidle"
    # The same page for every role and either DEBUG (the API's docs, drawn by their own scripts): opened in one sweep.
    once: bool = False

    def expected(self, role: str) -> int:
        return self.status.get(role, 200)


def app_pages(world: World) -> list[Page]:
    """Every HTML page of the app, with what each role gets."""
    p, o = world.project.pk, world.objects
    trajectory, step = o["trajectory"], o["step"]
    member = {"outsider": 404}
    manager = {"outsider": 404, "annotator": 403}
    own = {"outsider": 404, "researcher": 404, "admin": 404}  # the annotator's own label
    return [
        Page(reverse("home")),
        Page(reverse("api-tokens")),
        Page(reverse("api-docs"), ready=".swagger-ui .info .title", once=True),
        Page(reverse("api-redoc"), ready=".api-info h1", once=True),
        Page(reverse("project-detail", args=[p]), member),
        Page(reverse("trajectory-detail", args=[p, trajectory.pk]), member),
        Page(reverse("compare-next", args=[p]), member),
        Page(reverse("label-next", args=[p]), member),
        Page(reverse("trajectory-steps", args=[p, trajectory.pk]), member),
        Page(reverse("intervene", args=[p, trajectory.pk, step.index]), member),
        Page(reverse("intervention-status", args=[p, o["intervention"].pk]), own | {"researcher": 200, "admin": 200}),
        Page(reverse("history", args=[p]), member),
        Page(reverse("history-label", args=[p, "comparison", o["comparison"].pk]), own),
        Page(reverse("project-quality", args=[p]), manager),
        Page(reverse("project-dashboard", args=[p]), manager),
        Page(reverse("project-models", args=[p]), manager),
        Page(reverse("project-leaderboard", args=[p]), manager),
        Page(reverse("training", args=[p]), manager),
        Page(reverse("training-run", args=[p, o["run"].pk]), manager),
        Page(reverse("training-run", args=[p, o["failed"].pk]), manager),
        Page(reverse("project-detail", args=[999_999]), {role: 404 for role in ROLES}),
    ]


def admin_pages() -> list[Page]:
    """The admin's index and, for every registered model, its list, its add form and the change form of its first
    row: for the staff admin only (others are sent to the admin's login page)."""
    pages = [Page(reverse("admin:index"), wait="load")]
    for model, model_admin in admin.site._registry.items():
        name = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        pages.append(Page(reverse(f"{name}_changelist"), wait="load"))
        first = model.objects.order_by("pk").first()
        if first is not None:
            pages.append(Page(reverse(f"{name}_change", args=[first.pk]), wait="load"))
        if model_admin.has_add_permission(_StaffRequest()):
            pages.append(Page(reverse(f"{name}_add"), wait="load"))
    return pages


def in_the_browser(pages: list[Page]) -> list[Page]:
    """The admin pages the browser opens: the index, every list (the pages that grow wide), and one change form and
    one add form, which share the admin's scripts and styles with every other form. The test client opens them all
    (`test_every_admin_page_renders_for_the_staff_admin`)."""
    kept, forms = [], set()
    for entry in pages:
        kind = entry.path.rstrip("/").rsplit("/", 1)[-1]
        kind = "add" if kind == "add" else ("change" if kind == "change" else "other")
        if kind == "other" or kind not in forms:
            kept.append(entry)
            forms.add(kind)
    return kept


class _StaffRequest:
    class user:  # noqa: N801 - what has_add_permission reads off a request
        is_active = is_staff = is_superuser = True

        @staticmethod
        def has_perm(permission, obj=None) -> bool:
            return True


class Watcher:
    """What a page does wrong while it is open: console errors (CSP violations included), uncaught exceptions, and
    failed requests other than the page's own (whose status the sweep checks itself)."""

    def __init__(self, page, base_url: str) -> None:
        self.page, self.base_url = page, base_url
        self.problems: list[str] = []
        self.document_url = ""
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"uncaught: {error}"))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)

    def _failed(self, request) -> None:
        # Chromium fetches the favicon after the load event, and cancels that fetch when the sweep moves on to the
        # next page: a cancelled favicon is the browser's doing, not a failure (its status is still checked).
        if request.url.endswith("/favicon.svg") and request.failure == "net::ERR_ABORTED":
            return
        self.problems.append(f"failed: {request.url} {request.failure}")

    def _console(self, message) -> None:
        if message.type != "error":
            return
        # Chromium logs the page's own 4xx as a console error; the sweep checks that status itself.
        if message.text.startswith("Failed to load resource") and message.location.get("url") == self.document_url:
            return
        self.problems.append(f"console: {message.text} ({message.location.get('url')})")

    def _response(self, response) -> None:
        if response.status >= 400 and response.url != self.document_url:
            self.problems.append(f"{response.status}: {response.request.method} {response.url}")

    def visit(self, path: str, wait: str = "networkidle"):
        """Open `path`. Waiting for the network to go idle costs half a second a page, so it is waited for only
        where the page asks htmx for more after its load event (a `load` trigger, or polling)."""
        self.document_url = self.base_url + path
        response = self.page.goto(path, wait_until="load")
        if wait == "networkidle" and self.page.query_selector(FETCHES_LATER) is not None:
            self.page.wait_for_load_state("networkidle")
        return response

    def take(self) -> list[str]:
        problems, self.problems = self.problems, []
        return problems


@pytest.fixture
def sweep_page_for(chromium, live_server):
    """A page logged in as `user` (or anonymous), with the Content-Security-Policy enforced, and its `Watcher`."""
    from django.conf import settings
    from django.test import Client

    contexts = []

    def open_page(user=None):
        context = chromium.new_context(viewport=SCREEN, base_url=live_server.url)
        contexts.append(context)
        if user is not None:
            client = Client()
            client.force_login(user)
            cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
            context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": live_server.url}])
        context.set_default_timeout(60_000)
        page = context.new_page()
        return page, Watcher(page, live_server.url)

    yield open_page
    for context in contexts:
        context.close()


def check_page(
    page, watcher: Watcher, url: str, expected: int, ready: str = "", wait: str = "networkidle"
) -> list[str]:
    """Open `url` and list what is wrong with it."""
    response = watcher.visit(url, wait)
    if ready:
        page.wait_for_selector(ready)
        page.wait_for_load_state("networkidle")
    problems = watcher.take()
    if response.status != expected:
        problems.append(f"status {response.status}, expected {expected}")
    shown = TEMPLATE_SYNTAX.findall(page.inner_text("body"))
    if shown:
        problems.append(f"template syntax in the visible text: {sorted(set(shown))}")
    width = page.evaluate("document.documentElement.scrollWidth")
    if width > SCREEN["width"]:
        problems.append(f"{width} px wide: {page.evaluate(WIDE)}")
    return problems


# Every role with DEBUG off, as deployed; with DEBUG on, the researcher, who sees every page of the app. DEBUG changes
# Tandem's error handling, not the pages, so one role shows that the pages keep to the policy with it on. The first
# sweep also opens the pages that are the same for everyone (`Page.once`).
SWEEPS = [("researcher", False)] + [(role, False) for role in ROLES if role != "researcher"] + [("researcher", True)]


@pytest.mark.parametrize(
    ("role", "debug"), SWEEPS, ids=[f"{role}-debug-{'on' if debug else 'off'}" for role, debug in SWEEPS]
)
def test_every_page_renders_cleanly_in_every_role(settings, sweep_page_for, world, role, debug):
    settings.DEBUG = debug
    page, watcher = sweep_page_for(world.users[role])
    # The admin's own pages once, with DEBUG off: what DEBUG changes is Tandem's error handling, which they lack.
    pages = app_pages(world) + (in_the_browser(admin_pages()) if role == "admin" and not debug else [])
    found = {}
    for entry in pages:
        expected = entry.expected(role)
        if entry.once and (role, debug) != SWEEPS[0]:
            continue
        if debug and expected == 404:
            continue  # with DEBUG on, Django answers a 404 with its own technical page, not Tandem's
        # An error page (403, 404) loads nothing after its load event.
        wait = entry.wait if expected == 200 else "load"
        problems = check_page(page, watcher, entry.path, expected, entry.ready, wait)
        if expected == 404 and "There is nothing here" not in page.inner_text("main"):
            problems.append("a 404 without Tandem's own page")
        if problems:
            found[entry.path] = problems
    assert not found, "\n".join(f"{path}: {problems}" for path, problems in found.items())


def test_the_login_page_and_the_favicon_render_cleanly_for_anyone(sweep_page_for, world):
    page, watcher = sweep_page_for()
    assert check_page(page, watcher, reverse("login"), 200) == []
    favicon = page.request.get("/favicon.ico")
    assert favicon.status == 200 and favicon.headers["content-type"].startswith("image/")


def visible_text(html: str) -> str:
    """The text a page shows: its text nodes, without attributes (an inline formset's JSON), scripts, styles or
    a JSON field's value in its textarea."""
    from html.parser import HTMLParser

    class Text(HTMLParser):
        hidden = ("script", "style", "textarea")

        def __init__(self) -> None:
            super().__init__()
            self.parts: list[str] = []
            self.inside: list[str] = []

        def handle_starttag(self, tag, attrs) -> None:
            if tag in self.hidden:
                self.inside.append(tag)

        def handle_endtag(self, tag) -> None:
            if self.inside and self.inside[-1] == tag:
                self.inside.pop()

        def handle_data(self, data) -> None:
            if not self.inside:
                self.parts.append(data)

    parser = Text()
    parser.feed(html)
    return " ".join(parser.parts)


def test_every_admin_page_renders_for_the_staff_admin(client, world):
    client.force_login(world.users["admin"])
    pages = admin_pages()
    assert len(in_the_browser(pages)) < len(pages), "the browser opens a sample; this test opens every one"
    found = {}
    for entry in pages:
        response = client.get(entry.path)
        body = visible_text(response.content.decode())
        if response.status_code != 200 or TEMPLATE_SYNTAX.search(body):
            found[entry.path] = (response.status_code, sorted(set(TEMPLATE_SYNTAX.findall(body))))
    assert not found, found
