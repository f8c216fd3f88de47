"""oprl: off-policy RL fine-tuning of language models with group-relative REINFORCE and its relatives.

Layout (imports flow one way: cli -> runtime -> {rollout, models, algorithms, tasks}):
- ``oprl.algorithms``: pure tensor math (advantages, policy losses, presets, the consistency surrogate).
- ``oprl.tasks``: what to learn: the Task protocol, problem generators and reward functions.
- ``oprl.models``: Hugging Face glue: the embedded tiny model, loading, log-prob computation.
- ``oprl.rollout``: how samples are produced (Hugging Face ``generate``) with behaviour log-probs.
- ``oprl.runtime``: where and when: experiences, the off-policy schedule, trainer, the training loop.
"""

__version__ = "0.1.0"
