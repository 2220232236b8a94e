"""Multi-turn rollouts: a Hugging Face policy talks to environments, and each whole conversation
becomes one token sequence the learner trains on.

    ro = run_episodes(policy, envs, seeds=[0, 1, 2], max_turns=5, max_new_tokens=96, step_timeout_s=30)
    ro.rewards          # (B,) each episode's return (the environment's rewards summed)
    ro.mask             # (B, N) 1 on the agent's own tokens only
    ro.failed           # (B,) the environment broke (raised, hung, broke the protocol): see infos[i]["env_error"]

Environments follow `lmrl.envs.protocol` (Gymnasium's reset / step); they are reset with the seeds
here (or handed in already reset, with their opening conversations) and stepped concurrently.

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
import logging
import threading
import time
from dataclasses import dataclass, field

import torch

from ..common.chat import render_chat
from ..envs.protocol import EnvError, as_reset, as_reward, as_step, env_name
from .rollout import Rollout

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
    """Calls environments' methods concurrently (up to `workers` at once, each in a daemon thread),
    each call under `timeout_s`, and turns whatever goes wrong into one line (`EnvError`). A call
    that overruns is abandoned: its thread may go on (a daemon, so it never holds up exit), but the
    episode ends without it."""

    def __init__(self, workers: int = 8, timeout_s: float | None = None):
        self.workers, self.timeout_s = max(1, workers), timeout_s

    def map(self, calls: list) -> list:
        """`calls` are (env, method name, args); returns each call's value, or the EnvError it raised."""
        out = []
        for start in range(0, len(calls), self.workers):
            out += self._run(calls[start:start + self.workers])
        return out

    def _run(self, calls: list) -> list:
        results: list = [None] * len(calls)
        done = [threading.Event() for _ in calls]

        def work(k, env, method, args):
            try:
                results[k] = getattr(env, method)(*args)
            except BaseException as e:  # noqa: BLE001  (an environment's failure is reported, never raised)
                results[k] = EnvError(f"environment {env_name(env)}: {method}() raised {type(e).__name__}: "
                                      f"{_one_line(e)}")
            done[k].set()

        for k, (env, method, args) in enumerate(calls):
            threading.Thread(target=work, args=(k, env, method, args), daemon=True, name="lmrl-env").start()
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        for k, (env, method, _) in enumerate(calls):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not done[k].wait(left):
                results[k] = EnvError(f"environment {env_name(env)}: {method}() did not return within "
                                      f"{self.timeout_s:g} s (env.step_timeout_s)")
        return results


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
                 max_new_tokens: int, max_context: int = 4096, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, greedy: bool = False, generator: torch.Generator | None = None,
                 seeds: list[int] | None = None, preamble: list[dict] = (), tools: list[dict] | None = None,
                 step_timeout_s: float | None = None, workers: int = 8) -> AgentRollout:
    """Runs one episode per environment until each is done, `max_turns` agent turns have been taken,
    or the conversation would outgrow `max_context` tokens (then `env.truncate()` when it has one).
    Either the environments are already reset and `first_messages[i]` is the chat that opens
    episode i, or `seeds` are given: each environment is reset with its seed here and the episode
    opens with `preamble` and the first observation. `tools` (JSON schemas) are offered to the model
    through the chat template. Turns of all running episodes are sampled as one batch; their
    environments step concurrently (`workers` threads), each step within `step_timeout_s`.

    An environment that raises, hangs or returns what the protocol does not allow (see
    `lmrl.envs.protocol`) ends its episode: `failed[i]`, `infos[i]["env_error"]` (one line naming it,
    also logged), no loss on its tokens. Returns an `AgentRollout`."""
    if not envs or (first_messages is None) == (seeds is None) or len(first_messages or seeds) != len(envs):
        raise ValueError(f"need {len(envs)} environments with one opening conversation or one seed each")
    tok = policy.tokenizer
    eos_ids = set(policy.eos_token_ids)
    n = len(envs)
    returns, infos, turns = [0.0] * n, [dict() for _ in range(n)], [0] * n
    cut_short = [False] * n  # ended by the turn or context limit (the environment's own or the rollout's)
    failed = [False] * n
    stepper = Stepper(workers, step_timeout_s)
    if seeds is not None:
        first_messages = []
        for i, result in enumerate(stepper.map([(env, "reset", (seed,)) for env, seed in zip(envs, seeds)])):
            try:
                if isinstance(result, EnvError):
                    raise result
                observation = as_reset(result, env_name(envs[i]))[0]
            except EnvError as e:
                _fail(i, e, failed, infos)
                observation = ""  # the episode never starts: an empty opening, no turn, no loss
            first_messages.append(opening_messages(observation, preamble))
    prompt_texts = [render_chat(tok, m, add_generation_prompt=True, tools=tools) for m in first_messages]
    prompt_ids, prompt_mask = policy.encode(prompt_texts)
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
            completion, keep, logprobs = policy.generate_ids(ids, attn, max_new_tokens, temperature=temperature,
                                                             top_k=top_k, top_p=top_p, greedy=greedy,
                                                             generator=generator)
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
                except EnvError as e:
                    _fail(i, e, failed, infos)
                    continue
                returns[i] += reward
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
                        except EnvError as e:
                            _fail(i, e, failed, infos)
                            continue
                        returns[i] += reward
                        infos[i] = info
                    continue
                transcripts[i] += opening_messages(observation, [])
                body[i] += obs
                mask[i] += [0.0] * len(obs)
                logps[i] += [0.0] * len(obs)
                still.append(i)
            running = still
    closing = [(env, "close", ()) for env in envs if callable(getattr(env, "close", None))]
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
                        openings=[len(m) for m in first_messages])


def _truncated(env, result) -> tuple[float, dict]:
    """(reward, info) from what `env.truncate()` returned, or an EnvError naming it."""
    if isinstance(result, EnvError):
        raise result
    if not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[1], dict):
        raise EnvError(f"environment {env_name(env)}: truncate() returned {result!r:.120}; it returns (reward, info)")
    return as_reward(result[0], env_name(env), "truncate()"), dict(result[1])


def _fail(i: int, error: Exception, failed: list[bool], infos: list[dict]) -> None:
    failed[i] = True
    infos[i] = {**infos[i], "env_error": str(error)}
    log.warning(str(error))


def _observation_tokens(tok, observation, after_eos: bool, tools, max_context: int) -> list[int] | None:
    """The observation's token ids, or None when its text alone is surely longer than the context (no
    tokenizer makes a token of more than a few dozen characters, so such text is not tokenized at all)."""
    chars = len(observation) if isinstance(observation, str) else sum(len(m.get("content") or "") for m in observation)
    if chars > 64 * max_context:
        return None
    return observation_ids(tok, observation, after_eos=after_eos, tools=tools)


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
