"""REINFORCE++ and REINFORCE++-baseline: the returns and the whitening by hand, the advantages
against an independent transcription of OpenRLHF's recipe, the whitening over every rank's batch,
the config errors, and a run on the loop."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.testing import assert_close

from lmrl.algos import build_algorithm
from lmrl.algos.advantages import discounted_returns, masked_moments, normalize_advantages
from lmrl.algos.base import policy_forward
from lmrl.config import ConfigError, load_config
from lmrl.generation.rollout import sample
from lmrl.models.gpt import GPT, GPTConfig

from .conftest import TINY
from .test_algorithms import Stub

T = torch.tensor


def test_returns_sum_the_later_rewards_discounted_and_step_over_observation_tokens():
    rewards = T([[0.0, 0.0, 1.0], [0.0, 5.0, 2.0]])  # row 1's 5.0 sits on an observation token: not the policy's
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    # row 0: 0.5^2, 0.5, 1; row 1: token 0 sees token 2's reward one valid step later, 0.5 * 2
    assert_close(discounted_returns(rewards, mask, gamma=0.5), T([[0.25, 0.5, 1.0], [1.0, 0.0, 2.0]]))
    assert_close(discounted_returns(rewards, mask, gamma=1.0), T([[1.0, 1.0, 1.0], [2.0, 0.0, 2.0]]))


def test_whitening_with_moments_summed_over_parts_is_the_whitening_of_the_whole_batch():
    torch.manual_seed(0)
    x, mask = torch.randn(6, 5), (torch.rand(6, 5) > 0.3).float()
    moments = masked_moments(x[:3], mask[:3]) + masked_moments(x[3:], mask[3:])
    parts = [normalize_advantages(x[i:i + 3], mask[i:i + 3], moments=moments) for i in (0, 3)]
    assert_close(torch.cat(parts), normalize_advantages(x, mask))
    # by hand: the valid entries of the whole come out with mean 0 and (population) std 1
    out = normalize_advantages(x, mask)[mask.bool()]
    assert abs(out.mean().item()) < 1e-6 and abs(out.std(unbiased=False).item() - 1) < 1e-5


def _tiny_gpt(seed: int = 0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=12, n_position=16, n_layer=1, n_head=2, n_embd=16))


def _rollout(model, prompts=2, group=4, n=3):
    ro = sample(model, torch.randint(12, (prompts, 5)).repeat_interleave(group, 0), n,
                generator=torch.Generator().manual_seed(1))
    ro.mask[1, 2:] = 0  # one completion ended early: its return sits on its last sampled token
    return ro


def _algo(*overrides):
    return build_algorithm(load_config("adder", TINY + list(overrides)).algo, max_new_tokens=3)


def test_without_kl_every_token_of_a_completion_has_its_whitened_reward():
    model = _tiny_gpt()
    ro, rewards = _rollout(model), T([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])
    batch, metrics = _algo("algo.name=reinforce_plus_plus").prepare(Stub(model), ro, rewards)
    per_token = rewards[:, None].expand_as(ro.mask)[ro.mask.bool()]  # R_t = r on every sampled token (γ = 1)
    mean, std = per_token.mean(), per_token.std(unbiased=False)
    assert_close(batch.advantages, (rewards[:, None] - mean) / std * ro.mask)
    assert metrics["train/return_mean"] == pytest.approx(mean.item())


def test_without_the_std_the_returns_are_only_centred_as_openrlhfs_no_advantage_std_norm():
    model = _tiny_gpt()
    ro, rewards = _rollout(model), T([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])
    batch, _ = _algo("algo.name=reinforce_plus_plus", "algo.normalize_advantages_std=false").prepare(Stub(model), ro,
                                                                                                      rewards)
    mean = rewards[:, None].expand_as(ro.mask)[ro.mask.bool()].mean()
    assert_close(batch.advantages, (rewards[:, None] - mean) * ro.mask)


def test_the_baseline_variant_centres_each_reward_on_its_group_first():
    model = _tiny_gpt()
    ro, rewards = _rollout(model), T([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])
    batch, _ = _algo("algo.name=reinforce_plus_plus_baseline", "algo.group_size=4").prepare(Stub(model), ro, rewards)
    centred = rewards - T([0.375, 0.5625]).repeat_interleave(4)  # each group's mean, by hand
    per_token = centred[:, None].expand_as(ro.mask)[ro.mask.bool()]
    assert_close(batch.advantages, (centred[:, None] - per_token.mean()) / per_token.std(unbiased=False) * ro.mask)


def openrlhf_style_advantages(rewards, logp, ref_logp, mask, beta, gamma, group=None):
    """OpenRLHF's REINFORCE++ recipe, written out independently: the group mean off the reward
    (reinforce_baseline), −β·k1 on each token and the reward on the last one, returns running back
    and reset past the end, then (x − mean)·rsqrt(var) over every action token."""
    if group:
        rewards = rewards - rewards.view(-1, group).mean(1).repeat_interleave(group)
    token = -beta * (logp - ref_logp) * mask
    last = mask.sum(1).long() - 1
    token[torch.arange(len(rewards)), last] += rewards
    returns, running = torch.zeros_like(token), torch.zeros(len(rewards))
    for t in reversed(range(token.size(1))):
        running = token[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    n = mask.sum()
    mean = (returns * mask).sum() / n
    var = ((returns - mean) ** 2 * mask).sum() / n
    return (returns - mean) * var.clamp(min=1e-8).rsqrt() * mask


@pytest.mark.parametrize("name, group", [("reinforce_plus_plus", None), ("reinforce_plus_plus_baseline", 4)])
def test_with_the_kl_in_the_reward_the_advantages_are_openrlhfs(name, group):
    model, reference = _tiny_gpt(0), _tiny_gpt(1)
    ro, rewards = _rollout(model), T([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])
    algo = _algo(f"algo.name={name}", f"algo.group_size={group or 1}", "algo.kl_coef=0.1", "algo.kl_in_reward=true",
                 "algo.kl_estimator=k1", "algo.gamma=0.9")
    batch, _ = algo.prepare(Stub(model, reference), ro, rewards)
    with torch.no_grad():
        ref_logp, _, _ = policy_forward(reference, ro.sequences, 3)
    want = openrlhf_style_advantages(rewards, ro.logprobs, ref_logp, ro.mask.float(), 0.1, 0.9, group)
    assert_close(batch.advantages, want, rtol=1e-5, atol=1e-6)
    assert len(set(batch.advantages[0].tolist())) == 3, "the per-token KL gives each token its own advantage"


def _whiten_on_rank(rank, port, x, mask, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)

    class Ranked:
        all_reduce_sum = staticmethod(lambda t: dist.all_reduce(t) or t)

    half = slice(3 * rank, 3 * rank + 3)
    out[half] = _algo("algo.name=reinforce_plus_plus").whiten(Ranked(), x[half], mask[half])
    dist.destroy_process_group()


def test_two_ranks_whiten_with_the_whole_batchs_mean_and_std():
    torch.manual_seed(0)
    x, mask = torch.randn(6, 4), (torch.rand(6, 4) > 0.3).float()
    out = torch.zeros(6, 4).share_memory_()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_whiten_on_rank, args=(port, x, mask, out), nprocs=2)
    assert_close(out, normalize_advantages(x, mask))
    assert not torch.allclose(out[:3], normalize_advantages(x[:3], mask[:3])), "rank 0 whitened its half alone"


@pytest.mark.parametrize("overrides, message", [
    (["algo.name=reinforce_plus_plus_baseline"], "algo.group_size must be >= 2"),
    (["algo.name=reinforce_plus_plus", "algo.adv_mode=grpo_no_std"], "algo.adv_mode=grpo_no_std is for grpo's"),
    (["algo.name=reinforce_plus_plus", "algo.normalize_advantages=true"], "algo.normalize_advantages=True"),
    (["algo.name=grpo", "algo.group_size=4", "algo.gamma=0.9"], "algo.gamma=0.9 sets the discount"),
    (["algo.name=reinforce_plus_plus", "algo.lam=0.9"], "algo.lam=0.9"),
])
def test_options_reinforce_plus_plus_does_not_read_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("adder", TINY + overrides)


def test_reinforce_plus_plus_reads_the_discount():
    assert load_config("adder", TINY + ["algo.name=reinforce_plus_plus", "algo.gamma=0.9"]).algo.gamma == 0.9
