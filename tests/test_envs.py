"""Bring your own environment: the protocol's checks, the multi-turn loop with environments that
misbehave in every way the protocol allows for, a task and an environment registered in this file
and trained on, `env.id=package.module:Class`, and `RLTrainer(cfg, env_factory=...)`. A tiny Llama
built here plays; nothing is downloaded."""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import sys
import threading
import time

import pytest
import torch

pytest.importorskip("transformers")

from lmrl.algos.advantages import gae, group_advantages, token_level_rewards  # noqa: E402
from lmrl.cli import main  # noqa: E402
from lmrl.common.errors import TrainingError  # noqa: E402
from lmrl.config import ConfigError, load_config  # noqa: E402
from lmrl.envs import EnvError, check_env, register_env  # noqa: E402
from lmrl.envs.protocol import as_reset, as_step  # noqa: E402
from lmrl.envs.registry import load_object  # noqa: E402
from lmrl.models.hf import load_hf_policy  # noqa: E402
from lmrl.generation.agent import run_episodes  # noqa: E402
from lmrl.tasks import build_task, register_task  # noqa: E402
from lmrl.tasks.env_task import HELDOUT_SEED, EnvTask  # noqa: E402
from lmrl.tasks.rewards import fill_unscored, score_rollout  # noqa: E402
from lmrl.train.callbacks import Callback  # noqa: E402
from lmrl.train.evaluate import evaluate  # noqa: E402
from lmrl.train.rl_trainer import RLTrainer  # noqa: E402
from tests.test_hf import save_tiny_llama  # noqa: E402


class Countdown:
    """Gymnasium-style: `reset(seed)` picks how many turns the episode lasts (2 or 3); every turn
    earns 0.5 and the last one 1.0, so the return is known from the seed alone."""

    def __init__(self, bonus: float = 1.0):
        self.bonus, self.closed = bonus, False

    def reset(self, seed=None):
        self.left = 2 + (seed or 0) % 2
        self.seed = seed
        return f"Count down from {self.left}."

    def step(self, action):
        self.left -= 1
        done = self.left == 0
        return f"{self.left} left", self.bonus if done else 0.5, done, False, {"metrics": {"left": self.left}}

    def close(self):
        self.closed = True


def countdown_return(seed: int) -> float:
    return 0.5 * (1 + seed % 2) + 1.0


class FourValues(Countdown):
    """lmrl's first protocol: (observation, reward, done, info)."""

    def step(self, action):
        observation, reward, done, _, info = super().step(action)
        return observation, reward, done, info


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("envs")
    save_tiny_llama(root / "model", max_positions=1024)
    return root / "model"


@pytest.fixture(scope="module")
def policy(tiny_dir):
    torch.manual_seed(0)
    return load_hf_policy(str(tiny_dir))[0]


def _play(policy, envs, seeds=None, **kw):
    kw = {"max_turns": 4, "max_new_tokens": 4, "generator": torch.Generator().manual_seed(0), **kw}
    return run_episodes(policy, envs, seeds=list(seeds if seeds is not None else range(len(envs))), **kw)


# -- the protocol ----------------------------------------------------------------------------------------
def test_gymnasium_five_values_and_the_first_protocols_four_add_up_to_the_same_returns(policy):
    for cls in (Countdown, FourValues):
        envs = [cls() for _ in range(4)]
        ro = _play(policy, envs)
        assert ro.rewards.tolist() == [countdown_return(s) for s in range(4)], cls
        assert [i["turns"] for i in ro.infos] == [2 + s % 2 for s in range(4)]
        assert not ro.failed.any() and not ro.truncated.any() and all(e.closed for e in envs)


def test_reset_may_return_gymnasiums_observation_and_info_pair():
    assert as_reset(("hello", {"level": 1}), "x") == ("hello", {"level": 1})
    assert as_reset([{"role": "user", "content": "hi"}], "x") == ([{"role": "user", "content": "hi"}], {})


def test_check_env_names_the_part_of_the_protocol_an_environment_breaks():
    check_env(Countdown())

    class NoBool(Countdown):
        def step(self, action):
            return "obs", 1.0, "yes", False, {}

    with pytest.raises(EnvError, match=r"environment NoBool: step\(\) returned terminated='yes'"):
        check_env(NoBool())


