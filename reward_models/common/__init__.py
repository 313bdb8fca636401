"""What every training pipeline in `reward_models` shares, with no Django, one concern to a module: config checking
(`config`), the settings every judge model shares (`judge_config`), the command line (`cli`), progress reporting
(`reporting`), devices and precision (`runtime`), reading exported rows (`data`), and checkpoints and the artifact
manifest (`artifacts`).

A pipeline is a dataclass config and ``main(config, reporter) -> dict``. Tandem's Celery task builds the config from a
run and passes a reporter that writes progress and metrics onto the run row and raises when the run is cancelled;
``python -m reward_models.<pipeline>`` builds it from flags and prints progress to the terminal::

    @dataclass
    class RewardConfig(JudgeConfig):  # reward_models.common.judge_config
        ...

    def main(config: RewardConfig, reporter: Reporter | None = None) -> dict: ...

    if __name__ == "__main__":
        cli(RewardConfig, main, __doc__)
"""
