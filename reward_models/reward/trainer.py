"""TRL's `RewardTrainer` that keeps a ``tie`` column and trains tie rows towards P = 1/2. It imports torch and TRL
at the top, so the pipeline imports it only when a member trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import SequenceClassifierOutput
from trl import RewardTrainer
from trl.trainer.reward_trainer import DataCollatorForPreference

from reward_models.common.batching import length_groups


@dataclass
class TiePreferenceCollator(DataCollatorForPreference):
    """TRL's preference collator that also batches each row's ``tie`` flag."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().torch_call(examples)
        batch["tie"] = torch.tensor([bool(example["tie"]) for example in examples])
        return batch


class TandemRewardTrainer(RewardTrainer):
    """Without a ``tie`` column this is TRL's `RewardTrainer`, its batches run in groups of like length
    (`_ByLength`: the same rewards and gradients, with less padding to compute); with one (``ties="tie_loss"``), tie
    rows take -1/2 log sigmoid(d) - 1/2 log sigmoid(-d) and the others TRL's margin loss, and accuracy counts
    the others only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.with_ties = "tie" in kwargs["train_dataset"].column_names
        if self.with_ties:
            kwargs["data_collator"] = TiePreferenceCollator(pad_token_id=kwargs["processing_class"].pad_token_id)
        super().__init__(*args, **kwargs)

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:
            self._signature_columns = ["chosen_ids", "rejected_ids", "margin", "tie"]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "tie" not in inputs:
            return super().compute_loss(self._by_length(model), inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        tie = inputs["tie"]
        outputs = self._by_length(model)(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        chosen, rejected = torch.chunk(outputs.logits.squeeze(-1), chunks=2)
        difference = chosen - rejected
        shifted = difference - inputs["margin"] if "margin" in inputs else difference
        preference_loss = -F.logsigmoid(shifted)
        tie_loss = -0.5 * (F.logsigmoid(difference) + F.logsigmoid(-difference))
        loss = torch.where(tie, tie_loss, preference_loss).mean()
        with torch.no_grad():
            gather = self.accelerator.gather_for_metrics
            self._metrics[mode]["mean_reward"].append(gather(outputs.logits).mean().item())
            strict = gather(~tie)
            correct = gather((difference > 0) & ~tie)
            if strict.any():
                self._metrics[mode]["accuracy"].append((correct.sum() / strict.sum()).item())
            gaps = gather(torch.where(tie, difference.abs(), torch.zeros_like(difference)))
            if (~strict).any():
                self._metrics[mode]["tie_gap"].append((gaps.sum() / (~strict).sum()).item())
        return (loss, outputs) if return_outputs else loss

    def _by_length(self, model: Any) -> Any:
        """`model` run in groups of like length; on more than one process, as one batch (a distributed model expects
        one forward pass per backward: several would mark its parameters ready twice)."""
        return _ByLength(model, grouped=self.accelerator.num_processes == 1)


class _ByLength:
    """`model` over a right-padded batch, run in groups of like length (`batching.length_groups`), each cut to its
    longest row: a row's reward reads its last token that is not padding, which no padding after it changes, so the
    rewards (and their gradients) are the whole batch's, up to dropout, with less padding to compute. The batch's
    chosen and rejected trajectories of an agent can differ in length many times over. A batch of another form
    (padded on the left, or with inputs besides the ids and the mask), or any batch when not `grouped`, runs as one."""

    def __init__(self, model: Any, grouped: bool = True) -> None:
        self.model = model
        self.grouped = grouped

    def __call__(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor, **inputs: Any) -> Any:
        lengths = attention_mask.sum(dim=-1)
        right_padded = bool((attention_mask.cumprod(dim=-1).sum(dim=-1) == lengths).all())
        if not self.grouped or not right_padded or set(inputs) - {"margin", "use_cache"}:
            extra = {key: value for key, value in inputs.items() if key != "margin"}
            return self.model(input_ids=input_ids, attention_mask=attention_mask, **{"use_cache": False, **extra})
        lengths = lengths.tolist()
        groups = length_groups([(length,) for length in lengths])
        logits = []
        for group in groups:
            rows = torch.tensor(group, device=input_ids.device)
            width = max(lengths[row] for row in group)
            output = self.model(
                input_ids=input_ids[rows, :width], attention_mask=attention_mask[rows, :width], use_cache=False
            )
            logits.append(output.logits)
        order = torch.tensor([row for group in groups for row in group], device=input_ids.device)
        return SequenceClassifierOutput(logits=torch.cat(logits)[order.argsort()])