def test_numpy_bools_are_flags_and_rewards_success_and_metrics_are_held_to_their_types():
    np = pytest.importorskip("numpy")
    # gymnasium-style code compares numpy values: its flags are numpy bools (called numpy.bool in numpy 2)
    assert as_step(("o", np.float32(0.5), np.int64(3) == 3, np.bool_(False), {}), "x")[1:4] == (0.5, True, False)
    bad = [(("o", 10**400, True, False, {}), r"returned reward 1000.*\(401 characters\); a reward is a finite number "
                                              r"within float32's range"),
           (("o", 1e39, True, False, {}), r"returned reward 1e\+39; a reward is a finite number within float32"),
           (("o", 1.0, True, False, {"success": math.nan}), r"info\['success'\]=nan \(float\); it is True or False"),
           (("o", 1.0, True, False, {"success": "yes"}), r"info\['success'\]='yes' \(str\); it is True or False"),
           (("o", 1.0, True, False, {"metrics": [1, 2]}), r"info\['metrics'\]=\[1, 2\] \(list\); metrics is a dict")]
    for result, message in bad:
        with pytest.raises(EnvError, match=message) as error:
            as_step(result, "x")
        assert "\n" not in str(error.value)
    assert as_step(("o", 1.0, True, False, {"success": np.bool_(True), "metrics": {"n": 1}}), "x")[4]["success"]


def test_gymnasium_envs_and_gymnasium_make_are_reset_with_their_seed_by_keyword(policy):
    gymnasium = pytest.importorskip("gymnasium")
    np = pytest.importorskip("numpy")

    class GymCountdown(gymnasium.Env):
        """Countdown as a gymnasium.Env: reset's seed is keyword-only, the flags numpy bools."""

        observation_space = action_space = gymnasium.spaces.Text(200)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.left = np.int64(2 + seed % 2)
            return f"Count down from {self.left}.", {}

        def step(self, action):
            self.left -= 1
            done = self.left == 0
            return f"{self.left} left", 1.0 if done else 0.5, done, np.bool_(False), {}

    class GymBroken(GymCountdown):
        def step(self, action):
            raise RuntimeError("lost the board")

    gymnasium.register("LmrlCountdown-v0", entry_point=GymCountdown, max_episode_steps=10, disable_env_checker=True)
    gymnasium.register("LmrlBroken-v0", entry_point=GymBroken, disable_env_checker=True)
    try:
        for envs in ([GymCountdown() for _ in range(3)], [gymnasium.make("LmrlCountdown-v0") for _ in range(3)]):
            ro = _play(policy, envs)
            assert not ro.failed.any(), [i.get("env_error") for i in ro.infos]
            assert ro.rewards.tolist() == [countdown_return(s) for s in range(3)]
        ro = _play(policy, [gymnasium.make("LmrlBroken-v0")])  # errors name the id, not the outer wrapper
        assert ro.infos[0]["env_error"] == "environment LmrlBroken-v0: step() raised RuntimeError: lost the board"
    finally:
        for name in ("LmrlCountdown-v0", "LmrlBroken-v0"):
            gymnasium.registry.pop(name, None)


# -- misbehaving environments: each ends its episode, is counted, and the batch goes on -----------------------
class Raises(Countdown):
    def step(self, action):
        raise RuntimeError("the server\nwent away")


class RaisesOnReset(Countdown):
    def reset(self, seed=None):
        raise KeyError("no such level")


class Hangs(Countdown):
    def step(self, action):
        time.sleep(30)


class ThreeValues(Countdown):
    def step(self, action):
        return "obs", 1.0, True


class NotText(Countdown):
    def step(self, action):
        return {"board": [1, 2]}, 0.0, False, False, {}


class NaNReward(Countdown):
    def step(self, action):
        return "obs", math.nan, False, False, {}


class TextReward(Countdown):
    def step(self, action):
        return "obs", "1.0", True, False, {}


