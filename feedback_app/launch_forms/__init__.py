"""Launching any kind of run from the dashboard: what each kind's form asks for, and how a posted form (or an old
run, for a re-run) becomes a queued run.

The settings come from the run kind's config dataclass: its fields, types, defaults and ``help`` metadata, less the
ones Tandem fills in itself (the snapshot file, the base weights, the run directory, the environment, the judge
models' directories). A new setting in a trainer therefore appears on the dashboard without touching a template. A
posted value equal to its default is left out of the run's config, so the config records what the researcher chose.

Every launch goes through the same create functions as the REST API (`training.launch`), so the checks are the same
and a bad launch raises `LaunchError` naming each field with the names the form's inputs carry: ``snapshot``,
``base_policy``, ``judges.<setting>``, ``config.<setting>``, ``review.<option>`` and ``new_snapshot.<filter>``.

The modules, each standing on the ones before it:

- `forms`: the launchable kinds and each kind's form (`run_form`), and a posted form's config (`config_from_form`).
- `new_snapshot`: the filters of a snapshot frozen at launch, and freezing it (`NewSnapshot`).
- `launching`: storing and queueing a run (`launch_run`), re-running an old one (`rerun`, `launch_values`).
- `guidance`: what the form suggests before a launch: recipes for the tiny models and a run-time `estimate`.
"""
