"""Multi-turn rollouts (lmrl/generation/agent.py) on a tiny Llama built locally, with a scripted env."""

import pytest
import torch

pytest.importorskip("transformers")

from lmrl.algos.base import policy_forward  # noqa: E402
from lmrl.models.hf import load_hf_policy  # noqa: E402
from lmrl.generation.agent import observation_ids, run_episodes  # noqa: E402
from tests.test_hf import save_tiny_llama  # noqa: E402


class CountingEnv:
    """Ends with reward +1 after `done_after` turns; every observation names the turn."""

    def __init__(self, done_after: int):
        self.done_after, self.turns, self.actions, self.closed, self.truncated = done_after, 0, [], False, False

    def step(self, action):
        self.turns += 1
        self.actions.append(action)
        done = self.turns >= self.done_after
        return f"observation {self.turns}", 1.0 if done else 0.0, done, {"outcome": "done" if done else "running"}

    def truncate(self):
        self.truncated = True
        return -0.3, {"outcome": "timeout"}

    def close(self):
        self.closed = True


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    directory = tmp_path_factory.mktemp("agent") / "model"
    save_tiny_llama(directory, max_positions=512)
    torch.manual_seed(0)
    return load_hf_policy(str(directory))[0]


def _open(n):
    return [[{"role": "user", "content": f"question {i}"}] for i in range(n)]


def test_observation_ids_put_a_user_turn_after_the_agent_and_skip_a_repeated_eos(policy):
    tok = policy.tokenizer
    with_eos = tok.decode(observation_ids(tok, "rows here", after_eos=False))
    without = tok.decode(observation_ids(tok, "rows here", after_eos=True))
    assert with_eos.startswith("<|im_end|>") and not without.startswith("<|im_end|>")
    assert "rows here" in without and without.rstrip().endswith("assistant")  # the next generation prompt


def test_episodes_interleave_agent_and_environment_tokens_with_loss_on_the_agent_only(policy):
    envs = [CountingEnv(done_after=2), CountingEnv(done_after=3)]
    gen = torch.Generator().manual_seed(0)
    ro = run_episodes(policy, envs, _open(2), max_turns=5, max_new_tokens=6, generator=gen)
    tok = policy.tokenizer
    assert ro.rewards.tolist() == [1.0, 1.0]
    assert [i["turns"] for i in ro.infos] == [2, 3] and all(e.closed for e in envs)
    for row, env in enumerate(envs):
        agent = ro.completions[row][ro.mask[row].bool()]
        observations = tok.decode(ro.completions[row][~ro.mask[row].bool()], skip_special_tokens=True)
        # every observation but the last (the episode ended on it) is in the context, never in the loss
        for t in range(1, env.turns):
            assert f"observation {t}" in observations
        assert f"observation {env.turns}" not in observations
        assert tok.decode(agent, skip_special_tokens=True) == "".join(env.actions)
        assert [m["role"] for m in ro.transcripts[row]] == ["user"] + ["assistant", "user"] * (env.turns - 1) + ["assistant"]
    assert (ro.logprobs[ro.mask == 0] == 0).all() and (ro.logprobs[ro.mask == 1] < 0).all()


def test_recorded_logprobs_equal_the_learners_recomputation_on_the_whole_conversation(policy):
    envs = [CountingEnv(done_after=3) for _ in range(3)]
    ro = run_episodes(policy, envs, _open(3), max_turns=5, max_new_tokens=5, temperature=0.8,
                      generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logp, _, _ = policy_forward(policy, ro.sequences, ro.completions.size(1), 0.8, ro.attention_mask)
    m = ro.mask.bool()
    torch.testing.assert_close(logp[m], ro.logprobs[m], atol=2e-4, rtol=0)


def test_episodes_past_max_turns_are_truncated_with_the_environments_penalty(policy):
    envs = [CountingEnv(done_after=10)]
    ro = run_episodes(policy, envs, _open(1), max_turns=2, max_new_tokens=4, generator=torch.Generator().manual_seed(0))
    assert envs[0].truncated and envs[0].turns == 2
    assert ro.rewards.tolist() == pytest.approx([-0.3]) and ro.infos[0]["outcome"] == "timeout"


def test_a_full_context_ends_the_episode_before_it_overflows(policy):
    envs = [CountingEnv(done_after=10)]
    ro = run_episodes(policy, envs, _open(1), max_turns=10, max_new_tokens=8, max_context=40,
                      generator=torch.Generator().manual_seed(0))
    assert envs[0].truncated and envs[0].turns < 10
    assert ro.sequences.size(1) <= 40


def test_every_turn_samples_with_the_options_the_penalty_counting_the_whole_conversation(policy):
    """Each agent token's recorded log-prob is that of transformers' processors on the conversation
    before it (the repetition penalty over its real tokens: the opening, earlier turns, observations)."""
    from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

    from lmrl.generation.sampling import Sampling

    envs = [CountingEnv(done_after=3) for _ in range(3)]
    ro = run_episodes(policy, envs, _open(3), max_turns=5, max_new_tokens=5,
                      sampling=Sampling(temperature=0.8, min_p=0.05, repetition_penalty=1.5),
                      generator=torch.Generator().manual_seed(1))
    full, attn, P = ro.sequences, ro.attention_mask, ro.prompts.size(1)
    with torch.no_grad():
        logits = policy.hf_model(input_ids=full, attention_mask=attn,
                                 position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits[:, P - 1:-1].float()
    penalize = RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=(ro.prompt_mask == 0).sum(1))
    expected = []
    for j in range(ro.completions.size(1)):
        step = MinPLogitsWarper(0.05)(None, TemperatureLogitsWarper(0.8)(None, penalize(full[:, :P + j],
                                                                                        logits[:, j].clone())))
        expected.append(torch.log_softmax(step, -1).gather(-1, ro.completions[:, j, None]).squeeze(-1))
    m = ro.mask.bool()
    assert m.sum(1).gt(5).all()  # several turns each
    torch.testing.assert_close(torch.stack(expected, 1)[m], ro.logprobs[m], atol=2e-4, rtol=0)
