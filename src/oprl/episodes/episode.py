"""Multi-turn episodes: the model talks with an environment (tools, simulated APIs) until it is done.

One episode is stored like a single-turn response, so every schedule, buffer and loss handles it unchanged:
``prompt_ids`` (the first messages through the chat template) and ``response_ids``, the rest of the
conversation: model turns and environment turns in order. ``loss_mask`` marks each response token 1 when the
model sampled it and 0 when the environment wrote it; behaviour log-probs are the sampler's for model tokens
and 0 elsewhere. The trainer multiplies its token mask by ``loss_mask``, so tool outputs and user turns are
context, never trained on (docs/tasks.md). With ``rollout.record_top_k`` = K > 0 (an engine that records its
top-K: ``engine.record_top_k``) every model token also carries the sampler's K most likely tokens of the
distribution it was drawn from, and every environment token K entries of id 0 at ``-inf`` (no mass: the
trainer's padding), so a method that reads them (score centering, DPPO's Top-K divergence) trains on episodes
as on single-turn rows.

Environment turns are rendered by the chat template: the text the template adds to the conversation for the
observation messages (plus the next assistant header), tokenized on its own. A model turn ends at EOS (kept:
it is the model's end-of-turn); one that hits ``max_new_tokens`` without EOS, ``max_turns`` model turns, or
``max_tokens`` response tokens ends the episode as truncated, with reward 0 (flag ``truncated``).

Seeding: turn t of the batch samples with ``seed + t`` over the rows still running, so an episode batch is a
function of (seed, problems, weights), like a single-turn batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from oprl.models.chat import encode_problem, render
from oprl.tasks.base import Reward

if TYPE_CHECKING:
    from oprl.models.truncation import Sampling
    from oprl.rollout.base import Switch


@dataclass
class Episode:
    """One finished episode: the conversation as tokens, who wrote each token, and the outcome."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    """1 = sampled by the model (trained on), 0 = written by the environment (context only)."""
    behavior_logprobs: list[float] = field(default_factory=list)
    """Sampler log-probs for model tokens; 0.0 at environment tokens."""
    messages: list[dict] = field(default_factory=list)
    """The conversation so far, as messages (for rendering the next environment turn)."""
    reward: Reward | None = None
    truncated: bool = False
    turns: int = 0
    """Model turns taken."""
    info: dict[str, Any] = field(default_factory=dict)
    """Per-episode counts stored with the experience and averaged into ``episode/*`` (agent episodes:
    segments, dropped_tokens, refused_requests, agent_failed; ``oprl.episodes.agents``), and an agent's
    ``agent_notes``: the non-numeric entries of its returned dict, stored, never averaged."""
    lost: bool = False
    """Lost to the infrastructure (agent episodes: a connection error, a timeout or a 5xx reply): its reward
    measures no policy, so the explorer leaves it out of its group (counted in ``episode/lost``)."""
    behavior_versions: list[int] = field(default_factory=list)
    """Partial rollouts: the policy version of each response token (environment tokens: the last model token's);
    empty when the sampler reported none (one policy)."""
    top_k: int = 0
    """``rollout.record_top_k`` = K > 0 (built-in multi-turn tasks and agent episodes): every response token
    carries the sampler's top K in ``top_k_ids`` / ``top_k_logprobs`` (``oprl.rollout.base.top_logprobs``);
    environment tokens id 0 and ``-inf``, the trainer's padding (no mass). 0: none kept."""
    top_k_ids: list[list[int]] = field(default_factory=list)
    top_k_logprobs: list[list[float]] = field(default_factory=list)

    @property
    def outcome(self) -> Reward:
        """The reward of a finished episode (``run_episodes`` returns only finished ones)."""
        if self.reward is None:
            raise ValueError("episode not finished: it has no reward yet")
        return self.reward

    def add(
        self,
        tokens: list[int],
        logprobs: list[float] | None,
        versions: list[int] | None = None,
        top: tuple[list[list[int]], list[list[float]]] | None = None,
    ) -> None:
        """Append tokens, from the model (with their log-probs and, under partial rollouts, versions; with
        ``top_k``, their sampler's ``top`` (ids, log-probs), K per token) or from the environment
        (``logprobs=None``). A model turn of an episode that keeps the top-K must bring them (a ``ValueError``
        otherwise: the environment's padding would pass for the sampler's distribution)."""
        if self.top_k and logprobs is not None and top is None:
            raise ValueError(f"rollout.record_top_k={self.top_k}: the engine returned no top log-probs for a turn")
        if self.top_k:
            ids, values = (
                top if top is not None else ([[0] * self.top_k] * len(tokens), [[-math.inf] * self.top_k] * len(tokens))
            )
            if len(ids) != len(tokens) or len(values) != len(tokens):  # else every later token's top-K is shifted
                raise ValueError(
                    f"rollout.record_top_k={self.top_k}: the engine returned top log-probs for {len(ids)} / "
                    f"{len(values)} of a turn's {len(tokens)} tokens"
                )
            self.top_k_ids += [list(row) for row in ids]
            self.top_k_logprobs += [list(row) for row in values]
        if versions is not None:
            self.behavior_versions += versions
        elif self.behavior_versions:
            self.behavior_versions += [self.behavior_versions[-1]] * len(tokens)
        self.response_ids += tokens
        self.loss_mask += [1 if logprobs is not None else 0] * len(tokens)
        self.behavior_logprobs += logprobs if logprobs is not None else [0.0] * len(tokens)


def observation_ids(tokenizer, messages: list[dict], observation, tools=()) -> list[int]:
    """Tokens the chat template puts after the model's last turn (``messages[-1]``, which ended at EOS): the
    rest of that turn's template glue (ChatML's newline after ``<|im_end|>``), ``observation``, and the next
    assistant header.

    Read off the rendering of the whole conversation, after the text the model produced (its reply and EOS);
    when the template renders the reply differently, the difference of the renderings with and without the
    observation; when the template re-renders earlier turns differently, the observation rendered alone.
    """
    after = render(tokenizer, [*messages, *observation], tools, generation_prompt=True)
    produced = render(tokenizer, messages[:-1], tools) + messages[-1]["content"] + (tokenizer.eos_token or "")
    before = render(tokenizer, messages, tools, generation_prompt=False)
    if after.startswith(produced):
        text = after[len(produced) :]
    elif after.startswith(before):
        text = after[len(before) :]
    else:
        text = render(tokenizer, list(observation), ())
    return tokenizer(text, add_special_tokens=False).input_ids


def start(tokenizer, environment, problem, top_k: int = 0) -> Episode:
    """A new episode of ``problem``: the environment's first messages rendered as the prompt; ``top_k`` K > 0: its
    tokens keep the sampler's top K (``Episode.top_k``)."""
    messages = list(environment.reset(problem))
    prompt_ids = encode_problem(tokenizer, replace(problem, messages=tuple(messages)))
    return Episode(prompt_ids=prompt_ids, messages=messages, top_k=top_k)


def advance(
    tokenizer,
    episode: Episode,
    environment,
    reply_ids: list[int],
    logprobs: list[float] | None,
    reply_text: str,
    *,
    ended: bool,
    tools=(),
    max_tokens: int,
    max_turns: int,
    versions: list[int] | None = None,
    top: tuple[list[list[int]], list[list[float]]] | None = None,
) -> bool:
    """Add one model turn and the environment's answer to ``episode``; returns whether the episode goes on.

    ``ended``: the turn stopped at EOS (else it hit the per-turn token limit: truncated). ``top``: the turn's
    sampler top-K (ids, log-probs), K per reply token, where the episode keeps them (``Episode.top_k``).
    """
    episode.add(reply_ids, logprobs, versions, top=top)
    episode.turns += 1
    episode.messages.append({"role": "assistant", "content": reply_text})
    if not ended or len(episode.response_ids) >= max_tokens:
        return _truncate(episode, max_tokens)
    step = environment.step(reply_text)
    if step.done:
        episode.reward = step.reward
        return False
    if episode.turns >= max_turns:
        return _truncate(episode, max_tokens)
    episode.add(observation_ids(tokenizer, episode.messages, step.observation, tools), None)
    episode.messages += list(step.observation)
    if len(episode.response_ids) >= max_tokens:
        return _truncate(episode, max_tokens)
    return True


def _truncate(episode: Episode, max_tokens: int) -> bool:
    """Cut the episode to ``max_tokens`` response tokens; it scores 0 (components are the task's, absent = 0)."""
    del episode.response_ids[max_tokens:], episode.loss_mask[max_tokens:], episode.behavior_logprobs[max_tokens:]
    del episode.behavior_versions[max_tokens:], episode.top_k_ids[max_tokens:], episode.top_k_logprobs[max_tokens:]
    episode.truncated, episode.reward = True, Reward(total=0.0, components={})
    return False


@dataclass(frozen=True)
class EpisodeSettings:
    """The keyword arguments of ``run_episodes``, handed on whole to the agent loop (``oprl.episodes.agents``)."""

    seed: int
    max_turns: int
    max_tokens: int
    sampling: Sampling | None = None
    """The distribution of every turn; None = the engine's own (training), evaluation's ``eval.*`` otherwise."""
    episode_timeout: float = 300.0
    switch: Switch | None = None


def run_episodes(
    engine,
    tokenizer,
    task,
    problems,
    *,
    seed: int,
    max_turns: int,
    max_tokens: int,
    sampling: Sampling | None = None,
    episode_timeout: float = 300.0,
    switch: Switch | None = None,
) -> list[Episode]:
    """One episode per entry of ``problems`` (repeat a problem K times for a group), all turns batched.

    Each turn samples the rows still running with ``engine.generate`` on their whole context (prompt and
    response so far) and hands each reply to its environment. An agent task (``task.name=agent``) has no
    environment: ``oprl.episodes.agents.task_episodes`` runs it through its agents instead (``episode_timeout``
    is for them).
    ``switch`` (partial rollouts) goes to every turn's call: its decode steps add up over the turns, so a
    switch falls inside a turn or between two.
    An engine that records its top-K (``engine.record_top_k`` = K > 0, the explorers' ``rollout.record_top_k``)
    gives every model turn its K alternatives per token and the episodes keep them (``Episode.top_k``).
    """
    partial = {} if switch is None else {"switch": switch}
    top_k = int(getattr(engine, "record_top_k", 0) or 0)
    environments = [task.environment(p) for p in problems]
    episodes = [start(tokenizer, env, p, top_k) for env, p in zip(environments, problems, strict=True)]
    running = list(range(len(problems)))
    for turn in range(max_turns):
        if not running:
            break
        contexts = [episodes[i].prompt_ids + episodes[i].response_ids for i in running]
        rollout = engine.generate(contexts, seed=seed + turn, sampling=sampling, **partial)
        versions = rollout.behavior_versions or [None] * len(running)
        tops = (
            list(zip(rollout.top_k_ids, rollout.top_k_logprobs, strict=True))
            if top_k and rollout.top_k_ids is not None and rollout.top_k_logprobs is not None
            else [None] * len(running)
        )
        still = []
        for row, i in enumerate(running):
            if advance(
                tokenizer,
                episodes[i],
                environments[i],
                rollout.response_ids[row],
                rollout.behavior_logprobs[row],
                rollout.texts[row],
                ended=not rollout.truncated[row],
                tools=problems[i].tools,
                max_tokens=max_tokens,
                max_turns=max_turns,
                versions=versions[row],
                top=tops[row],
            ):
                still.append(i)
        running = still
    for i in running:  # cannot happen (advance stops at max_turns); kept as a guard for custom environments
        _truncate(episodes[i], max_tokens)
    return episodes


def teacher_forced(tokenizer, task, problem, replies: list[str]) -> Episode:
    """The episode of ``problem`` in which the model says ``replies`` (a demonstration), each followed by EOS;
    for supervised warm starts on whole episodes. Log-probs are placeholders (0.0): only the mask matters."""
    environment = task.environment(problem)
    episode = start(tokenizer, environment, problem)
    for reply in replies:
        ids = [*tokenizer(reply, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
        if not advance(
            tokenizer,
            episode,
            environment,
            ids,
            [0.0] * len(ids),
            reply,
            ended=True,
            tools=problem.tools,
            max_tokens=1 << 30,
            max_turns=len(replies),
        ):
            break
    return episode
