from __future__ import annotations

import pytest

from feedback_app.models import Rating
from reward_models.rows import rating_is_desirable
from tests.feedback_app.exports.helpers import prompt_until, rows, turns_from


@pytest.mark.parametrize(
    ("score", "thumb_up", "desirable"),
    [(None, True, True), (1, True, True), (5, False, False), (4, None, True), (2, None, False), (3, None, None)],
)
def test_a_thumb_decides_and_a_score_of_three_says_nothing(score, thumb_up, desirable):
    assert rating_is_desirable(score, thumb_up) is desirable


def test_ratings_become_prompt_completion_label_rows(project, annotator, other_annotator, grid_trajectory):
    good, bad, middling = (
        grid_trajectory(["right", "down"]),
        grid_trajectory(["up", "left"]),
        grid_trajectory(["down"]),
    )
    liked = Rating.objects.create(project=project, annotator=annotator, trajectory=good, thumb_up=True)
    Rating.objects.create(project=project, annotator=other_annotator, trajectory=good, score=5)
    disliked = Rating.objects.create(project=project, annotator=annotator, trajectory=bad, score=1)
    Rating.objects.create(project=project, annotator=annotator, trajectory=middling, score=3)

    exported = rows(project, "unpaired")

    assert [(row["trajectory_id"], row["label"]) for row in exported] == [(good.pk, True), (bad.pk, False)]
    first = exported[0]
    assert first["prompt"] == prompt_until(good, 0)
    assert first["completion"] == turns_from(good, 0)
    assert first["agreement"] == 1.0
    assert liked.pk in first["label_ids"] and len(first["label_ids"]) == 2
    assert exported[1]["label_ids"] == [disliked.pk]
    assert len(rows(project, "unpaired", aggregate="all")) == 3


def test_disagreeing_ratings_are_dropped_on_request(project, annotator, other_annotator, grid_trajectory):
    trajectory = grid_trajectory(["right"])
    Rating.objects.create(project=project, annotator=annotator, trajectory=trajectory, thumb_up=True)
    Rating.objects.create(project=project, annotator=other_annotator, trajectory=trajectory, thumb_up=False)
    assert rows(project, "unpaired") == []
    assert rows(project, "unpaired", aggregate="drop") == []
    assert sorted(row["label"] for row in rows(project, "unpaired", aggregate="all")) == [False, True]


def test_the_text_style_gives_strings(project, annotator, grid_trajectory):
    trajectory = grid_trajectory(["right", "down"])
    Rating.objects.create(project=project, annotator=annotator, trajectory=trajectory, thumb_up=True)
    [row] = rows(project, "unpaired", style="text")
    assert row["prompt"].endswith("\nAssistant:")
    assert row["completion"].startswith(" goal is ")
