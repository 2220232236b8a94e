"""EpisodeLearner: RL driven from the user's own agent loop (messages + reward in, adapter updated)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from lmrl.models.hf import load_hf_policy  # noqa: E402
from lmrl.models.lora import add_lora  # noqa: E402
from lmrl.tasks.text_batches import assistant_token_mask  # noqa: E402
from lmrl.train.online import EpisodeLearner, EpisodeLearnerConfig  # noqa: E402
from tests.test_hf import save_tiny_llama  # noqa: E402

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add 2 and 3"},
        {"role": "assistant", "content": "five"}, {"role": "user", "content": "times 2"},
        {"role": "assistant", "content": "ten it is"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("online") / "model"
    save_tiny_llama(directory, max_positions=256)
    return directory


def _policy(model_dir):
    torch.manual_seed(0)
    policy, _ = load_hf_policy(str(model_dir))
    return add_lora(policy, r=4, alpha=8, dropout=0.0, target_modules="all-linear")


def test_the_mask_covers_each_assistant_message_and_its_end_of_turn_only(model_dir):
    policy = _policy(model_dir)
    tok = policy.tokenizer
    ids, mask = assistant_token_mask(tok, CHAT)
    assert len(ids) == len(mask)
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    assert learned.replace(" ", "") == "five<|im_end|>tenitis<|im_end|>".replace(" ", "")
    context = tok.decode([i for i, m in zip(ids, mask) if not m])
    assert "add 2 and 3" in context and "five" not in context


def test_an_episode_that_does_not_end_with_the_assistant_is_refused(model_dir):
    with pytest.raises(ValueError, match="end with the assistant"):
        assistant_token_mask(_policy(model_dir).tokenizer, CHAT[:-1])


def test_updates_move_the_adapter_towards_rewarded_episodes_and_resume_from_the_run_dir(model_dir, tmp_path):
    policy = _policy(model_dir)
    cfg = EpisodeLearnerConfig(lr=5e-2, batch_episodes=2, run_dir=str(tmp_path / "run"))
    learner = EpisodeLearner(policy, cfg)
    good = CHAT[:-1] + [{"role": "assistant", "content": "ten"}]
    bad = CHAT[:-1] + [{"role": "assistant", "content": "eleven apples"}]
    ids, mask = assistant_token_mask(policy.tokenizer, good)

    def good_logprob():
        seq = torch.tensor([ids])
        with torch.no_grad():
            logits = policy(seq[:, :-1]).float().log_softmax(-1)
        lp = logits[0].gather(-1, seq[0, 1:, None]).squeeze(-1)
        return (lp * torch.tensor(mask[1:], dtype=torch.float32)).sum().item()

    before = good_logprob()
    assert learner.add_episode(good, 1.0) is None  # half a batch: no update yet
    metrics = learner.add_episode(bad, 0.0)
    assert metrics["step"] == 1 and metrics["train/avg_reward"] == 0.5
    for _ in range(3):
        learner.add_episode(good, 1.0)
        learner.add_episode(bad, 0.0)
    assert good_logprob() > before + 0.1
    assert (tmp_path / "run" / "checkpoints" / "step_4").is_dir()

    again = EpisodeLearner(_policy(model_dir), cfg)  # a restarted process picks the run up
    assert again.resumed_from.name == "step_4" and again.state["step"] == 4
    assert again.state["baseline"] == pytest.approx(learner.state["baseline"])
    for (n, p), (_, q) in zip(policy.named_parameters(), again.policy.named_parameters()):
        if p.requires_grad:
            assert torch.equal(p, q), n


def test_sampling_logprobs_are_compared_with_the_learners(model_dir):
    policy = _policy(model_dir)
    learner = EpisodeLearner(policy, EpisodeLearnerConfig(batch_episodes=1))
    ids, mask = assistant_token_mask(policy.tokenizer, CHAT)
    seq = torch.tensor([ids])
    with torch.no_grad():
        lp = policy(seq[:, :-1]).float().log_softmax(-1)[0].gather(-1, seq[0, 1:, None]).squeeze(-1)
    recorded = lp[torch.tensor(mask[1:], dtype=torch.bool)].tolist()
    metrics = learner.add_episode(CHAT, 1.0, logprobs=recorded)
    assert metrics["train/logprob_gap"] < 1e-4
    metrics = learner.add_episode(CHAT, 1.0, logprobs=[x - 1.0 for x in recorded])
    assert metrics["train/logprob_gap"] > 0.5


def test_a_non_finite_reward_is_refused_before_anything_is_queued(model_dir):
    learner = EpisodeLearner(_policy(model_dir), EpisodeLearnerConfig(batch_episodes=1))
    with pytest.raises(ValueError, match="finite"):
        learner.add_episode(CHAT, float("nan"))
    assert learner.pending == [] and learner.state["step"] == 0