BROKEN = [
    (Raises, r"environment Raises: step\(\) raised RuntimeError: the server went away"),
    (RaisesOnReset, r"environment RaisesOnReset: reset\(\) raised KeyError: 'no such level'"),
    (Hangs, r"environment Hangs: step\(\) did not return within 0.5 s"),
    (ThreeValues, r"environment ThreeValues: step\(\) returned a 3-tuple"),
    (NotText, r"environment NotText: step\(\) returned \{'board': \[1, 2\]\} \(dict\) as its observation"),
    (NaNReward, r"environment NaNReward: step\(\) returned reward nan; a reward is a finite number"),
    (TextReward, r"environment TextReward: step\(\) returned reward '1.0' \(str\); a reward is a finite number"),
]


@pytest.mark.parametrize("cls, message", BROKEN, ids=[c.__name__ for c, _ in BROKEN])
def test_a_broken_environment_ends_only_its_own_episode_with_a_one_line_error(policy, cls, message):
    envs = [Countdown(), cls(), Countdown()]
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("lmrl")
    logger.addHandler(handler)
    t0 = time.monotonic()
    try:
        ro = _play(policy, envs, step_timeout_s=0.5)
    finally:
        logger.removeHandler(handler)
    assert time.monotonic() - t0 < 10  # a hung step is abandoned at its deadline
    assert ro.failed.tolist() == [False, True, False]
    assert ro.rewards[[0, 2]].tolist() == [countdown_return(0), countdown_return(2)]
    error = ro.infos[1]["env_error"]
    assert "\n" not in error and __import__("re").search(message, error), error
    assert any(error == r.getMessage() for r in records)  # logged as it is
    assert ro.mask[1].sum() == 0  # the environment's fault: no loss on the episode
    assert ro.mask[0].sum() > 0 and ro.mask[2].sum() > 0


class Forever(Countdown):
    def step(self, action):
        return "again", 0.25, False, False, {}


def test_an_environment_that_never_terminates_is_cut_at_max_turns_with_its_rewards_so_far(policy):
    ro = _play(policy, [Forever()], max_turns=3)
    assert ro.truncated.tolist() == [True] and not ro.failed.any()
    assert ro.infos[0]["turns"] == 3 and ro.rewards.tolist() == [0.75]


class Floods(Countdown):
    def step(self, action):
        return "x" * 10_000_000, 0.5, False, False, {}


def test_an_observation_that_floods_the_context_ends_the_episode_without_tokenizing_it(policy):
    t0 = time.monotonic()
    ro = _play(policy, [Floods(), Countdown()], max_context=600)
    assert time.monotonic() - t0 < 10
    assert ro.truncated.tolist() == [True, False] and ro.rewards[0].item() == 0.5
    assert ro.completions.size(1) < 600


class LongOpening(Countdown):
    def reset(self, seed=None):
        super().reset(seed)
        return "word " * 3000


class HugeOpening(Countdown):
    def reset(self, seed=None):
        super().reset(seed)
        return "x" * 10_000_000


def test_an_opening_that_overflows_max_context_fails_its_episode_before_any_turn(policy):
    t0 = time.monotonic()
    ro = _play(policy, [LongOpening(), HugeOpening(), Countdown()], max_context=256)
    assert time.monotonic() - t0 < 10  # ten million characters are not tokenized
    assert ro.failed.tolist() == [True, True, False] and [i["turns"] for i in ro.infos] == [0, 0, 2]
    assert __import__("re").fullmatch(r"environment LongOpening: its opening is \d+ tokens, which with a turn of 4 "
                                      r"does not fit env.max_context=256", ro.infos[0]["env_error"])
    assert ro.infos[1]["env_error"] == ("environment HugeOpening: its opening is 10000000 characters, more than "
                                        "env.max_context=256 tokens hold")
    assert ro.prompts.size(1) < 64 and ro.mask[:2].sum() == 0  # the failed openings never sized the batch
    assert ro.rewards[2].item() == countdown_return(2)


