from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from feedback_app.imports import ImportRejected, import_trajectories, iter_json_rows, validate_rows
from feedback_app.models import Project


class Command(BaseCommand):
    help = (
        "Import external trajectories from a JSONL file (or a JSON array) into a project. Every row is validated "
        "first; if any row is bad nothing is imported and each bad row is listed. Rows whose external_id is "
        "already stored are skipped, so a retried import duplicates nothing."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("project", help="Project id or slug.")
        parser.add_argument("path", type=Path, help="JSONL file, one trajectory per line.")

    def handle(self, *args, project: str, path: Path, **options) -> None:
        target = Project.objects.filter(slug=project).first()
        if target is None and project.isdigit():
            target = Project.objects.filter(pk=int(project)).first()
        if target is None:
            raise CommandError(f"project: no project with id or slug {project!r}.")
        if not path.is_file():
            raise CommandError(f"path: {path} is not a file.")
        with path.open("rb") as stream:
            try:
                rows = validate_rows(iter_json_rows(stream))
            except ImportRejected as exc:
                raise CommandError(str(exc)) from None
        result = import_trajectories(target, rows)
        self.stdout.write(
            self.style.SUCCESS(
                f"Imported {result.created} trajectories into {target.slug}; "
                f"{result.skipped_existing} already present and skipped."
            )
        )
