"""The explorer's OpenAI-compatible HTTP endpoint, through which agent frameworks train (docs/tasks.md).

- ``server``: the endpoint's state and the explorer's side, one per explorer: sessions opened and closed around
  each agent run, the queue of requests handed to the engine as one call, the server's life.
- ``routes``: the HTTP side (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``): authorise, admit,
  read, parse off the event loop on the endpoint's executors, reply.
- ``connections``: how many connections the process's files hold, and the uvicorn protocol kept to them.
- ``openai_api``: the Chat Completions request and reply shapes, checked before the engine is called.
- ``responses_api``: the Responses API mapped onto the same sampling.
- ``sessions``: every reply's tokens and log-probs kept per conversation segment, so what is trained is what was
  sent; ``echoes``: what counts as the same message in an agent's next request.
"""
