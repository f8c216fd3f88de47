"""The explorer's OpenAI-compatible HTTP endpoint, through which agent frameworks train (docs/agents.md).

- ``server``: the FastAPI app and its routes (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``),
  one per explorer, sessions opened and closed by the explorer around each agent run.
- ``openai_api``: the Chat Completions request and reply shapes, checked before the engine is called.
- ``responses_api``: the Responses API mapped onto the same sampling.
- ``sessions``: every reply's tokens and log-probs kept per conversation segment, so what is trained is what was
  sent.
"""
