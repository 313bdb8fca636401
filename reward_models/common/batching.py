"""Batches of like length: which rows to pad together so that padding, which every row of a padded batch computes
as if it were tokens, stays a small share of the work.

A trainer's loss over a batch is a sum (or mean) over its rows, and each row of a padded batch computes as it would
alone (padding is masked out), so a batch can be run as groups of like length, their gradients accumulating, and
give what the whole batch gives. Trajectories of an agent vary in length many times over (a late turn carries the
whole history, a first turn little), so a batch padded as one can be mostly padding.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def length_groups(shapes: Sequence[tuple[int, ...]], size: int | None = None, waste: float = 0.1) -> list[list[int]]:
    """Indices into `shapes` in groups of like shape, at most `size` rows each, in order of shape. A row's shape is
    its lengths in the parts its batch pads separately (a turn's prompt and completion; a sequence's one length): a
    group is as wide as its widest row in each part. A group is closed before a row that would leave more than
    `waste` of the group's padded cells as padding."""
    groups: list[list[int]] = []
    widest: tuple[int, ...] = ()
    tokens = 0
    for index in sorted(range(len(shapes)), key=lambda index: shapes[index]):
        shape = shapes[index]
        width = tuple(map(max, widest, shape)) if widest else tuple(shape)
        room = groups and (size is None or len(groups[-1]) < size)
        if room and (len(groups[-1]) + 1) * sum(width) * (1 - waste) <= tokens + sum(shape):
            groups[-1].append(index)
            widest, tokens = width, tokens + sum(shape)
        else:
            groups.append([index])
            widest, tokens = tuple(shape), sum(shape)
    return groups


def right_padded(
    sequences: Sequence[list[int]], batch_size: int, pad_token_id: int
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Token sequences in batches of at most `batch_size`, shortest first, each padded on the right to its longest
    row: ``(the batch's indices into sequences, input_ids, attention_mask)``. TRL's collators pad on the right in
    training, whatever side the tokenizer pads, so a head that reads a row's last token that is not padding reads
    it where it did in training."""
    order = sorted(range(len(sequences)), key=lambda index: len(sequences[index]))
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        yield batch, *pad_right([sequences[index] for index in batch], pad_token_id)


def pad_right(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences as one batch padded on the right to the longest: ``(input_ids, attention_mask)``."""
    import torch

    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask
