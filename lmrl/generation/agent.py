"""Multi-turn rollouts: a Hugging Face policy talks to environments, and each whole conversation
becomes one token sequence the learner trains on.

    ro = run_episodes(policy, envs, seeds=[0, 1, 2], max_turns=5, max_new_tokens=96, step_timeout_s=30)
    ro.rewards          # (B,) each episode's return (the environment's rewards summed)
    ro.mask             # (B, N) 1 on the agent's own tokens only
    ro.failed           # (B,) the environment broke (raised, hung, broke the protocol): see infos[i]["env_error"]

Environments follow `lmrl.envs.protocol` (Gymnasium's reset / step); they are reset here with
`reset(seed=...)` (or handed in already reset, with their opening conversations) and stepped
concurrently, each environment's calls on one thread of its own (`Stepper`).

Layout. Row i of the result is `prompt_i | turn_1 | obs_1 | turn_2 | obs_2 | ... | turn_k`:
`prompts` holds the chat-templated first messages (left-padded, `prompt_mask`), and `completions`
everything after, right-padded. Agent tokens carry `mask` 1 and the log-probs recorded when they
were sampled; environment tokens (the observation as a chat turn, plus the template's turn markers)
carry mask 0, so they are context for the learner but never loss. The token ids are the source of
truth: the learner scores exactly the ids the agent was sampled in, never a re-tokenisation of the
transcript text, so sampling and learning see the same context.

Observation turns are rendered with the tokenizer's chat template: the text the template writes
after the assistant's message (its end-of-turn marker, the user turn, the next generation prompt),
minus the end-of-turn token when the agent already emitted it (see `observation_ids`).

Each turn re-encodes every running conversation from the start (no KV cache is kept between
turns): simple, and on the short episodes this is used for, prefill is a small part of the cost.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from ..common.chat import render_chat
from ..envs.protocol import FLOAT32_MAX, EnvError, as_info, as_reset, as_reward, as_step, env_name
from .rollout import Rollout
from .sampling import Sampling

log = logging.getLogger("lmrl")


@dataclass
class AgentRollout(Rollout):
    """A `Rollout` of whole conversations, with each episode's return and record."""

    rewards: torch.Tensor = None  # (B,) sum of the environment's rewards
    infos: list[dict] = field(default_factory=list)  # the environment's last info, plus "turns" (and "env_error")
    transcripts: list[list[dict]] = field(default_factory=list)  # chat messages, for logs and samples
    failed: torch.Tensor = None  # (B,) bool: the environment broke (raised, hung, returned bad values)
    environments: list | None = None  # objects reward functions get as `environments=` (a tool task's, as TRL)
    openings: list[int] = field(default_factory=list)  # messages of each transcript's opening (preamble + first obs)
    final_rewards: list = field(default_factory=list)  # each episode's get_reward() (`final_reward`), or None

    def split_transcripts(self) -> tuple[list[list[dict]], list[list[dict]]]:
        """(each episode's opening messages, the messages after them: turns and observations)."""
        return ([t[:k] for t, k in zip(self.transcripts, self.openings)],
                [t[k:] for t, k in zip(self.transcripts, self.openings)])


def observation_ids(tokenizer, observation: str | list[dict], *, after_eos: bool, role: str = "user",
                    tools: list[dict] | None = None) -> list[int]:
    """Token ids that put `observation` into the conversation after an assistant turn: the chat
    template's text between an assistant message's content and the next assistant message's
    content (end of turn, the observation as a `role` turn, or as the messages it is, e.g. tool
    results; then the generation prompt). With `after_eos` the agent's sampled turn already ended
    with the tokenizer's EOS (e.g. `<|im_end|>`), so that marker is not written twice."""
    marker = "\x00LMRL_TURN\x00"
    head = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
    messages = [{"role": role, "content": observation}] if isinstance(observation, str) else list(observation)
    text = render_chat(tokenizer, head + messages, add_generation_prompt=True, tools=tools)
    cut = text.find(marker)
    if cut < 0:
        raise ValueError("the chat template does not write the assistant's message content back as it is; "
                         "multi-turn rollouts need a template that does")
    delta = text[cut + len(marker):]
    eos = tokenizer.eos_token
    if after_eos and eos and delta.startswith(eos):
        delta = delta[len(eos):]
    return tokenizer(delta, add_special_tokens=False)["input_ids"]


class Stepper:
    """Calls environments' methods, each environment's calls on one thread of its own, kept from its
    first call (or from its making, `make`) until `close`: an environment that opens a thread-bound
    resource (a sqlite3 connection, a thread-local client) in `__init__` or `reset` finds it in every
    later call, as when one thread drives it (Gymnasium's, TRL's and verl's assumption). Up to
    `workers` calls run at once, each under `timeout_s`, and whatever goes wrong is turned into one
    line (`EnvError`). A call that overruns is abandoned: its thread may go on (a daemon, so it never
    holds up exit); the environment's later calls queue behind it there (so a `close` runs if it ever
    returns) and are answered with an EnvError at once. With `timeout_s` None every call runs in the
    caller's thread, one after another, unbounded (as TRL runs tools)."""

    def __init__(self, workers: int = 8, timeout_s: float | None = None):
        self.workers, self.timeout_s = max(1, workers), timeout_s
        self._threads: dict[int, tuple[object, _EnvThread]] = {}  # id(env) -> (env, the thread it runs on)
        self._all: list[_EnvThread] = []

    def __enter__(self) -> Stepper:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def make(self, factories: list, name: str) -> list:
        """One environment from each zero-argument factory, each made on the thread that will run all its
        calls; an EnvError naming `name` in place of one whose factory raised or hung."""
        threads = [self._new_thread() for _ in factories]
        made = self._run([(thread, name, "its factory", factory)
                          for thread, factory in zip(threads, factories)])
        for env, thread in zip(made, threads):
            if not isinstance(env, EnvError) and thread is not None:
                self._threads[id(env)] = (env, thread)
        return made

    def map(self, calls: list) -> list:
        """`calls` are (env, method name, args) or (env, method name, args, kwargs); returns each call's
        value, or the EnvError it raised."""
        jobs = []
        for env, method, args, *kwargs in calls:
            fn = functools.partial(_call, env, method, args, kwargs[0] if kwargs else {})
            jobs.append((self._thread_of(env), env_name(env), f"{method}()", fn))
        return self._run(jobs)

    def close(self) -> None:
        """Ends the environments' threads once their queued calls are done."""
        for thread in self._all:
            thread.jobs.put(None)
        self._all.clear()
        self._threads.clear()

    def _new_thread(self) -> _EnvThread | None:
        if self.timeout_s is None:
            return None
        thread = _EnvThread()
        self._all.append(thread)
        return thread

    def _thread_of(self, env) -> _EnvThread | None:
        known = self._threads.get(id(env))
        if known is None or known[0] is not env:
            self._threads[id(env)] = known = (env, self._new_thread())
        return known[1]

    def _run(self, jobs: list) -> list:
        out = []
        for start in range(0, len(jobs), self.workers):
            out += self._run_some(jobs[start:start + self.workers])
        return out

    def _run_some(self, jobs: list) -> list:
        if self.timeout_s is None:
            return [_outcome(fn, who, what, catch=(Exception, SystemExit)) for _, who, what, fn in jobs]
        boxes = [thread.submit(lambda fn=fn, who=who, what=what: _outcome(fn, who, what))
                 for thread, who, what, fn in jobs]
        deadline = time.monotonic() + self.timeout_s
        results = []
        for (thread, who, what, _), (done, box, stuck_behind) in zip(jobs, boxes):
            if stuck_behind is not None:
                results.append(EnvError(f"environment {who}: {what} not run: its {stuck_behind} has not returned "
                                        f"(past env.step_timeout_s)"))
            elif done.wait(max(0.0, deadline - time.monotonic())):
                results.append(box[0])
            else:
                thread.stuck = what if not done.is_set() else None
                results.append(EnvError(f"environment {who}: {what} did not return within {self.timeout_s:g} s "
                                        f"(env.step_timeout_s)"))
        return results