def test_a_factory_that_raises_or_hangs_after_the_first_episodes_fails_those_episodes_only(policy):
    made, lock = [], threading.Lock()

    def factory():  # the episodes' environments are made side by side: the 2nd and 3rd made break
        with lock:
            made.append(1)
            k = len(made)
        if k == 2:
            raise RuntimeError("out of sandbox slots")
        if k == 3:
            time.sleep(5)
        return Countdown()

    task = EnvTask(factory, policy.tokenizer, train_episodes=10, heldout_episodes=2, max_turns=4, max_new_tokens=4,
                   step_timeout_s=0.5, name="sandboxed")
    t0 = time.monotonic()
    ro = task.rollout(policy, torch.tensor([0, 1, 2, 3]), generator=torch.Generator().manual_seed(0))
    assert time.monotonic() - t0 < 4
    assert ro.failed.sum() == 2
    assert sorted(i["env_error"] for i in ro.infos if "env_error" in i) == [
        "environment sandboxed: its factory did not return within 0.5 s (env.step_timeout_s)",
        "environment sandboxed: its factory raised RuntimeError: out of sandbox slots"]
    assert all(ro.rewards[s] == countdown_return(s) for s in range(4) if not ro.failed[s])


class Library(Countdown):
    """Opens a sqlite3 connection when made (a connection works only in the thread that opened it) and
    records the thread of every call."""

    def __init__(self):
        super().__init__()
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE TABLE books(title)")
        self.threads = [threading.get_ident()]

    def reset(self, seed=None):
        self.threads.append(threading.get_ident())
        self.db.execute("INSERT INTO books VALUES ('Dune')")
        return super().reset(seed)

    def step(self, action):
        self.threads.append(threading.get_ident())
        observation, reward, done, truncated, info = super().step(action)
        n = self.db.execute("SELECT count(*) FROM books").fetchone()[0]
        return f"{observation} ({n} book)", reward, done, truncated, info

    def close(self):
        self.threads.append(threading.get_ident())
        self.db.close()


def test_each_environment_is_made_reset_stepped_and_closed_on_one_thread(policy):
    for timeout_s, workers in ((5.0, 2), (None, 8)):  # no time limit: every call in the caller's thread
        envs = []

        def factory():
            envs.append(Library())
            return envs[-1]

        task = EnvTask(factory, policy.tokenizer, train_episodes=10, heldout_episodes=2, max_turns=4,
                       max_new_tokens=4, step_timeout_s=timeout_s, workers=workers)
        ro = task.rollout(policy, torch.tensor([0, 1, 2, 3]), generator=torch.Generator().manual_seed(0))
        assert not ro.failed.any(), [i.get("env_error") for i in ro.infos]
        assert ro.transcripts[0][2]["content"] == "1 left (1 book)"
        # made, reset, stepped 2 or 3 times, closed: each environment on one thread
        assert sorted(len(e.threads) for e in envs) == [5, 5, 6, 6] and all(len(set(e.threads)) == 1 for e in envs)
        threads = {e.threads[0] for e in envs}
        assert threads == {threading.get_ident()} if timeout_s is None else threading.get_ident() not in threads


def test_environments_step_concurrently():
    class Slow(Countdown):
        def step(self, action):
            time.sleep(0.3)
            return super().step(action)

    from lmrl.generation.agent import Stepper

    envs = [Slow() for _ in range(8)]
    for s, e in enumerate(envs):
        e.reset(s)
    t0 = time.monotonic()
    results = Stepper(workers=8, timeout_s=5).map([(e, "step", ("go",)) for e in envs])
    assert time.monotonic() - t0 < 1.5  # 8 x 0.3 s one after another would be 2.4 s
    assert all(as_step(r, "Slow")[1] == 0.5 for r in results)


# -- EnvTask: seeds, held-out episodes, metrics ---------------------------------------------------------
def test_held_out_episodes_play_seeds_no_training_episode_uses(policy):
    task = EnvTask(Countdown, policy.tokenizer, train_episodes=10, heldout_episodes=3, max_turns=4, max_new_tokens=4)
    assert [task.seed(i) for i in task.heldout_ids.tolist()] == [HELDOUT_SEED, HELDOUT_SEED + 1, HELDOUT_SEED + 2]
    ids = task.sample_train_ids(50, torch.Generator().manual_seed(0))
    assert ids.max() < 10
    ro = task.rollout(policy, torch.tensor([0, 1, 10]), generator=torch.Generator().manual_seed(0))
    rewards, success, extras = task.score_rollout(torch.tensor([0, 1, 10]), ro)
    assert rewards.tolist() == [countdown_return(0), countdown_return(1), countdown_return(HELDOUT_SEED)]
    assert success.tolist() == [1.0, 1.0, 1.0]  # a positive return, the environment saying nothing of success
    assert extras["turns"].tolist() == [2.0, 3.0, 2.0] and extras["env/errors"].tolist() == [0.0, 0.0, 0.0]
    assert extras["left"].tolist() == [0.0, 0.0, 0.0]  # info["metrics"], from each episode's last step
    prompts, episodes = task.texts(torch.tensor([0, 1, 10]), ro)
    assert prompts[0] == "Count down from 2." and "[user] 1 left" in episodes[0]


