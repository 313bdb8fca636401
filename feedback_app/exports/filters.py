"""What an export request may ask for, validated once, with errors that name the field.

`ExportFilters.from_query(params)` reads a query string (or any mapping of strings, e.g. a snapshot's stored
filters), `check_kind(kind)` refuses options that mean nothing for that kind, and `as_dict()` gives the JSON-safe
form a `DatasetSnapshot` stores and `from_query` reads back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from feedback_app.models.trajectories import TrajectorySource
from feedback_app.text_checks import INT64_MAX


class ExportKind(StrEnum):
    PREFERENCE = "preference"
    STEP_PREFERENCE = "step_preference"
    STEPWISE = "stepwise"
    UNPAIRED = "unpaired"
    SFT = "sft"
    CRITIQUES = "critiques"
    RAW = "raw"
    RETURNS = "returns"


class ExportFormat(StrEnum):
    JSONL = "jsonl"
    PARQUET = "parquet"


class Aggregation(StrEnum):
    """How several annotators' current labels of one item become rows.

    majority: one row with the most common judgement; a tied vote gives no row. drop: one row only when every label
    agrees. all: one row per label.
    """

    MAJORITY = "majority"
    DROP = "drop"
    ALL = "all"


class Neutral(StrEnum):
    """What a 0 step label becomes in a `stepwise` export: dropped (the step stays as context, unlabelled), or
    counted as a good or a bad step."""

    DROP = "drop"
    POSITIVE = "positive"
    NEGATIVE = "negative"


class Ties(StrEnum):
    """What a tie verdict becomes in a `preference` or `step_preference` export: no row (the default, so that a
    file TRL's `RewardTrainer` reads as it is never trains a tie as a preference), or a row with `tie: true` for a
    tie-aware loss. With `include`, every row carries the `tie` column; with `drop` no row does."""

    DROP = "drop"
    INCLUDE = "include"


class Interventions(StrEnum):
    """Whether a `stepwise` export also has the step labels interventions imply (RLIF): the steps before the
    intervened one accepted, the intervened one rejected."""

    INCLUDE = "include"
    EXCLUDE = "exclude"


class Style(StrEnum):
    """Conversational: `prompt`/`chosen`/`completion` are lists of chat messages. Text: the same turns as one
    plain transcript string each."""

    CONVERSATIONAL = "conversational"
    TEXT = "text"


# Kinds whose rows aggregate several annotators' labels of one item, so `aggregate` and `min_agreement` mean
# something there.
AGGREGATED_KINDS = {ExportKind.PREFERENCE, ExportKind.STEP_PREFERENCE, ExportKind.STEPWISE, ExportKind.UNPAIRED}
STYLED_KINDS = {
    ExportKind.PREFERENCE,
    ExportKind.STEP_PREFERENCE,
    ExportKind.STEPWISE,
    ExportKind.UNPAIRED,
    ExportKind.CRITIQUES,
    ExportKind.RETURNS,
}
# Kinds made from comparisons, where a tie verdict can become a row.
TIED_KINDS = {ExportKind.PREFERENCE, ExportKind.STEP_PREFERENCE}

FILTER_FIELDS = (
    "since",
    "until",
    "annotators",
    "policy_versions",
    "sources",
    "min_agreement",
    "exclude_gold",
    "aggregate",
    "neutral",
    "style",
    "ties",
    "interventions",
)
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class ExportRequestError(ValueError):
    """A bad export request. `errors` maps each bad field to the reason, ready for a 400 response body."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{name}: {reason}" for name, reason in self.errors.items()))


