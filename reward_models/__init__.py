"""Plain torch/transformers code for Tandem: environments, policies, rollouts and (later) reward-model and policy
trainers.

Nothing under this package imports Django, so a researcher can use it from a notebook or a script. Subpackages that
the web process imports (``reward_models.envs``, ``reward_models.rollout``) import torch only inside the functions
that need it.
"""
