"""TRL's `RewardTrainer` that keeps a ``tie`` column and trains tie rows towards P = 1/2. It imports torch and TRL
at the top, so the pipeline imports it only when a member trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from trl import RewardTrainer
from trl.trainer.reward_trainer import DataCollatorForPreference


@dataclass
class TiePreferenceCollator(DataCollatorForPreference):
    """TRL's preference collator that also batches each row's ``tie`` flag."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().torch_call(examples)
        batch["tie"] = torch.tensor([bool(example["tie"]) for example in examples])
        return batch


class TandemRewardTrainer(RewardTrainer):
    """Without a ``tie`` column this is TRL's `RewardTrainer` unchanged; with one (``ties="tie_loss"``), tie
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
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        tie = inputs["tie"]
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False)
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
