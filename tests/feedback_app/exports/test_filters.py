from __future__ import annotations

import datetime as dt

import pytest
from django.http import QueryDict

from feedback_app.exports import Aggregation, ExportFilters, ExportKind, ExportRequestError, Neutral, Style
from feedback_app.exports.filters import parse_format, parse_kind


def test_it_reads_repeated_and_comma_separated_ids():
    filters = ExportFilters.from_query(QueryDict("annotators=5,3&annotators=9&policy_versions=2"))
    assert filters.annotators == (3, 5, 9)
    assert filters.policy_versions == (2,)


def test_it_reads_every_option():
    filters = ExportFilters.from_query(
        {
            "since": "2025-03-01",
            "until": "2025-03-02T12:30:00+00:00",
            "min_agreement": "0.75",
            "exclude_gold": "yes",
            "aggregate": "all",
            "neutral": "negative",
            "style": "text",
        }
    )
    assert filters.since == dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
    assert filters.until == dt.datetime(2025, 3, 2, 12, 30, tzinfo=dt.UTC)
    assert filters.min_agreement == 0.75
    assert filters.exclude_gold is True
    assert (filters.aggregate, filters.neutral, filters.style) == (Aggregation.ALL, Neutral.NEGATIVE, Style.TEXT)


def test_a_bare_date_as_until_covers_the_whole_day():
    filters = ExportFilters.from_query({"until": "2025-03-02"})
    assert filters.until.date() == dt.date(2025, 3, 2)
    assert filters.until.time() == dt.time.max


def test_it_names_every_bad_field_at_once():
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters.from_query(
            {"since": "2025-02-30", "annotators": "3,bob", "min_agreement": "1.5", "exclude_gold": "maybe"}
        )
    errors = caught.value.errors
    assert set(errors) == {"since", "annotators", "min_agreement", "exclude_gold"}
    assert "'bob'" in errors["annotators"]
    assert "between 0 and 1" in errors["min_agreement"]


def test_it_rejects_unknown_choices_listing_the_valid_ones():
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters.from_query({"aggregate": "mean"})
    assert caught.value.errors == {"aggregate": "'mean' is not one of all, drop, majority."}


def test_it_rejects_until_before_since():
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters.from_query({"since": "2025-03-02", "until": "2025-03-01"})
    assert set(caught.value.errors) == {"until"}


def test_it_refuses_options_that_mean_nothing_for_the_kind():
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters(min_agreement=0.5, style=Style.TEXT).check_kind(ExportKind.SFT)
    assert set(caught.value.errors) == {"min_agreement", "style"}
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters(neutral=Neutral.POSITIVE).check_kind(ExportKind.PREFERENCE)
    assert set(caught.value.errors) == {"neutral"}
    ExportFilters(neutral=Neutral.POSITIVE, min_agreement=0.5).check_kind(ExportKind.STEPWISE)


def test_as_dict_round_trips_through_json_keeping_only_what_differs():
    filters = ExportFilters.from_query(
        {"since": "2025-03-01T08:00:00Z", "annotators": "4,2", "exclude_gold": "true", "aggregate": "drop"}
    )
    stored = filters.as_dict()
    assert set(stored) == {"since", "annotators", "exclude_gold", "aggregate"}
    assert stored["annotators"] == [2, 4]
    assert ExportFilters.from_query(stored) == filters
    assert ExportFilters().as_dict() == {}


def test_kind_and_format_errors_name_their_field():
    assert parse_kind("stepwise") == ExportKind.STEPWISE
    assert parse_format(None).value == "jsonl"
    with pytest.raises(ExportRequestError) as caught:
        parse_kind("pairs")
    assert set(caught.value.errors) == {"kind"}
    with pytest.raises(ExportRequestError) as caught:
        parse_format("csv")
    assert set(caught.value.errors) == {"format"}


def test_a_misspelt_filter_is_refused_not_ignored():
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters.from_query({"min_agrement": "0.5", "format": "jsonl"})
    assert set(caught.value.errors) == {"min_agrement", "format"}
    assert "min_agreement" in caught.value.errors["min_agrement"]
    assert ExportFilters.from_query({"format": "jsonl"}, other_names=["format"]) == ExportFilters()


def test_ties_and_interventions_default_to_the_old_behaviour_and_round_trip():
    from feedback_app.exports import Interventions, Ties

    assert (ExportFilters().ties, ExportFilters().interventions) == (Ties.DROP, Interventions.INCLUDE)
    filters = ExportFilters.from_query({"ties": "include", "interventions": "exclude"})
    assert (filters.ties, filters.interventions) == (Ties.INCLUDE, Interventions.EXCLUDE)
    assert filters.as_dict() == {"ties": "include", "interventions": "exclude"}
    assert ExportFilters.from_query(filters.as_dict()) == filters
    # Snapshots stored before these options existed read back with the defaults.
    assert ExportFilters.from_query({"ties": "drop", "interventions": "include"}).as_dict() == {}
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters.from_query({"ties": "keep"})
    assert caught.value.errors == {"ties": "'keep' is not one of drop, include."}
