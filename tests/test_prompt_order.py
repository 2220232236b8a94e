"""train.prompt_order: epochs over a task's training rows (shuffled or in order), split between the
ranks of a torchrun run, resumed from one count; random draws with replacement."""

import pytest
import torch

from lmrl.config import ConfigError, load_config
from lmrl.train.prompt_order import PromptDraws, epoch_order, positions
from lmrl.train.rl_trainer import RLTrainer, prompt_order


def _draw(draws: PromptDraws, sizes) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [draws(n, g).tolist() for n in sizes]


def test_shuffled_draws_every_row_once_per_epoch_in_a_new_order_each_epoch():
    draws = PromptDraws("shuffled", n_train=10, seed=3)
    batches = _draw(draws, [4, 4, 4, 4, 4])  # 20 rows: two epochs, the third batch crossing the boundary
    flat = sum(batches, [])
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != flat[10:]  # each epoch its own order
    assert flat[:10] == epoch_order("shuffled", 10, 3, 0).tolist()
    assert draws.drawn == 20 and draws.epochs() == 2.0
    assert _draw(PromptDraws("shuffled", n_train=10, seed=4), [10])[0] != flat[:10]  # the seed picks the order


def test_in_order_walks_the_rows_in_the_data_sets_order():
    assert sum(_draw(PromptDraws("in_order", n_train=5, seed=0), [3, 3, 3]), []) == [0, 1, 2, 3, 4, 0, 1, 2, 3]


def test_a_resumed_sampler_draws_exactly_the_rows_an_uninterrupted_one_would():
    whole = _draw(PromptDraws("shuffled", n_train=7, seed=1), [3] * 6)
    first = PromptDraws("shuffled", n_train=7, seed=1)
    head = _draw(first, [3] * 2)
    tail = _draw(PromptDraws("shuffled", n_train=7, seed=1, drawn=first.drawn), [3] * 4)
    assert head + tail == whole


def test_the_ranks_of_a_run_split_each_epoch_without_a_repeat():
    world = 3
    ranks = [PromptDraws("shuffled", n_train=12, seed=5, rank=r, world_size=world) for r in range(world)]
    per_step = [[r(2, torch.Generator()).tolist() for r in ranks] for _ in range(2)]  # 2 steps x 3 ranks x 2 rows
    rows = [i for step in per_step for rank in step for i in rank]
    assert sorted(rows) == list(range(12))  # one epoch, every row once, across the ranks
    assert rows == positions("shuffled", 12, 5, 0, 12).tolist()  # the ranks take the step's block in order


def test_random_draws_with_the_tasks_own_sampler():
    calls = []

    def sample(n, generator):
        calls.append(n)
        return torch.zeros(n, dtype=torch.long)

    draws = PromptDraws("random", n_train=0, seed=0, sample=sample)
    assert draws(4, torch.Generator()).tolist() == [0, 0, 0, 0] and calls == [4] and draws.drawn == 0


def test_a_bad_order_or_an_empty_training_set_is_one_line():
    with pytest.raises(ValueError, match="train.prompt_order must be one of shuffled, in_order, random"):
        PromptDraws("epochs", n_train=3, seed=0)
    with pytest.raises(ValueError, match="needs a training set, and this task has 0 rows"):
        PromptDraws("shuffled", n_train=0, seed=0)


def test_arithmetic_draws_at_random_and_refuses_in_order():
    class Generated:  # no n_train: problems made from their operands
        pass

    class Rows:
        n_train = 5

    assert prompt_order(load_config("adder", []), Generated()) == "random"
    assert prompt_order(load_config("adder", ["train.prompt_order=random"]), Generated()) == "random"
    assert prompt_order(load_config("adder", ["train.prompt_order=in_order"]), Rows()) == "in_order"
    with pytest.raises(ConfigError, match=r"train.prompt_order=in_order: Generated has no training set of rows"):
        prompt_order(load_config("adder", ["train.prompt_order=in_order"]), Generated())


def test_rl_on_a_data_set_passes_over_its_rows_in_epochs(tmp_path):
    from tests.test_hf import save_tiny_llama
    from lmrl.common.data import write_jsonl

    save_tiny_llama(tmp_path / "model")
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"{i}+1=", "ground_truth": str(i + 1)} for i in range(6)])
    write_jsonl(tmp_path / "test.jsonl", [{"prompt": "9+1=", "ground_truth": "10"}])
    seen: list[list[int]] = []

    class Recorded(RLTrainer):
        def draw_prompts(self, n):
            ids = super().draw_prompts(n)
            seen.append(ids.tolist())
            return ids

    def config(run, *extra):
        return load_config("math-grpo-smollm2", [
            f"model.path={tmp_path / 'model'}", "lora.r=0", "task.generate=", f"task.train_file={tmp_path / 'train.jsonl'}",
            f"task.test_file={tmp_path / 'test.jsonl'}", "task.max_new_tokens=2", "algo.group_size=2",
            "train.rollout_size=8", "train.steps=3", "train.eval_every=3", "train.ckpt_every=1", "eval.size=1",
            "eval.batch_size=1", "run.progress=false", "run.tensorboard=false", "run.threads=1", "algo.kl_coef=0",
            f"run.dir={tmp_path / run}", *extra])

    Recorded(config("a")).train()
    prompts = list(seen)
    flat = sum(prompts, [])  # 3 steps x 4 prompts: two epochs of 6
    assert len(flat) == 12 and sorted(flat[:6]) == list(range(6)) and sorted(flat[6:]) == list(range(6))

    seen.clear()
    cfg = config("b", "train.steps=2")
    Recorded(cfg).train()
    cfg.train.steps, cfg.run.resume = 3, "auto"
    Recorded(cfg).train()  # resumed after step 2: the third batch as the whole run drew it
    assert seen == prompts
