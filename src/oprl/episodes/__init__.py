"""Running a task's episodes: the layer both roles stand on (the explorer samples them for training, the trainer
and the evaluator for ``eval/*``, the warm start teacher-forces them).

- ``episode``: one multi-turn episode loop over an engine (``run_episodes``) and teacher forcing.
- ``agents``: agent tasks, the user's OpenAI-client loop served by the endpoint (``task_episodes`` picks).
- ``endpoint/``: the OpenAI-compatible HTTP endpoint (server, request shapes, Responses API) and its token
  bookkeeping (sessions).
- ``evaluation``: pass@1 (and pass@k, majority) on a task's test split, as a function.
- ``judge``: a model as the judge, whose verdict joins a task's reward where the episodes are scored.
"""
