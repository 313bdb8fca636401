from __future__ import annotations

import json
import math
import threading
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from feedback_app.annotator_time import AnnotatorTime
from feedback_app.models import ApiToken, Membership, Project, Role
from feedback_app.simulated.annotator import KINDS, run_crowd
from feedback_app.simulated.teacher import TeacherConfig

TOKEN_NAME = "simulate_annotators"
PROGRESS_EVERY = 25


class Command(BaseCommand):
    help = (
        "Run a crowd of simulated annotators (B-Pref scripted teachers) on PROJECT through the running server's REST "
        "API and queue, exactly as people label. Each gets a user sim-<name> (created if missing, an annotator of the "
        "project) and a fresh API token, revoked when the run ends. Give the crowd as --crowd crowd.json (a list of "
        "teacher settings, each with an optional name) or as --count N teachers sharing the settings below."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--project", required=True, help="Project id or slug.")
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="Where the Tandem server runs.")
        crowd = parser.add_mutually_exclusive_group(required=True)
        crowd.add_argument(
            "--crowd",
            type=Path,
            help='A JSON list of teachers: [{"name": "careful", "beta": "inf", "epsilon": 0.05}, ...] with any of '
            "beta, gamma, epsilon, skip_threshold, equal_threshold, seed, step_labels, first_error_marks, critiques, "
            "interventions.",
        )
        crowd.add_argument("--count", type=int, help="How many teachers with the settings below (named 1..N).")
        parser.add_argument("--beta", type=float, default=math.inf, help="Rationality (inf: always the better one).")
        parser.add_argument("--gamma", type=float, default=1.0, help="Myopia, in (0, 1].")
        parser.add_argument("--epsilon", type=float, default=0.0, help="Mistake rate, in [0, 1].")
        parser.add_argument(
            "--skip-threshold", type=float, default=None, help="Skip pairs whose better return is below."
        )
        parser.add_argument("--equal-threshold", type=float, default=0.0, help="Tie when returns differ by at most.")
        parser.add_argument("--seed", type=int, default=0, help="Teacher i gets seed + i.")
        parser.add_argument(
            "--first-error-marks",
            action="store_true",
            help="Mark each trajectory's first wrong step (the steps before it good) instead of labelling every step.",
        )
        parser.add_argument(
            "--annotator-seconds",
            default="",
            help="The seconds each label records, by kind: comparison=25,step_label=4 changes those two of the "
            f"defaults ({AnnotatorTime().argument()}). The dashboard's overview gives your annotators' medians.",
        )
        parser.add_argument("--max-labels", type=int, default=None, help="Items each annotator answers at most.")
        parser.add_argument(
            "--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="Kinds of queue items to take."
        )

    def handle(self, *args, **options) -> None:
        project = self._project(options["project"])
        crowd = self._crowd(options)
        if options["max_labels"] is not None and options["max_labels"] < 1:
            raise CommandError(f"max-labels: must be at least 1, got {options['max_labels']}.")
        try:
            time_model = AnnotatorTime.parse(options["annotator_seconds"])
        except ValueError as exc:
            raise CommandError(f"annotator-seconds: {exc}.") from None
        tokens = self._members(project, [name for name, _ in crowd])
        self.stdout.write(f"{len(crowd)} simulated annotator(s) labelling {project.slug} at {options['url']} ...")
        lock = threading.Lock()
        reported = [0]

        def progress(total: dict[str, float]) -> None:
            answered = total.get("items", 0) + total.get("skipped", 0)
            with lock:
                if answered >= reported[0] + PROGRESS_EVERY:
                    reported[0] = answered
                    self.stdout.write(self._line("progress", total))

        try:
            result = run_crowd(
                options["url"],
                project.pk,
                [(key, config) for (_, key), (_, config) in zip(tokens, crowd, strict=True)],
                max_labels=options["max_labels"],
                kinds=options["kinds"],
                on_progress=progress,
                time_model=time_model,
            )
        except RuntimeError as exc:
            raise CommandError(f"url: the crowd stopped at {options['url']}: {exc}") from None
        finally:
            for token, _ in tokens:
                token.revoke()
        for (name, _), counts in zip(crowd, result["members"], strict=True):
            self.stdout.write(self._line(f"sim-{name}", counts))
        self.stdout.write(self.style.SUCCESS(self._line("total", result["total"]) + f" in {result['seconds']}s"))

    def _project(self, given: str) -> Project:
        lookup = {"pk": int(given)} if given.isdigit() else {"slug": given}
        project = Project.objects.filter(**lookup).first()
        if project is None:
            raise CommandError(f"project: no project with {'id' if given.isdigit() else 'slug'} {given!r}.")
        return project

    def _crowd(self, options: dict) -> list[tuple[str, TeacherConfig]]:
        if options["crowd"] is not None:
            return self._crowd_file(options["crowd"])
        if options["count"] < 1:
            raise CommandError(f"count: must be at least 1, got {options['count']}.")
        crowd = []
        for i in range(options["count"]):
            settings = {
                name: options[name] for name in ("beta", "gamma", "epsilon", "skip_threshold", "equal_threshold")
            }
            try:
                config = TeacherConfig(
                    **settings, seed=options["seed"] + i, first_error_marks=options["first_error_marks"]
                )
                crowd.append((str(i + 1), config))
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        return crowd

    def _crowd_file(self, path: Path) -> list[tuple[str, TeacherConfig]]:
        try:
            entries = json.loads(path.read_text())
        except OSError as exc:
            raise CommandError(f"crowd: cannot read {path}: {exc.strerror}.") from None
        except ValueError as exc:
            raise CommandError(f"crowd: {path} is not valid JSON: {exc}.") from None
        if not isinstance(entries, list) or not entries:
            raise CommandError("crowd: give a non-empty JSON list of teacher settings.")
        crowd = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise CommandError(f"crowd[{i}]: a teacher is a JSON object, got {type(entry).__name__}.")
            entry = dict(entry)
            name = str(entry.pop("name", i + 1))
            if not name or not all(c.isalnum() or c in "-_." for c in name) or len(name) > 100:
                raise CommandError(f"crowd[{i}].name: letters, digits, '-', '_' and '.' only, got {name!r}.")
            if name in {known for known, _ in crowd}:
                raise CommandError(f"crowd[{i}].name: {name!r} is used twice.")
            try:
                crowd.append((name, TeacherConfig.from_dict(entry)))
            except (TypeError, ValueError) as exc:
                raise CommandError(f"crowd[{i}].{exc}") from None
        return crowd

    def _members(self, project: Project, names: list[str]) -> list[tuple[ApiToken, str]]:
        """Each sim-<name> user, an annotator of the project (a member already keeps their role), with a new token."""
        users = get_user_model()
        tokens = []
        with transaction.atomic():
            for name in names:
                user, created = users.objects.get_or_create(username=f"sim-{name}")
                if created:
                    user.set_unusable_password()
                    user.save(update_fields=["password"])
                Membership.objects.get_or_create(user=user, project=project, defaults={"role": Role.ANNOTATOR})
                tokens.append(ApiToken.issue(user, TOKEN_NAME))
        return tokens

    @staticmethod
    def _line(who: str, counts: dict[str, float]) -> str:
        return (
            f"{who}: {counts.get('items', 0)} items answered ({counts.get('comparison', 0)} comparisons, "
            f"{counts.get('step_label', 0)} step labels, {counts.get('critique', 0)} critiques, "
            f"{counts.get('intervention', 0)} interventions), {counts.get('skipped', 0)} skipped, "
            f"{counts.get('lost', 0)} lost, {counts.get('seconds', 0) / 60:.1f} annotator minutes"
        )