class Alternating(Countdown):
    """Every other one made breaks after paying 1.0 on its first turn; the others return 0 in one turn."""

    made = 0

    def __init__(self):
        super().__init__()
        Alternating.made += 1
        self.broken = Alternating.made % 2 == 0

    def step(self, action):
        self.left -= 1
        if not self.broken:
            return "lost", 0.0, True, False, {"metrics": {"score": 0}}
        if self.left < 1 + (self.seed or 0) % 2:
            raise ConnectionError("game server went away")
        return "go on", 1.0, False, False, {"metrics": {"score": 7}}


def test_a_failed_episode_counts_in_no_reward_accuracy_or_group_baseline(policy):
    Alternating.made = 0
    task = EnvTask(Alternating, policy.tokenizer, train_episodes=10, heldout_episodes=4, max_turns=4,
                   max_new_tokens=4, workers=1)  # one at a time: made in the batch's order
    ids = torch.tensor([3, 3, 5, 5])  # two GRPO groups of two: one episode of each breaks after paying 1.0
    ro = task.rollout(policy, ids, generator=torch.Generator().manual_seed(0))
    assert ro.failed.tolist() == [False, True, False, True]
    rewards, success, extras = score_rollout(task, ids, ro)
    assert rewards.isnan().tolist() == success.isnan().tolist() == extras["score"].isnan().tolist() == \
        [False, True, False, True]
    assert extras["env/errors"].tolist() == [0.0, 1.0, 0.0, 1.0] and not extras["turns"].isnan().any()
    filled, unscored = fill_unscored(rewards, ids)
    assert filled.tolist() == [0.0, 0.0, 0.0, 0.0] and unscored.tolist() == [False, True, False, True]
    # the healthy episode is its group's only real one: no advantage from its sibling's broken environment
    assert group_advantages(filled, 2).tolist() == [0.0, 0.0, 0.0, 0.0]

    Alternating.made = 0
    metrics = evaluate(policy, task, task.heldout_ids, batch_size=4)
    assert metrics["eval/env/errors"] == 0.5
    assert metrics["eval/accuracy"] == 0.0 and metrics["eval/reward"] == 0.0 and metrics["eval/score"] == 0.0


def test_ppo_credits_every_turn_of_an_episode_with_its_return(policy):
    task = EnvTask(Countdown, policy.tokenizer, train_episodes=10, heldout_episodes=4, max_turns=4,
                   max_new_tokens=4, workers=1)
    ids = torch.tensor([0, 1, 2, 3])
    ro = task.rollout(policy, ids, generator=torch.Generator().manual_seed(0))
    returns, _, _ = task.score_rollout(ids, ro)
    mask = ro.mask.float()
    assert ((mask[:, 1:] > mask[:, :-1]).sum(1) >= 1).all()  # every episode's mask has a hole: its observations
    token_rewards = token_level_rewards(returns, mask)
    torch.testing.assert_close(token_rewards.sum(1), returns)  # on the last turn's last token, not masked away
    advantages, _ = gae(token_rewards, torch.zeros_like(mask), mask)  # λ = γ = 1, values 0: the return everywhere
    torch.testing.assert_close(advantages, returns[:, None] * mask)


# -- training: a registered task, env.id=package.module:Class, env_factory= ---------------------------------
def _config(tiny_dir, run_dir, *overrides):
    return ["model.type=hf", f"model.path={tiny_dir}", f"run.dir={run_dir}", "run.progress=false",
            "run.tensorboard=false", "run.threads=1", "sft.steps=0", "algo.name=grpo", "algo.group_size=2",
            "train.steps=2", "train.rollout_size=4", "train.eval_every=2", "train.ckpt_every=1",
            "train.log_every=1", "eval.size=2", "eval.batch_size=2", "task.max_new_tokens=4",
            "env.max_turns=3", "env.heldout_episodes=2", "env.step_timeout_s=5", "optim.lr=1e-3",
            "train.stopping_threshold=null", "train.ema_decay=0", "run.mixed_precision=", "model.dropout=0", *overrides]


@register_env("countdown-test", help="tests/test_envs.py's Countdown")
def _countdown(config, bonus: float = 1.0):
    return lambda: Countdown(bonus)


def test_a_registered_environment_trains_and_takes_its_kwargs_from_the_config(tiny_dir, tmp_path):
    cfg = load_config("adder", _config(tiny_dir, tmp_path / "run", "task.name=env", "env.id=countdown-test",
                                       "env.kwargs.bonus=3.0"))
    summary = RLTrainer(cfg).train()
    assert summary["steps_done"] == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "train/avg_reward" in r]
    # every episode returns 0.5 per turn before the last and the bonus on it: 3.5 or 4.0
    assert rl and all(3.5 <= r["train/avg_reward"] <= 4.0 for r in rl)
    assert all(r["env/errors"] == 0.0 and r["rollout/turns"] >= 2 for r in rl)
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_env_id_names_the_users_own_class_and_env_factory_plays_from_python(tiny_dir, tmp_path):
    cfg = load_config("adder", _config(tiny_dir, tmp_path / "a", "task.name=env", "env.id=tests.test_envs:Countdown"))
    assert RLTrainer(cfg).train()["final_accuracy"] == 1.0  # every episode's return is positive

    no_id = load_config("adder", _config(tiny_dir, tmp_path / "b", "task.name=env"))
    trainer = RLTrainer(no_id, env_factory=lambda: Countdown(bonus=-5.0))
    assert trainer.train()["final_accuracy"] == 0.0  # -5 plus 0.5 or 1.0 from the turns before: never above 0


def test_training_goes_on_when_some_environments_break_and_counts_them(tiny_dir, tmp_path):
    class HalfBroken(Countdown):
        made = 0  # every other environment made breaks: half of each batch, and one of each group of two

        def __init__(self):
            super().__init__()
            HalfBroken.made += 1
            self.broken = HalfBroken.made % 2

        def step(self, action):
            if self.broken:
                raise RuntimeError("boom")
            return super().step(action)

    cfg = load_config("adder", _config(tiny_dir, tmp_path / "run", "task.name=env", "train.steps=3"))
    summary = RLTrainer(cfg, env_factory=HalfBroken).train()
    assert summary["steps_done"] == 3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    errors = [r["env/errors"] for r in rows if "env/errors" in r]
    assert errors and 0 < sum(errors) / len(errors) < 1
    assert "environment HalfBroken: step() raised RuntimeError: boom" in (tmp_path / "run" / "train.log").read_text()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.startswith("step_"))


class Outage(Countdown):
    """Plays until `down` is set, then every reset fails."""

    down = False

    def reset(self, seed=None):
        if Outage.down:
            raise ConnectionError("the game server is down")
        return super().reset(seed)


class TakeDownAfter(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer, step, metrics):
        Outage.down = step >= self.step


def test_a_step_whose_every_episode_failed_stops_the_run_in_one_line_with_its_checkpoints(tiny_dir, tmp_path):
    Outage.down = False
    cfg = load_config("adder", _config(tiny_dir, tmp_path / "run", "task.name=env", "train.steps=4"))
    with pytest.raises(TrainingError) as error:
        RLTrainer(cfg, env_factory=Outage, callbacks=[TakeDownAfter(1)]).train()
    assert str(error.value) == ("every episode of step 2 failed on its environment, so there is nothing to learn from; "
                                "the first: environment Outage: reset() raised ConnectionError: the game server is "
                                "down (checkpoints before step 2 are intact)")
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert checkpoints == ["step_1"]
    Outage.down = False


