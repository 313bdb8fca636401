"""Policy trainers: labels and judge models become a new policy directory. No Django here.

Every trainer has a dataclass config (``config.PolicyTrainConfig`` and its subclasses), a ``main(config, reporter)``
and a command line (``python -m reward_models.finetune.<trainer> --help``). The loss only ever covers the policy's
own tokens, its assistant turns: observations and tool results are prompt tokens (``turns.encode_conversation``).
"""