@dataclass(frozen=True)
class ExportFilters:
    """Which labels an export reads and how it shapes them. The defaults export every current label.

    Dates bound the labels' `created_at` (in a `returns` export, which reads trajectories rather than labels, the
    trajectories' `created_at`), both ends inclusive; a bare date as `until` covers that whole day.
    `policy_versions` keeps a row only when every trajectory in it comes from one of those versions, and `sources`
    when every one has one of those sources (`policy`, `human`, `import`): imported trajectories, say, can be left
    out of a snapshot their rows do not suit.
    """

    since: dt.datetime | None = None
    until: dt.datetime | None = None
    annotators: tuple[int, ...] = ()
    policy_versions: tuple[int, ...] = ()
    sources: tuple[str, ...] = ()
    min_agreement: float | None = None
    exclude_gold: bool = False
    aggregate: Aggregation = Aggregation.MAJORITY
    neutral: Neutral = Neutral.DROP
    style: Style = Style.CONVERSATIONAL
    ties: Ties = Ties.DROP
    interventions: Interventions = Interventions.INCLUDE

    @classmethod
    def from_query(cls, params: Mapping[str, Any], *, other_names: Iterable[str] = ()) -> ExportFilters:
        """Parse a query-string-like mapping. Values may be strings, lists of strings (repeated query parameters,
        e.g. a QueryDict) or, from stored JSON, the typed values `as_dict()` wrote. Names other than the filters and
        `other_names` (e.g. `format`, which shares the query string) are refused, so a misspelt filter is not
        silently ignored; every bad name and value is reported at once.

        >>> ExportFilters.from_query({"annotators": "3,5", "min_agreement": "0.6"}).annotators
        (3, 5)
        """
        errors: dict[str, str] = {}
        values: dict[str, Any] = {}
        for name in set(params) - set(FILTER_FIELDS) - set(other_names):
            errors[name] = f"is not a filter; the filters are {', '.join(FILTER_FIELDS)}."

        def read(name: str, parse) -> None:
            raw = _values(params, name)
            if not raw:
                return
            try:
                values[name] = parse(raw)
            except ValueError as exc:
                errors[name] = str(exc)

        read("since", lambda raw: _parse_moment(_single(raw), end_of_day=False))
        read("until", lambda raw: _parse_moment(_single(raw), end_of_day=True))
        read("annotators", lambda raw: _parse_ids(raw, "a user id"))
        read("policy_versions", lambda raw: _parse_ids(raw, "a policy version id"))
        read("sources", _parse_sources)
        read("min_agreement", lambda raw: _parse_share(_single(raw)))
        read("exclude_gold", lambda raw: _parse_bool(_single(raw)))
        read("aggregate", lambda raw: _parse_choice(Aggregation, _single(raw)))
        read("neutral", lambda raw: _parse_choice(Neutral, _single(raw)))
        read("style", lambda raw: _parse_choice(Style, _single(raw)))
        read("ties", lambda raw: _parse_choice(Ties, _single(raw)))
        read("interventions", lambda raw: _parse_choice(Interventions, _single(raw)))
        if "since" in values and "until" in values and values["since"] > values["until"]:
            errors["until"] = "must not be earlier than since."
        if errors:
            raise ExportRequestError(errors)
        return cls(**values)

    def check_kind(self, kind: ExportKind) -> None:
        """Refuse options that do not apply to `kind`, rather than silently ignoring them."""
        errors = {}
        if kind not in AGGREGATED_KINDS:
            if self.min_agreement is not None:
                errors["min_agreement"] = f"{kind} exports do not aggregate labels, so agreement does not apply."
            if self.aggregate != Aggregation.MAJORITY:
                errors["aggregate"] = f"{kind} exports do not aggregate labels."
        if kind != ExportKind.STEPWISE and self.neutral != Neutral.DROP:
            errors["neutral"] = "applies to stepwise exports only."
        if kind not in STYLED_KINDS and self.style != Style.CONVERSATIONAL:
            errors["style"] = f"{kind} exports have one fixed layout; style applies to {_names(STYLED_KINDS)}."
        if kind not in TIED_KINDS and self.ties != Ties.DROP:
            errors["ties"] = f"applies to {_names(TIED_KINDS)} exports only."
        if kind != ExportKind.STEPWISE and self.interventions != Interventions.INCLUDE:
            errors["interventions"] = "applies to stepwise exports only."
        if kind == ExportKind.RETURNS:
            # Rows are trajectories, not labels: nobody labelled them, and no queue item made them gold.
            if self.annotators:
                errors["annotators"] = "returns exports read trajectories, not labels, so annotators do not apply."
            if self.exclude_gold:
                errors["exclude_gold"] = "returns exports read trajectories, not labels, so gold does not apply."
        if errors:
            raise ExportRequestError(errors)

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe, with only the fields that differ from the defaults; `from_query` reads it back."""
        out: dict[str, Any] = {}
        default = ExportFilters()
        for name in FILTER_FIELDS:
            value = getattr(self, name)
            if value == getattr(default, name):
                continue
            if isinstance(value, dt.datetime):
                value = value.isoformat()
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, StrEnum):
                value = value.value
            out[name] = value
        return out


def parse_kind(value: str) -> ExportKind:
    try:
        return _parse_choice(ExportKind, value)
    except ValueError as exc:
        raise ExportRequestError({"kind": str(exc)}) from None


def parse_format(value: str | None) -> ExportFormat:
    try:
        return _parse_choice(ExportFormat, value or ExportFormat.JSONL)
    except ValueError as exc:
        raise ExportRequestError({"format": str(exc)}) from None


def _names(choices: Iterable[StrEnum]) -> str:
    return ", ".join(sorted(str(choice) for choice in choices))


def _values(params: Mapping[str, Any], name: str) -> list[Any]:
    if hasattr(params, "getlist"):  # a QueryDict: repeated parameters
        raw = params.getlist(name)
    else:
        raw = params.get(name)
        raw = [] if raw is None else raw if isinstance(raw, list | tuple) else [raw]
    return [value for value in raw if value != ""]


def _single(raw: list[Any]) -> Any:
    if len(raw) > 1:
        raise ValueError("give one value, not several.")
    return raw[0]


def _parse_moment(value: Any, *, end_of_day: bool) -> dt.datetime:
    text = str(value).strip()
    try:
        # A bare date first: parse_datetime would also read it, as midnight.
        day = parse_date(text)
        moment = dt.datetime.combine(day, dt.time.max if end_of_day else dt.time.min) if day else parse_datetime(text)
    except ValueError:  # well formed but impossible, e.g. 2025-02-30
        moment = None
    if moment is None:
        raise ValueError(f"{text!r} is not an ISO 8601 date or date-time (e.g. 2025-03-01 or 2025-03-01T12:00Z).")
    try:
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment)
        # The database compares in UTC: a moment that does not exist there (9999-12-31T23:00-05:00) is refused, and
        # the rest are sent in UTC (PostgreSQL refuses offsets beyond 15:59, which ISO 8601 allows up to 23:59).
        return moment.astimezone(dt.UTC)
    except (OverflowError, ValueError):
        raise ValueError(f"{text!r} lies outside the calendar the database can store.") from None


def _parse_ids(raw: list[Any], what: str) -> tuple[int, ...]:
    ids: list[int] = []
    for value in raw:
        parts = [value] if isinstance(value, int) else str(value).split(",")
        for part in parts:
            part = str(part).strip()
            if not (part.isascii() and part.isdigit()) or int(part) > INT64_MAX:
                raise ValueError(f"{part!r} is not {what}; give positive integers, comma-separated or repeated.")
            ids.append(int(part))
    return tuple(sorted(set(ids)))


def _parse_sources(raw: list[Any]) -> tuple[str, ...]:
    sources = {part.strip() for value in raw for part in str(value).split(",") if part.strip()}
    unknown = sorted(sources - set(TrajectorySource.values))
    if unknown or not sources:
        raise ValueError(
            f"{', '.join(unknown) or 'nothing'} is not a trajectory source; the sources are "
            f"{', '.join(TrajectorySource.values)}, comma-separated or repeated."
        )
    return tuple(sorted(sources))


def _parse_share(value: Any) -> float:
    try:
        share = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a number.") from None
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"must lie between 0 and 1, got {share}.")
    return share


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{value!r} is not a boolean; use true or false.")


def _parse_choice(choices: type[StrEnum], value: Any):
    try:
        return choices(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not one of {_names(choices)}.") from None
