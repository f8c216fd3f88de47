"""One agent episode's tokens, built from what the agent sends and what the engine samples (token in, token out).

A ``Session`` is the endpoint's record of one agent run. Each request's prompt is matched against the
session's history; the sampled tokens are kept as sampled, never decoded and re-encoded:

- **Chat** (``/v1/chat/completions``): the request extends the history when its messages start with every
  message of the previous request as the agent sent it, then the assistant message the endpoint returned
  (content and tool calls compared, tool-call ids, their order and extra fields ignored; content ``None`` =
  ``""``). An
  echoed reply is compared with what the endpoint *returned* (a tool call as ``tool_calls``, whatever content
  the framework puts beside it), never with the raw sampled text, so tool conversations extend turn after turn;
  the tokens stored for it are the ones sampled. Only the new messages after it (tool results, user turns) are
  tokenized: the chat template's text for them plus the next assistant header (``episodes.observation_ids``,
  the rule the built-in multi-turn tasks use), with loss mask 0. What a framework may change in the history
  without starting a new segment: nothing but tool-call ids and order, ``content: null`` for ``""``, text
  parts for a string and the whitespace around ``<think>`` tags (``oprl.episodes.endpoint.echoes``); anything
  else (a message edited, dropped or inserted) starts one, counted in ``segments``.
- **Completions** (``/v1/completions``): a prompt of token ids extends the history when it starts with the
  history's tokens; a text prompt when it starts with the history's text (prompts and returned completions
  concatenated; a sampled EOS stays in the tokens though the returned text omits it). The rest is tokenized
  alone, loss mask 0.

A request that does not extend the history (the agent rewrote or dropped earlier turns) starts a new
**segment**: a fresh prompt, the earlier segment's tokens set aside. An assistant message with tool calls in a
new segment's prompt is rendered as the text the model wrote for it (the sampled reply's text when this session
returned it, else ``<tool_call>{json}</tool_call>`` blocks), never as an empty turn.

**A reply belongs to its request.** Each accepted request reserves its turn on the segment it was built on
(``reserve``); the reply is recorded on that segment (``record(choices, segment)``), whatever the session did
meanwhile. A segment with a request in flight is never extended: a second request of the session meanwhile (a
concurrent conversation, a retry) starts a segment of its own, and a reply whose segment was set aside is
dropped (counted in ``dropped_tokens``), so a row never joins one request's prompt with another's tokens.

The stored episode is the last segment, the one the agent's return value scores (one row per episode, so groups
keep K rows); ``segments`` and ``dropped_tokens`` count what was set aside. With ``n > 1`` choices, the one the
next request continues is kept and the others are dropped (counted); the last call's first choice ends the
episode. A completion prompt continues the longest choice it starts with (by text, or by token ids), so a choice
that is a prefix of another ("4" and "42") is never taken for it (``_longest``).

Budgets are the built-in episodes': ``max_turns`` sampled turns, ``max_tokens`` tokens after the prompt, a
reply that stops at the length limit without EOS: the episode is truncated and scores 0, whatever the agent
returns. Every refusal that ends a segment (budget, context, size before tokenizing) keeps the reply the agent
was given (``_end_segment``); a reply that arrives after its segment ended is counted in ``dropped_tokens``.
Turns are reserved when a request is accepted (``inflight``), so concurrent requests of one session cannot pass
``max_turns``; a request past the budget truncates the current segment rather than starting an
empty one (a row always holds a response token: ``finish`` adds the documented end-of-turn token, mask 0, to a
segment whose reply never came). A context longer than ``room`` (the model's context less the engine's
``max_new_tokens``) is refused with a 400 naming the limit, and the episode is truncated (nothing longer than
the model's context is ever stored). A closed session (its agent returned, failed or timed out) takes no
replies: a reply sampled for it after it closed is not recorded.

Stop sequences (``stop_at``): a reply is cut before the first match; the tokens kept are the longest prefix of
sampled tokens whose text lies wholly before it, with their behaviour log-probs, and the text returned is
theirs, so the stored tokens are exactly the returned text. A reply cut so ends its turn: when the agent
continues it, the tokenizer's EOS (the chat template's end of turn) follows it as a context token (mask 0). An
echo of the reply with the matched stop sequence appended (smolagents' CodeAgent closes its code block so)
extends the session too: the stop sequence's tokens are then context (mask 0) before the EOS.

Deliberately not here: what counts as the same message (``oprl.episodes.endpoint.echoes``), HTTP
(``oprl.episodes.endpoint.routes``, ``server``), running agents (``oprl.episodes.agents``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oprl.episodes.endpoint.echoes import message_key, same_reply, template_message, text_of
from oprl.episodes.episode import Episode, _truncate, observation_ids
from oprl.models.chat import encode_prompt


class RequestRefused(Exception):
    """A request the session cannot serve: the HTTP status and the message the agent gets."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Choice:
    """One sampled reply waiting to be continued (or to end the episode)."""

    ids: list[int]
    logprobs: list[float]
    text: str
    ended: bool
    """Stopped at EOS (else at the length limit: the episode is truncated)."""
    message: dict = field(default_factory=dict)
    """Chat: the assistant message returned to the agent (``{"role", "content", "tool_calls"?}``)."""
    prompt_tokens: int = 0
    """Tokens of the context it was sampled from (the response's ``usage``)."""
    stop: str = ""
    """The stop sequence the reply was cut at (``stop_at``; "" = none): continuing it adds EOS as context."""
    top_ids: list[list[int]] | None = None
    """Per sampled token, the ids of the most likely tokens of the distribution it was drawn from, most likely
    first (``oprl.rollout.base.top_logprobs``: K = the larger of the run's ``rollout.record_top_k`` and what
    the request asked for); None = the engine call recorded none."""
    top_logprobs: list[list[float]] | None = None
    """Their log-probs under that distribution (temperature, top-k, top-p applied), aligned with ``top_ids``."""