def test_an_importable_env_factory_is_recorded_so_lmrl_eval_plays_the_run(tiny_dir, tmp_path, capsys):
    cfg = load_config("adder", _config(tiny_dir, tmp_path / "a", "task.name=env", "train.steps=1"))
    RLTrainer(cfg, env_factory=Countdown).train()
    recorded = load_config(tmp_path / "a" / "config.yaml")
    assert recorded.env.id == "tests.test_envs:Countdown"
    assert main(["eval", str(tmp_path / "a")]) == 0
    assert json.loads(capsys.readouterr().out)["eval/accuracy"] == 1.0

    cfg = load_config("adder", _config(tiny_dir, tmp_path / "b", "task.name=env", "train.steps=1"))
    RLTrainer(cfg, env_factory=lambda: Countdown()).train()  # a lambda cannot be named in a config
    recorded = load_config(tmp_path / "b" / "config.yaml")
    assert recorded.env.id == ""
    with pytest.raises(ConfigError, match=r"records it as env.id only when it is importable.*set env.id in the run's "
                                          r"config.yaml to package.module:factory"):
        build_task(recorded, tokenizer=load_hf_policy(str(tiny_dir))[0].tokenizer)


def test_env_id_modules_are_found_in_the_current_directory_as_python_m_finds_them(tmp_path, monkeypatch):
    (tmp_path / "lmrl_test_games").mkdir()
    (tmp_path / "lmrl_test_games" / "__init__.py").write_text("")
    (tmp_path / "lmrl_test_games" / "guess.py").write_text("class Guess:\n    pass\n")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)  # the `lmrl` console script leaves the current directory off sys.path
    try:
        assert load_object("lmrl_test_games.guess:Guess").__name__ == "Guess"
    finally:
        for name in ("lmrl_test_games", "lmrl_test_games.guess"):
            sys.modules.pop(name, None)
    with pytest.raises(ConfigError, match=r"env.id='nowhere_pkg.games:Guess': cannot import nowhere_pkg.games "
                                          r"\(No module named 'nowhere_pkg'; looked on sys.path and in the current "
                                          r"directory"):
        load_object("nowhere_pkg.games:Guess")


def test_register_env_refuses_a_class_or_a_function_that_takes_no_config_in_one_line():
    for target in (Countdown, lambda: Countdown()):
        with pytest.raises(ValueError, match=r"@register_env\('countdown-class'\) decorates a function \(config, "
                                             r"\*\*kwargs\) -> factory, where factory\(\) makes one environment") as e:
            register_env("countdown-class")(target)
        assert "\n" not in str(e.value)
    assert "countdown-class" not in __import__("lmrl.envs", fromlist=["ENVS"]).ENVS


def test_a_task_registered_in_this_file_trains(tiny_dir, tmp_path):
    @register_task("countdown-task", help="Countdown episodes as a task of its own", chat=True, multi_turn=True)
    def build(config, *, tokenizer, **_):
        return EnvTask(lambda: Countdown(bonus=2.0), tokenizer, train_episodes=100, heldout_episodes=2,
                       max_turns=3, max_new_tokens=config.task.max_new_tokens)

    cfg = load_config("adder", _config(tiny_dir, tmp_path / "run", "task.name=countdown-task"))
    summary = RLTrainer(cfg).train()
    assert summary["steps_done"] == 2 and summary["final_accuracy"] == 1.0


def test_env_config_mistakes_are_one_line_errors(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match="env.id='nope' is not a registered environment"):
        RLTrainer(load_config("adder", _config(tiny_dir, tmp_path / "a", "task.name=env", "env.id=nope")))
    with pytest.raises(ConfigError, match=r"env.id='tests.test_envs:Nothing': tests.test_envs has no 'Nothing'"):
        RLTrainer(load_config("adder", _config(tiny_dir, tmp_path / "b", "task.name=env",
                                               "env.id=tests.test_envs:Nothing")))
    with pytest.raises(ConfigError, match=r"env.id=tests.test_envs:Countdown: making an environment failed: "
                                          r"TypeError: .*unexpected keyword argument 'level'"):
        RLTrainer(load_config("adder", _config(tiny_dir, tmp_path / "d", "task.name=env",
                                               "env.id=tests.test_envs:Countdown", "env.kwargs.level=2")))
    with pytest.raises(ConfigError, match="task.name=env needs a Hugging Face model"):
        load_config("adder", ["task.name=env", "env.id=countdown-test"])
    with pytest.raises(ConfigError, match="env.kwargs must be a mapping"):
        load_config("adder", _config(tiny_dir, tmp_path / "c", "task.name=env", "env.kwargs=[1, 2]"))
