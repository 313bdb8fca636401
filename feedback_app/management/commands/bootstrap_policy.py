from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from feedback_app.models import PolicyVersion, Project, RunStatus
from training.launch import bootstrap_in_process


class Command(BaseCommand):
    help = (
        "Train the built-in tiny policy of PROJECT's environment (the gridworld or the tool-use shop) by supervised "
        "fine-tuning on noisy scripted demonstrations and register it as a policy version of PROJECT. Deterministic "
        "for a given --seed; shows a progress bar; about 2 minutes on 2 CPU cores for the gridworld. The shop's "
        "policy with its default settings ships with Tandem and is copied and evaluated instead of trained."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("project", help="Project slug.")
        parser.add_argument("--name", required=True, help="Name of the new policy version.")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--noise", type=float, default=None, help="Share of random actions in the demos.")
        parser.add_argument("--steps", type=int, default=None, help="Optimiser steps.")

    def handle(self, *args, project: str, name: str, seed: int, noise: float | None, steps: int | None, **options):
        target = Project.objects.filter(slug=project).first()
        if target is None:
            raise CommandError(f"project: no project with slug {project!r}.")
        if PolicyVersion.objects.filter(project=target, name=name).exists():
            raise CommandError(f"name: project {project} already has a policy version called {name!r}.")
        config = {"policy_name": name, "seed": seed}
        if noise is not None:
            config["noise"] = noise
        if steps is not None:
            config["max_train_steps"] = steps
        try:
            run = bootstrap_in_process(target, config)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if run.status != RunStatus.SUCCEEDED:
            raise CommandError(f"Run {run.pk} failed:\n{run.error}")
        self.stdout.write(
            self.style.SUCCESS(
                f"Registered {name}: held-out success {run.summary['greedy_success']:.1%} greedy, "
                f"{run.summary['sampled_success']:.1%} sampled, in {run.summary['wall_seconds']:.0f} s."
            )
        )
