from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from feedback_app.gold import make_gold_items
from feedback_app.models import LabelKind, Project


class Command(BaseCommand):
    help = (
        "Create gold items in PROJECT whose answers the environment's oracle knows: comparisons of two trajectories "
        "of the same task with clearly different true returns, or trajectories whose first wrong step is known. "
        "They are served unannounced, at the project's gold fraction, to measure each annotator's accuracy."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("project", help="Project slug.")
        parser.add_argument("--count", type=int, required=True, help="How many gold items to create.")
        parser.add_argument("--kind", choices=[LabelKind.COMPARISON, LabelKind.STEP_LABEL], required=True)
        parser.add_argument("--priority", type=int, default=0)
        parser.add_argument(
            "--min-margin", type=float, default=0.5, help="Comparisons: the least difference in true return."
        )
        parser.add_argument("--overlap", type=int, default=None, help="Annotators per item (default: the project's).")

    def handle(self, *args, project: str, count: int, kind: str, priority: int, min_margin: float, **options):
        target = Project.objects.filter(slug=project).select_related("environment").first()
        if target is None:
            raise CommandError(f"project: no project with slug {project!r}.")
        if options["overlap"] is not None and options["overlap"] < 1:
            raise CommandError(f"overlap: must be at least 1, got {options['overlap']}.")
        try:
            items = make_gold_items(
                target, count=count, kind=kind, priority=priority, min_margin=min_margin, overlap=options["overlap"]
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        message = f"Created {len(items)} gold {kind} item{'s' if len(items) != 1 else ''} in {target.slug}."
        if len(items) < count:
            hint = "a clear margin in true return" if kind == LabelKind.COMPARISON else "known step correctness"
            self.stderr.write(f"Asked for {count}, but only {len(items)} new candidates with {hint} were found.")
        self.stdout.write(self.style.SUCCESS(message))
