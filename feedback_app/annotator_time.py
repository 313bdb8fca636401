"""The annotator-time model: how many seconds a person spends on each kind of label.

Simulated annotators (`feedback_app.simulated`) record these seconds as each label's ``seconds_spent``, where the
annotator pages record a person's, and the loop benchmark adds them up into annotator minutes: the budget at which it
compares kinds of feedback. The defaults are assumptions, not measurements. The dashboard's overview shows the median
time a project's annotators really took per kind of label, as the ``kind=seconds,...`` value (``AnnotatorTime.parse``)
that puts those medians here.

No Django here: the benchmarks use it from plain processes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AnnotatorTime:
    """Seconds per label, by kind. A kind's cost is what one label of it takes, reading included."""

    comparison: float = field(default=30.0, metadata={"help": "Read two trajectories side by side and choose."})
    step_label: float = field(default=6.0, metadata={"help": "Judge one step, labelling a trajectory step by step."})
    first_error: float = field(
        default=20.0, metadata={"help": "Find and mark a trajectory's first wrong step; the steps before it are good."}
    )
    critique: float = field(default=45.0, metadata={"help": "Write what went wrong and what to do instead."})
    rating: float = field(default=10.0, metadata={"help": "Rate a whole trajectory."})
    intervention: float = field(default=40.0, metadata={"help": "Pick the wrong step and write the corrected turn."})
    takeover_step: float = field(
        default=20.0, metadata={"help": "Each further step an annotator plays by hand after taking over."}
    )

    def __post_init__(self) -> None:
        for name in self.kinds():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: expected seconds (a number, 0 or more), got {value!r}")

    @classmethod
    def kinds(cls) -> tuple[str, ...]:
        return tuple(item.name for item in dataclasses.fields(cls))

    @classmethod
    def parse(cls, text: str) -> AnnotatorTime:
        """``comparison=25,step_label=4``: the defaults, with the kinds named changed. An unknown kind or a value
        that is not seconds is a ValueError that names it."""
        values: dict[str, float] = {}
        for part in filter(None, (piece.strip() for piece in text.split(","))):
            name, equals, raw = part.partition("=")
            name = name.strip()
            if not equals or name not in cls.kinds():
                raise ValueError(f"{part!r}: expected kind=seconds, the kind one of {', '.join(cls.kinds())}")
            try:
                values[name] = float(raw)
            except ValueError:
                raise ValueError(f"{name}: expected seconds, got {raw.strip()!r}") from None
        return cls(**values)

    def argument(self) -> str:
        """The value ``parse`` reads back as these figures."""
        return ",".join(f"{name}={getattr(self, name):g}" for name in self.kinds())

    def seconds(self, kind: str, count: int = 1) -> float:
        return getattr(self, kind) * count

    def intervention_seconds(self, steps_played: int = 1) -> float:
        """An intervention that corrects one step, plus each further step played by hand (a takeover)."""
        return self.intervention + self.takeover_step * max(steps_played - 1, 0)
