"""Multi-turn rollouts: a Hugging Face policy talks to environments, and each whole conversation
becomes one token sequence the learner trains on.

    ro = run_episodes(policy, envs, first_messages, max_turns=5, max_new_tokens=96, temperature=1.0)
    ro.rewards          # (B,) each episode's return (the environment's rewards summed)
    ro.mask             # (B, N) 1 on the agent's own tokens only

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
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .local import Rollout


class Env(Protocol):
    """A multi-turn environment. `reset` opens an episode and returns the first observation;
    `step(action)` takes the agent's turn as text and returns (observation, reward, done, info);
    `truncate()` ends an episode the rollout has to cut short (context full) and returns
    (reward, info); `close()` releases what the episode held."""

    def reset(self, *args, **kwargs) -> str: ...
    def step(self, action: str) -> tuple[str, float, bool, dict]: ...
    def truncate(self) -> tuple[float, dict]: ...
    def close(self) -> None: ...


@dataclass
class AgentRollout(Rollout):
    """A `Rollout` of whole conversations, with each episode's return and record."""

    rewards: torch.Tensor = None  # (B,) sum of the environment's rewards
    infos: list[dict] = field(default_factory=list)  # the environment's last info, plus "turns"
    transcripts: list[list[dict]] = field(default_factory=list)  # chat messages, for logs and samples


def observation_ids(tokenizer, observation: str, *, after_eos: bool, role: str = "user") -> list[int]:
    """Token ids that put `observation` into the conversation after an assistant turn: the chat
    template's text between an assistant message's content and the next assistant message's
    content (end of turn, the observation as a `role` turn, the generation prompt). With
    `after_eos` the agent's sampled turn already ended with the tokenizer's EOS (e.g. `<|im_end|>`),
    so that marker is not written twice."""
    marker = "\x00LMRL_TURN\x00"
    head = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
    text = tokenizer.apply_chat_template(head + [{"role": role, "content": observation}], tokenize=False,
                                         add_generation_prompt=True)
    cut = text.find(marker)
    if cut < 0:
        raise ValueError("the chat template does not write the assistant's message content back as it is; "
                         "multi-turn rollouts need a template that does")
    delta = text[cut + len(marker):]
    eos = tokenizer.eos_token
    if after_eos and eos and delta.startswith(eos):
        delta = delta[len(eos):]
    return tokenizer(delta, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def run_episodes(policy, envs: list, first_messages: list[list[dict]], *, max_turns: int, max_new_tokens: int,
                 max_context: int = 4096, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 greedy: bool = False, generator: torch.Generator | None = None) -> AgentRollout:
    """Runs one episode per environment (already `reset`; `first_messages[i]` is the chat that opens
    episode i, ending with the user's first observation) until each is done, `max_turns` agent turns
    have been taken, or the conversation would outgrow `max_context` tokens (then `env.truncate()`).
    Turns of all running episodes are sampled as one batch. Returns an `AgentRollout`."""
    if len(envs) != len(first_messages) or not envs:
        raise ValueError(f"need one opening conversation per environment, got {len(first_messages)} for {len(envs)}")
    tok = policy.tokenizer
    eos_ids = set(policy.eos_token_ids)
    prompt_texts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in first_messages]
    prompt_ids, prompt_mask = policy.encode(prompt_texts)
    prompts = [row[m.bool()].tolist() for row, m in zip(prompt_ids.cpu(), prompt_mask.cpu())]
    n = len(envs)
    body: list[list[int]] = [[] for _ in range(n)]  # everything after the prompt
    mask: list[list[float]] = [[] for _ in range(n)]
    logps: list[list[float]] = [[] for _ in range(n)]
    transcripts = [list(m) for m in first_messages]
    returns, infos, turns = [0.0] * n, [dict() for _ in range(n)], [0] * n
    cut_short = [False] * n  # ended by the turn or context limit, not by the environment
    running = list(range(n))
    # Under FSDP the policy is gathered once for all turns: ranks take different numbers of turns, and
    # a gather per turn would leave one rank waiting for another's.
    with policy.gathered() if hasattr(policy, "gathered") else contextlib.nullcontext():
        while running:
            ids, attn = left_pad([prompts[i] + body[i] for i in running], tok.pad_token_id, prompt_ids.device)
            completion, keep, logprobs = policy.generate_ids(ids, attn, max_new_tokens, temperature=temperature,
                                                             top_k=top_k, top_p=top_p, greedy=greedy,
                                                             generator=generator)
            still = []
            for row, i in enumerate(running):
                k = keep[row].bool()
                agent = completion[row][k].tolist()
                body[i] += agent
                mask[i] += [1.0] * len(agent)
                logps[i] += logprobs[row][k].tolist()
                ended = bool(agent) and agent[-1] in eos_ids
                action = tok.decode(agent, skip_special_tokens=True)
                transcripts[i].append({"role": "assistant", "content": action})
                turns[i] += 1
                observation, reward, done, info = envs[i].step(action)
                returns[i] += float(reward)
                infos[i] = dict(info)
                if done:
                    continue
                obs = observation_ids(tok, observation, after_eos=ended)
                if turns[i] >= max_turns or len(prompts[i]) + len(body[i]) + len(obs) + max_new_tokens > max_context:
                    reward, info = envs[i].truncate()
                    cut_short[i] = True
                    returns[i] += float(reward)
                    infos[i] = dict(info)
                    continue
                transcripts[i].append({"role": "user", "content": observation})
                body[i] += obs
                mask[i] += [0.0] * len(obs)
                logps[i] += [0.0] * len(obs)
                still.append(i)
            running = still
    for env, info, t in zip(envs, infos, turns):
        info["turns"] = t
        env.close()
    device = prompt_ids.device
    completions, body_mask = _right_pad(body, tok.pad_token_id, device)
    return AgentRollout(prompt_ids, completions, _right_pad(logps, 0.0, device, torch.float32)[0],
                        _right_pad(mask, 0.0, device, torch.float32)[0], prompt_mask=prompt_mask,
                        truncated=torch.tensor(cut_short, device=device), rewards=torch.tensor(returns, dtype=torch.float32),
                        infos=infos, transcripts=transcripts)


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
