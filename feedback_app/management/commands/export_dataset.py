from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from feedback_app import exports
from feedback_app.models import Project

FILTER_OPTIONS = (
    "since",
    "until",
    "annotators",
    "policy_versions",
    "min_agreement",
    "aggregate",
    "neutral",
    "style",
    "ties",
    "interventions",
)


class Command(BaseCommand):
    help = (
        "Write a dataset export (the same rows as GET /api/projects/<id>/exports/<kind>) to a file, or freeze it "
        "as a named snapshot with --snapshot."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("project", help="Project id or slug.")
        parser.add_argument("kind", choices=[kind.value for kind in exports.ExportKind])
        parser.add_argument("--format", dest="fmt", choices=[f.value for f in exports.ExportFormat], default="jsonl")
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--out", type=Path, help="File to write.")
        target.add_argument("--snapshot", metavar="NAME", help="Store a DatasetSnapshot with this name instead.")
        parser.add_argument("--since", help="Labels created at or after (ISO 8601 date or date-time).")
        parser.add_argument("--until", help="Labels created at or before; a bare date covers the whole day.")
        parser.add_argument("--annotators", help="Comma-separated user ids.")
        parser.add_argument("--policy-versions", help="Comma-separated policy version ids.")
        parser.add_argument("--min-agreement", help="0 to 1.")
        parser.add_argument("--exclude-gold", action="store_true")
        parser.add_argument("--aggregate", choices=[a.value for a in exports.Aggregation])
        parser.add_argument("--neutral", choices=[n.value for n in exports.Neutral])
        parser.add_argument("--style", choices=[s.value for s in exports.Style])
        parser.add_argument(
            "--ties", choices=[t.value for t in exports.Ties], help="preference/step_preference: tie rows."
        )
        parser.add_argument(
            "--interventions",
            choices=[i.value for i in exports.Interventions],
            help="stepwise: intervention-derived rows.",
        )

    def handle(self, *args, project: str, kind: str, fmt: str, out: Path | None, snapshot: str | None, **options):
        target = Project.objects.filter(slug=project).first()
        if target is None and project.isdigit():
            target = Project.objects.filter(pk=int(project)).first()
        if target is None:
            raise CommandError(f"project: no project with id or slug {project!r}.")
        query = {name: options[name] for name in FILTER_OPTIONS if options[name] is not None}
        if options["exclude_gold"]:
            query["exclude_gold"] = "true"
        try:
            filters = exports.ExportFilters.from_query(query)
            filters.check_kind(exports.ExportKind(kind))
            if snapshot is not None:
                frozen = exports.create_snapshot(target, kind, filters, user=None, name=snapshot, fmt=fmt)
                self.stdout.write(
                    self.style.SUCCESS(
                        f"Snapshot {frozen.pk} {frozen.name!r}: {frozen.row_count} rows, sha256 {frozen.content_hash}"
                    )
                )
                return
        except exports.ExportRequestError as exc:
            raise CommandError(str(exc)) from None
        tally = exports.RowTally()
        # Written beside the target and renamed at the end, so a failed export never leaves half a file at `out`.
        partial = out.with_name(out.name + ".part")
        try:
            with partial.open("wb") as stream:
                for chunk in exports.export_chunks(
                    target, exports.ExportKind(kind), filters, exports.ExportFormat(fmt), tally
                ):
                    stream.write(chunk)
            partial.replace(out)
        finally:
            partial.unlink(missing_ok=True)
        self.stdout.write(self.style.SUCCESS(f"Wrote {tally.count} {kind} rows to {out}."))