@dataclass
class Session:
    """The tokens of one agent episode (see the module docstring). ``index``: its row in the batch."""

    index: int
    tokenizer: Any
    max_turns: int
    max_tokens: int
    episode: Episode | None = None
    """The current segment."""
    mode: str = ""
    """``chat`` or ``completion``: how the current segment was started."""
    sent: list[dict] = field(default_factory=list)
    """Chat: the history as the template renders it (the model's replies as their sampled text)."""
    keys: list[tuple] = field(default_factory=list)
    """Chat: the history as the agent sent it (``message_key`` of each message), what the next request must repeat."""
    returned: dict[tuple, str] = field(default_factory=dict)
    """Every reply returned in this session, ``message_key`` of its message -> the text sampled: a rewritten history
    that echoes one renders it as the model wrote it."""
    waiting: bool = False
    """The current segment has a request in flight: it cannot be extended until its reply is recorded."""
    tools: list[dict] = field(default_factory=list)
    text: str = ""
    """Completions: the history as text (prompts and returned completions)."""
    choices: list[Choice] = field(default_factory=list)
    """The last call's replies, not yet continued."""
    turns: int = 0
    segments: int = 0
    dropped_tokens: int = 0
    requests: int = 0
    refused: int = 0
    """Requests answered with an error (malformed, refused options, over budget or context)."""
    inflight: int = 0
    """Requests accepted and not yet answered: their turns are reserved."""
    open_requests: int = 0
    """Requests of this session the endpoint is handling (body, parsing, waiting for the engine): at most
    ``ConnectionLimits.per_session``, so one agent cannot hold every connection."""
    closed: bool = False
    """The agent returned, failed or timed out: replies are no longer recorded."""
    overflowed: bool = False
    """A request past the model's context was refused (the episode is truncated)."""
    token_chars: int = 0
    """Most characters one token of the tokenizer spells (0: unknown): text of c characters is at least
    c / token_chars tokens, so a text far past the context is refused before it is tokenized (tokenizing 2 MB
    of text takes ~0.9 GB)."""
    message_tokens: int = 0
    """Fewest tokens the chat template spends on one message, whatever its content (its role marker, its end):
    m messages of c characters are at least m * message_tokens + c / token_chars tokens, so a flood of empty
    messages is refused before it is rendered too."""
    record_top_k: int = 0
    """``rollout.record_top_k`` = K > 0: the stored row carries each token's top K (``Episode.top_k``), the
    sampler's for sampled tokens, none (id 0, ``-inf``) for context tokens; what an agent asks for itself
    (``top_logprobs``) never changes the row."""

    # -- prompts --------------------------------------------------------------------------------------------
    def chat_context(self, messages: list[dict], tools: list[dict], room: int | None = None) -> list[int]:
        """The token context of a chat request (``messages`` as the agent sent them), history extended or a
        new segment started; at most ``room`` tokens (else a 400, the episode truncated)."""
        self._check_open()
        chars = sum(len(text_of(m)) for m in messages) + len(json.dumps(tools))
        self._check_size(chars, len(messages) * self.message_tokens, room)  # the whole request, before any work
        keys = [message_key(m) for m in messages]
        known = len(self.keys)
        chosen = None
        extends = self.mode == "chat" and self._open() and not self.waiting and tools == self.tools
        if extends and len(messages) > known and keys[:known] == self.keys:
            chosen = next((c for c in self.choices if same_reply(c.message, messages[known], c.stop)), None)
        if chosen is None:
            rendered = [template_message(m, self.returned) for m in messages]
            chars = sum(len(m["content"]) for m in rendered) + len(json.dumps(tools))
            self._check_size(chars, 0, room)
            self._check_budget()
            self._new_segment("chat", encode_prompt(self.tokenizer, rendered, tools), room)
            self.sent, self.keys, self.tools = rendered, keys, list(tools)
            return self._context()
        echoed, returned = messages[known].get("content") or "", chosen.message.get("content") or ""
        suffix = chosen.stop if chosen.stop and echoed == returned + chosen.stop else ""
        episode = self._continue(chosen, suffix=suffix)
        history = [*self.sent, {"role": "assistant", "content": chosen.text + suffix}]
        new = [template_message(m, self.returned) for m in messages[known + 1 :]]
        self.keys = keys
        self._check_turns()
        if self._open():
            self._check_size(sum(len(m["content"]) for m in new), len(self._context()), room)
            self._grow(observation_ids(self.tokenizer, history, new, tools), room)
            episode.messages = history + new
        self.sent = history + new
        self._check_tokens()
        return self._context()

    def completion_context(self, prompt: str | list[int], room: int | None = None) -> list[int]:
        """The token context of a completion request (text or token ids), history extended or a new segment;
        at most ``room`` tokens (else a 400, the episode truncated)."""
        self._check_open()
        if isinstance(prompt, list):
            if self._extends("completion") and prompt[: len(self._context())] == self._context():
                after = prompt[len(self._context()) :]
                choice = _longest([c for c in self.choices if after[: len(c.ids)] == c.ids], lambda c: c.ids)
                if choice is not None or not self.choices:
                    new_ids = after[len(choice.ids) :] if choice is not None else after
                    return self._extend_completion(new_ids, None, room, choice)
            self._check_budget()
            self._new_segment("completion", list(prompt), room)
            self.text = self.tokenizer.decode(prompt)
            return self._context()
        if self._extends("completion") and self.choices and prompt.startswith(self.text):
            tail = prompt[len(self.text) :]
            choice = _longest([c for c in self.choices if tail.startswith(c.text)], lambda c: c.text)
            if choice is not None:
                return self._extend_completion(None, tail[len(choice.text) :], room, choice)
        self._check_size(len(prompt), 0, room)
        self._check_budget()
        self._new_segment("completion", self.tokenizer(prompt, add_special_tokens=False).input_ids, room)
        self.text = prompt
        return self._context()

    def _extend_completion(self, ids: list[int] | None, text: str | None, room: int | None, choice=None):
        if choice is not None:
            self._continue(choice)
            self.text += choice.text
        self._check_turns()
        if text is not None:
            if self._open():
                self._check_size(len(text), len(self._context()), room)
            ids = self.tokenizer(text, add_special_tokens=False).input_ids if text else []
            self.text += text
        elif ids:
            self.text += self.tokenizer.decode(ids)
        if self._open() and ids:
            self._grow(list(ids), room)
        self._check_tokens()
        return self._context()

    # -- replies --------------------------------------------------------------------------------------------
    def reserve(self) -> Episode:
        """Accept the request whose context was just built: its turn is reserved (concurrent requests cannot
        pass ``max_turns``) and the current segment waits for its reply. Returns the segment: the reply is
        recorded on it (``record``), whatever the session does meanwhile."""
        assert self.episode is not None
        self.inflight += 1
        self.waiting = True
        return self.episode

    def record(self, choices: list[Choice], segment: Episode | None) -> None:
        """The engine's replies to a request accepted on ``segment`` (``reserve``): kept until the next request
        picks one when ``segment`` is still the current one; dropped (counted) when the session started another
        segment meanwhile, and not recorded once the session is closed (the stored episode is the one its
        agent saw)."""
        self.inflight = max(self.inflight - 1, 0)
        if self.closed:
            return
        self.turns += 1
        for choice in choices:
            self.returned[message_key(choice.message)] = choice.text
        if segment is not self.episode:  # set aside while it was sampled: its tokens belong to no stored row
            self.dropped_tokens += sum(len(c.ids) for c in choices)
            return
        self.waiting = False
        self.choices = choices

    def release(self, segment: Episode | None) -> None:
        """A request accepted on ``segment`` got no reply (the engine refused it): its turn is given back."""
        self.inflight = max(self.inflight - 1, 0)
        if segment is self.episode:
            self.waiting = False

    def finish(self) -> Episode | None:
        """The episode as stored: the last segment with its pending first choice (None: nothing was asked). A
        segment whose reply never came (the engine refused it, the agent left first) gets the end-of-turn token
        as context (mask 0): every stored row has a response token, none of them trained."""
        if self.episode is not None and self.choices:
            self._continue(self.choices[0], end_turn=False)
        if self.episode is not None and not self.episode.response_ids:
            self.episode.add([self.tokenizer.eos_token_id], None)
        return self.episode

    # -- helpers --------------------------------------------------------------------------------------------
    def _new_segment(self, mode: str, prompt_ids: list[int], room: int | None = None) -> None:
        if room is not None and len(prompt_ids) > room:  # never stored: the segment before it ends truncated
            self.overflowed = True
            self._end_segment()
            raise RequestRefused(400, _overflow(len(prompt_ids), room))
        if self.episode is not None:
            self.dropped_tokens += sum(self.episode.loss_mask) + sum(len(c.ids) for c in self.choices)
        self.segments += 1
        self.mode, self.choices, self.waiting = mode, [], False
        self.episode = Episode(prompt_ids=list(prompt_ids), top_k=self.record_top_k)

    def _end_segment(self) -> None:
        """A request refused (budget, context): the current segment ends truncated, with the reply the agent was
        already given (the pending first choice, as the stored episode ends with it: ``finish``) and the others
        counted as dropped; a row never loses a reply the agent saw."""
        if self._open() and self.choices:
            self._continue(self.choices[0], end_turn=False)
        if self._open():
            _truncate(self.episode, self.max_tokens)  # type: ignore[arg-type]

    def _check_budget(self) -> None:
        """Before a new segment: with the turn budget spent, the current segment is kept, with its pending reply,
        and truncated (an empty segment would be a row without a response token)."""
        if self.turns + self.inflight < self.max_turns:
            return
        self._end_segment()
        why = f"turn budget of {self.max_turns} model turns (rollout.max_turns) used up"
        raise RequestRefused(400, f"episode over: {why} (truncated; it scores 0)")

    def _extends(self, mode: str) -> bool:
        """Whether a request of ``mode`` may extend the current segment (same mode, open, no request in flight)."""
        return self.mode == mode and self._open() and not self.waiting

    def _continue(self, chosen: Choice, end_turn: bool = True, suffix: str = "") -> Episode:
        """Add the reply the agent continued; the other choices are dropped. Applies the built-in episode rules:
        a reply cut at the length limit, or one that reaches ``max_tokens``, truncates the episode."""
        episode = self.episode
        assert episode is not None
        self.dropped_tokens += sum(len(c.ids) for c in self.choices if c is not chosen)
        self.choices = []
        if not self._open():  # a reply recorded after its segment ended (truncated meanwhile): counted, not stored
            self.dropped_tokens += len(chosen.ids)
            return episode
        episode.add(chosen.ids, chosen.logprobs, top=_stored_top(chosen, episode.top_k))
        if chosen.stop and end_turn and self.mode == "chat":  # cut at a stop: the template's end of turn follows
            ids = self.tokenizer(suffix, add_special_tokens=False).input_ids if suffix else []
            episode.add([*ids, self.tokenizer.eos_token_id], None)
        episode.turns += 1
        if not chosen.ended or len(episode.response_ids) >= self.max_tokens:
            _truncate(episode, self.max_tokens)
        return episode

    def _check_turns(self) -> None:
        """Before an environment turn is added (the built-in order: a turn budget spent ends the episode
        without the observation)."""
        if self._open() and self.turns + self.inflight >= self.max_turns:
            self._truncate(f"turn budget of {self.max_turns} model turns (rollout.max_turns) used up")
        if not self._open():
            raise RequestRefused(400, "episode over: it ran out of turns or tokens (truncated; it scores 0)")

    def bound(self, tokens: int, room: int) -> None:
        """A request of at least ``tokens`` tokens, before it is parsed whole: refused as a context past ``room``
        is (the 400 naming the limit; the current segment ends truncated, with its pending reply)."""
        if tokens > room:
            self.overflowed = True
            self._end_segment()
            raise RequestRefused(400, _overflow(tokens, room, at_least=True))

    def _check_size(self, chars: int, tokens: int, room: int | None) -> None:
        """Refuse, before tokenizing, ``chars`` characters of text after ``tokens`` tokens that cannot fit."""
        if room is None or not self.token_chars or tokens + chars // self.token_chars <= room:
            return
        self.overflowed = True
        self._end_segment()
        raise RequestRefused(400, _overflow(tokens + chars // self.token_chars, room, at_least=True))

    def _grow(self, ids: list[int], room: int | None) -> None:
        """Add context tokens (mask 0), or truncate the episode without them when they pass ``room``."""
        assert self.episode is not None
        total = len(self.episode.prompt_ids) + len(self.episode.response_ids) + len(ids)
        if room is not None and total > room:
            self.overflowed = True
            self._truncate_because(_overflow(total, room))
        self.episode.add(ids, None)

    def _check_tokens(self) -> None:
        episode = self.episode
        assert episode is not None
        if self._open() and len(episode.response_ids) >= self.max_tokens:
            self._truncate(f"token budget of {self.max_tokens} tokens (rollout.max_episode_tokens) used up")

    def _truncate(self, why: str) -> None:
        self._truncate_because(f"episode over: {why} (truncated; it scores 0)")

    def _truncate_because(self, message: str) -> None:
        assert self.episode is not None
        self._end_segment()
        raise RequestRefused(400, message)

    def _check_open(self) -> None:
        self.requests += 1
        if self.episode is not None and not self._open():
            raise RequestRefused(400, "episode over: it ran out of turns or tokens (truncated; it scores 0)")

    def _open(self) -> bool:
        return self.episode is not None and not self.episode.truncated

    def _context(self) -> list[int]:
        assert self.episode is not None
        return self.episode.prompt_ids + self.episode.response_ids


def _longest(matches: list[Choice], key: Callable[[Choice], Any]) -> Choice | None:
    """The choice a completion prompt continues, among those it starts with (``matches``): the longest, by
    ``key`` (its text or ids). One choice that is a prefix of another ("4" and "42") matches a prompt that
    continues the other too; the longer one is what the prompt holds whole. A 400 when two choices of that
    length differ (same text, other tokens: which was sampled cannot be told)."""
    if not matches:
        return None
    longest = max(len(key(c)) for c in matches)
    tied = [c for c in matches if len(key(c)) == longest]
    if any(c.ids != tied[0].ids for c in tied[1:]):
        raise RequestRefused(
            400,
            f"the prompt continues {len(tied)} of the n choices alike (the same text, other tokens); send token ids",
        )
    return tied[0]


def _stored_top(choice: Choice, k: int) -> tuple[list[list[int]], list[list[float]]] | None:
    """The first ``k`` of a reply's recorded top log-probs (the row's ``rollout.record_top_k``), whatever more the
    request asked the engine for; None when the row records none (k = 0)."""
    if not k:
        return None
    if choice.top_ids is None or choice.top_logprobs is None:
        raise ValueError(f"rollout.record_top_k={k}: the engine returned no top log-probs for a reply")
    return [row[:k] for row in choice.top_ids], [row[:k] for row in choice.top_logprobs]


def _overflow(tokens: int, room: int, at_least: bool = False) -> str:
    return (
        f"the context is {'at least ' if at_least else ''}{tokens} tokens, past the {room} the model takes (its "
        "context less rollout.max_new_tokens for the reply): the episode is over (truncated; it scores 0)"
    )


def stop_at(ids: list[int], tokenizer, stops: list[str]) -> tuple[int, str, str] | None:
    """Where a reply is cut by its first stop sequence (module docstring): ``(k, text, stop)``, the first ``k``
    sampled tokens kept, their text (the longest token prefix whose text lies wholly before the match) and the
    stop sequence matched; None when none occurs. Binary search over prefixes: O(log T) decodes."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    hits = sorted((text.find(s), -len(s), s) for s in stops if s in text)
    if not hits:
        return None
    before, stop = text[: hits[0][0]], hits[0][2]
    low, high = 0, len(ids)  # invariant: the first `low` tokens' text is a prefix of `before`
    while low < high:
        middle = (low + high + 1) // 2
        if before.startswith(tokenizer.decode(ids[:middle], skip_special_tokens=True)):
            low = middle
        else:
            high = middle - 1
    return low, tokenizer.decode(ids[:low], skip_special_tokens=True), stop
