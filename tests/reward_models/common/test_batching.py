"""Groups of like length: every row once, in order of shape, within the group size and the padding share; and
right-padded batches of token sequences."""

from __future__ import annotations

import random

import pytest

from reward_models.common.batching import length_groups, right_padded


@pytest.mark.parametrize("size", [None, 3])
def test_length_groups_take_every_row_once_in_order_of_shape_and_keep_padding_under_the_bound(size):
    generator = random.Random(0)
    shapes = [(generator.randint(1, 400), generator.randint(1, 40)) for _ in range(50)]

    groups = length_groups(shapes, size, waste=0.1)

    assert sorted(index for group in groups for index in group) == list(range(len(shapes)))
    flat = [shapes[index] for group in groups for index in group]
    assert flat == sorted(shapes)
    for group in groups:
        assert size is None or len(group) <= size
        width = sum(max(shapes[index][part] for index in group) for part in range(2))
        tokens = sum(sum(shapes[index]) for index in group)
        assert len(group) * width * 0.9 <= tokens
    # Padded as one batch, the same rows would be about half padding; grouped, at most a tenth of each group is.
    grouped = sum(len(g) * sum(max(shapes[i][part] for i in g) for part in range(2)) for g in groups)
    whole = len(shapes) * (max(p for p, _ in shapes) + max(c for _, c in shapes))
    assert grouped <= sum(map(sum, shapes)) / 0.9 < whole


def test_rows_of_one_length_share_a_group_up_to_its_size_and_a_lone_long_row_stands_alone():
    assert length_groups([(5,), (5,), (5,), (5,), (5,)], size=2) == [[0, 1], [2, 3], [4]]
    assert length_groups([(100,), (10,), (11,)]) == [[1, 2], [0]]
    assert length_groups([]) == []


def test_right_padded_batches_take_every_sequence_once_shortest_first_with_its_tokens_on_the_left():
    sequences = [[5, 6, 7], [8], [9, 10], [11, 12, 13, 14], [15]]

    batches = list(right_padded(sequences, batch_size=2, pad_token_id=0))

    assert [batch for batch, _, _ in batches] == [[1, 4], [2, 0], [3]]
    for batch, input_ids, attention_mask in batches:
        assert input_ids.shape == attention_mask.shape == (len(batch), max(len(sequences[i]) for i in batch))
        for row, index in enumerate(batch):
            length = len(sequences[index])
            assert input_ids[row, :length].tolist() == sequences[index]
            assert input_ids[row, length:].tolist() == [0] * (input_ids.shape[1] - length)
            assert attention_mask[row].tolist() == [1] * length + [0] * (input_ids.shape[1] - length)
