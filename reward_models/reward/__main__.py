"""``python -m reward_models.reward``: train a reward model from flags (``--help`` lists them)."""

from reward_models import reward
from reward_models.common.cli import cli
from reward_models.reward.config import RewardConfig
from reward_models.reward.train import main

if __name__ == "__main__":
    cli(RewardConfig, main, reward.__doc__)