class _EnvThread:
    """A daemon thread running the calls queued on it, one at a time, in order."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.stuck: str | None = None  # the call that overran its time, while it has not returned
        threading.Thread(target=self._serve, daemon=True, name="lmrl-env").start()

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()

    def submit(self, fn) -> tuple[threading.Event, list, str | None]:
        """(set when `fn` has run, [its value], the overrunning call it waits behind or None)."""
        done, box, behind = threading.Event(), [], self.stuck

        def job():
            box.append(fn())
            done.set()
            if self.stuck is not None and behind is None:  # the overrunning call itself has returned
                self.stuck = None

        self.jobs.put(job)
        return done, box, behind


def _call(env, method: str, args: tuple, kwargs: dict):
    return getattr(env, method)(*args, **kwargs)


def _outcome(fn, who: str, what: str, catch=BaseException):
    """`fn()`, or the EnvError (one line naming `who` and `what`) for what it raised (in the caller's
    thread, `catch` leaves KeyboardInterrupt to stop the run)."""
    try:
        return fn()
    except EnvError as e:  # already one line that names the environment
        return e
    except catch as e:  # noqa: BLE001  (an environment's failure is reported, never raised)
        return EnvError(f"environment {who}: {what} raised {type(e).__name__}: {_one_line(e)}")


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def opening_messages(observation, preamble: list[dict]) -> list[dict]:
    """The chat an episode opens with: `preamble` (e.g. a system prompt), then the first observation
    as a user turn, or the messages it is."""
    return list(preamble) + ([{"role": "user", "content": observation}] if isinstance(observation, str)
                             else list(observation))


@torch.no_grad()
def run_episodes(policy, envs: list, first_messages: list[list[dict]] | None = None, *, max_turns: int,
                 max_new_tokens: int, max_context: int = 4096, sampling: Sampling | None = None,
                 greedy: bool = False, generator: torch.Generator | None = None,
                 seeds: list[int] | None = None, preamble: list[dict] = (), tools: list[dict] | None = None,
                 step_timeout_s: float | None = None, workers: int = 8, stepper: Stepper | None = None,
                 final_reward: bool = False, **options) -> AgentRollout:
    """Runs one episode per environment until each is done, `max_turns` agent turns have been taken,
    or the conversation would outgrow `max_context` tokens (then `env.truncate()` when it has one).
    Either the environments are already reset and `first_messages[i]` is the chat that opens
    episode i, or `seeds` are given: each environment is reset here with `reset(seed=seeds[i])` and
    the episode opens with `preamble` and the first observation. An opening that leaves no room for
    one turn of `max_new_tokens` within `max_context` fails its episode. `tools` (JSON schemas) are
    offered to the model through the chat template. Turns of all running episodes are sampled as
    one batch, as `sampling` (or its fields as keywords, as `HFPolicy.generate_ids` takes them) says
    (a repetition penalty counts each turn's whole context: the conversation so far); their environments step concurrently (`workers` threads), each step within
    `step_timeout_s`, each environment's calls on one thread of its own (`Stepper`: `stepper`, the
    one that made them, or one made here). With `final_reward`, each environment's `get_reward()` is
    read as its episode ends, before `close()`: `final_rewards[i]` (TRL's environment_factory reward).

    An environment that raises, hangs or returns what the protocol does not allow (see
    `lmrl.envs.protocol`; a `get_reward()` read here must return a number) ends its episode:
    `failed[i]`, `infos[i]["env_error"]` (one line naming it, also logged), no loss on its tokens.
    `envs[i]` may be the EnvError of an environment that could not be made (`Stepper.make`): its
    episode fails before it starts. Returns an `AgentRollout`."""
    if not envs or (first_messages is None) == (seeds is None) or len(first_messages or seeds) != len(envs):
        raise ValueError(f"need {len(envs)} environments with one opening conversation or one seed each")
    own = stepper is None
    stepper = Stepper(workers, step_timeout_s) if own else stepper
    try:
        return _play(policy, envs, first_messages, stepper, max_turns=max_turns, max_new_tokens=max_new_tokens,
                     max_context=max_context, sampling=dict(sampling=Sampling.of(sampling, **options),
                                                            greedy=greedy, generator=generator),
                     seeds=seeds, preamble=preamble, tools=tools, final_reward=final_reward)
    finally:
        if own:
            stepper.close()


def _play(policy, envs, first_messages, stepper, *, max_turns, max_new_tokens, max_context, sampling, seeds,
          preamble, tools, final_reward) -> AgentRollout:
    tok = policy.tokenizer
    eos_ids = set(policy.eos_token_ids)
    n = len(envs)
    returns, infos, turns = [0.0] * n, [dict() for _ in range(n)], [0] * n
    cut_short = [False] * n  # ended by the turn or context limit (the environment's own or the rollout's)
    failed = [False] * n
    finals: list[float | None] = [None] * n
    for i, env in enumerate(envs):
        if isinstance(env, EnvError):  # never made: the episode fails before it starts
            _fail(i, env, failed, infos)
    if seeds is not None:
        first_messages = [opening_messages("", preamble) for _ in range(n)]  # kept where an episode never starts
        started = [i for i in range(n) if not failed[i]]
        for i, result in zip(started, stepper.map([(envs[i], "reset", (), {"seed": seeds[i]}) for i in started])):
            try:
                if isinstance(result, EnvError):
                    raise result
                first_messages[i] = opening_messages(as_reset(result, env_name(envs[i]))[0], preamble)
            except EnvError as e:
                _fail(i, e, failed, infos)
    first_messages, prompt_ids, prompt_mask = _openings(policy, envs, first_messages, failed, infos, preamble=preamble,
                                                        tools=tools, max_context=max_context,
                                                        max_new_tokens=max_new_tokens)
    prompts = [row[m.bool()].tolist() for row, m in zip(prompt_ids.cpu(), prompt_mask.cpu())]
    body: list[list[int]] = [[] for _ in range(n)]  # everything after the prompt
    mask: list[list[float]] = [[] for _ in range(n)]
    logps: list[list[float]] = [[] for _ in range(n)]
    transcripts = [list(m) for m in first_messages]
    running = [i for i in range(n) if not failed[i]]
    # Under FSDP the policy is gathered once for all turns: ranks take different numbers of turns, and
    # a gather per turn would leave one rank waiting for another's.
    with policy.gathered() if hasattr(policy, "gathered") else contextlib.nullcontext():
        while running:
            ids, attn = left_pad([prompts[i] + body[i] for i in running], tok.pad_token_id, prompt_ids.device)
            completion, keep, logprobs = policy.generate_ids(ids, attn, max_new_tokens, **sampling)
            actions, ended = [], []
            for row, i in enumerate(running):
                k = keep[row].bool()
                agent = completion[row][k].tolist()
                body[i] += agent
                mask[i] += [1.0] * len(agent)
                logps[i] += logprobs[row][k].tolist()
                ended.append(bool(agent) and agent[-1] in eos_ids)
                actions.append(tok.decode(agent, skip_special_tokens=True))
                transcripts[i].append({"role": "assistant", "content": actions[-1]})
                turns[i] += 1
            results = stepper.map([(envs[i], "step", (a,)) for i, a in zip(running, actions)])
            still = []
            for i, result, after_eos in zip(running, results, ended):
                try:
                    if isinstance(result, EnvError):
                        raise result
                    observation, reward, terminated, truncated, info = as_step(result, env_name(envs[i]))
                    returns[i] = _added(returns[i], reward, envs[i])
                except EnvError as e:
                    _fail(i, e, failed, infos)
                    continue
                infos[i] = dict(info)
                if terminated or truncated:
                    cut_short[i] = truncated and not terminated
                    continue
                obs = _observation_tokens(tok, observation, after_eos, tools, max_context)
                room = obs is not None and len(prompts[i]) + len(body[i]) + len(obs) + max_new_tokens <= max_context
                if turns[i] >= max_turns or not room:
                    cut_short[i] = True
                    if hasattr(envs[i], "truncate"):  # the first protocol's: the environment scores the cut
                        try:
                            reward, info = _truncated(envs[i], stepper.map([(envs[i], "truncate", ())])[0])
                            returns[i] = _added(returns[i], reward, envs[i])
                        except EnvError as e:
                            _fail(i, e, failed, infos)
                            continue
                        infos[i] = info
                    continue
                transcripts[i] += opening_messages(observation, [])
                body[i] += obs
                mask[i] += [0.0] * len(obs)
                logps[i] += [0.0] * len(obs)
                still.append(i)
            running = still
    if final_reward:
        readers = [i for i in range(n) if not failed[i]]
        for i, result in zip(readers, stepper.map([(envs[i], "get_reward", ()) for i in readers])):
            try:
                finals[i] = _final_reward(envs[i], result)
            except EnvError as e:
                _fail(i, e, failed, infos)
    made = [env for env in envs if not isinstance(env, EnvError)]
    closing = [(env, "close", ()) for env in made if callable(getattr(env, "close", None))]
    for result in stepper.map(closing):
        if isinstance(result, EnvError):
            log.warning(str(result))
    for i, info in enumerate(infos):
        info["turns"] = turns[i]
    for i in range(n):
        if failed[i]:
            mask[i] = [0.0] * len(mask[i])  # the environment's fault, not the policy's: nothing to learn from
    device = prompt_ids.device
    completions, _ = _right_pad(body, tok.pad_token_id, device)
    return AgentRollout(prompt_ids, completions, _right_pad(logps, 0.0, device, torch.float32)[0],
                        _right_pad(mask, 0.0, device, torch.float32)[0], prompt_mask=prompt_mask,
                        truncated=torch.tensor(cut_short, device=device), rewards=torch.tensor(returns, dtype=torch.float32),
                        infos=infos, transcripts=transcripts, failed=torch.tensor(failed),
                        openings=[len(m) for m in first_messages], final_rewards=finals)


def _openings(policy, envs, first_messages, failed, infos, *, preamble, tools, max_context: int,
              max_new_tokens: int) -> tuple[list[list[dict]], torch.Tensor, torch.Tensor]:
    """(each episode's opening messages, their chat-templated ids (B, P) left-padded, prompt mask (B, P)).
    An opening that leaves no room for one turn within `max_context` fails its episode, and every failed
    episode opens with `preamble` alone, so a huge opening never sizes the batch (text over 64
    characters per context token is not even tokenized, as for observations)."""
    tok = policy.tokenizer
    for i, messages in enumerate(first_messages):
        chars = _chars(messages)
        if not failed[i] and chars > 64 * max_context:
            _fail(i, EnvError(f"environment {env_name(envs[i])}: its opening is {chars} characters, more than "
                              f"env.max_context={max_context} tokens hold"), failed, infos)
    while True:
        openings = [opening_messages("", preamble) if failed[i] else list(m) for i, m in enumerate(first_messages)]
        prompt_ids, prompt_mask = policy.encode([render_chat(tok, m, add_generation_prompt=True, tools=tools)
                                                 for m in openings])
        lengths = prompt_mask.sum(1).tolist()
        over = [i for i, length in enumerate(lengths) if not failed[i] and length + max_new_tokens > max_context]
        if not over:
            return openings, prompt_ids, prompt_mask
        for i in over:
            _fail(i, EnvError(f"environment {env_name(envs[i])}: its opening is {lengths[i]} tokens, which with a "
                              f"turn of {max_new_tokens} does not fit env.max_context={max_context}"), failed, infos)


def _added(total: float, reward: float, env) -> float:
    """`total + reward`, or an EnvError when the return leaves float32's range (rewards train in float32)."""
    total += reward
    if abs(total) > FLOAT32_MAX:
        raise EnvError(f"environment {env_name(env)}: its rewards add up to {total:.3g}, beyond float32's range "
                       f"(±3.4e38), in which rewards train")
    return total


def _final_reward(env, result) -> float:
    """The number `env.get_reward()` returned, or an EnvError naming it."""
    if isinstance(result, EnvError):
        raise result
    if result is None:
        raise EnvError(f"environment {env_name(env)}: get_reward() returned None; it returns the episode's reward "
                       f"(a finite number)")
    return as_reward(result, env_name(env), "get_reward()")


def _truncated(env, result) -> tuple[float, dict]:
    """(reward, info) from what `env.truncate()` returned, or an EnvError naming it."""
    if isinstance(result, EnvError):
        raise result
    if not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[1], dict):
        raise EnvError(f"environment {env_name(env)}: truncate() returned {result!r:.120}; it returns (reward, info)")
    return as_reward(result[0], env_name(env), "truncate()"), dict(as_info(result[1], env_name(env), "truncate()"))


def leave_out_failed(rollout, rewards: torch.Tensor, exact: torch.Tensor, extras: dict) -> tuple:
    """(rewards, exact, extras) with every entry of an episode whose environment failed made NaN, but
    its `turns` and `env/errors`: an environment's failure says nothing of the policy, so the episode
    counts in no accuracy, reward or metric mean, and the trainer gives it its group's mean reward
    with no gradient (`fill_unscored`), leaving the group's baseline to the episodes that ran."""
    failed = getattr(rollout, "failed", None)
    if failed is None or not bool(failed.any()):
        return rewards, exact, extras

    def blank(values: torch.Tensor) -> torch.Tensor:
        values = values if values.is_floating_point() else values.float()
        return values.masked_fill(failed.to(values.device).view(-1, *[1] * (values.dim() - 1)), math.nan)

    return blank(rewards), blank(exact), {k: v if k in EPISODE_FACTS else blank(v) for k, v in extras.items()}


EPISODE_FACTS = ("turns", "env/errors")  # per-episode numbers a failed episode still reports


def every_episode_failed(step: int, rollout) -> str:
    """The one line a run stops with when every episode of step `step` failed on its environment:
    the first episode's error, which names the environment."""
    first = next((i["env_error"] for i in rollout.infos if "env_error" in i), "no error recorded")
    return (f"every episode of step {step} failed on its environment, so there is nothing to learn from; the "
            f"first: {first} (checkpoints before step {step} are intact)")


def episode_record(info: dict, truncated: bool) -> dict:
    """What the completions log keeps of an episode beside its conversation: its turns, whether a
    limit cut it short, and its environment's error (None when it ran)."""
    return {"turns": info.get("turns", 0), "truncated": truncated, "env_error": info.get("env_error")}


def _fail(i: int, error: Exception, failed: list[bool], infos: list[dict]) -> None:
    failed[i] = True
    infos[i] = {**infos[i], "env_error": str(error)}
    log.warning(str(error))


def _observation_tokens(tok, observation, after_eos: bool, tools, max_context: int) -> list[int] | None:
    """The observation's token ids, or None when its text alone is surely longer than the context (no
    tokenizer makes a token of more than a few dozen characters, so such text is not tokenized at all)."""
    if _chars(observation) > 64 * max_context:
        return None
    return observation_ids(tok, observation, after_eos=after_eos, tools=tools)


def _chars(observation: str | list[dict]) -> int:
    """Characters of an observation's (or a conversation's) text."""
    if isinstance(observation, str):
        return len(observation)
    return sum(len(c) if isinstance(c := m.get("content") or "", str) else len(str(c)) for m in observation)


def left_pad(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, W), attention mask (B, W)) of token rows left-padded to the longest, on `device`."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        attn[i, width - len(r):] = 1
    return ids.to(device), attn.to(device)


def _right_pad(rows: list[list], pad, device, dtype=torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), pad, dtype=dtype)
    filled = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(r, dtype=dtype)
            filled[i, :len(r)] = 1
    return out.to(device), filled.to(device)
