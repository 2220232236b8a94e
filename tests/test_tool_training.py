"""TRL's `tools=` and `environment_factory=` on lmrl: prompts answered over several turns with tool
calls, the results going back as tool messages, reward functions getting the episode (and its
environments), an environment's `get_reward` as a reward source named after its class. A scripted
policy writes the calls (a tiny random model would never write one); the trainer runs on a tiny Llama."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest
import torch

pytest.importorskip("transformers")

from lmrl.cli import main  # noqa: E402
from lmrl.config import load_config  # noqa: E402
from lmrl.models.hf import load_hf_policy  # noqa: E402
from lmrl.tasks.prompt_task import PromptTask  # noqa: E402
from lmrl.tasks.rewards import RewardFunctions, TrainerState, score_rollout  # noqa: E402
from lmrl.tasks.tool_task import ToolPromptTask, environment_reward  # noqa: E402
from lmrl.trl import GRPOConfig, GRPOTrainer  # noqa: E402
from lmrl.train.rl_trainer import RLTrainer  # noqa: E402
from tests.test_hf import CORPUS, SPECIAL, TEMPLATE  # noqa: E402


def multiply(a: int, b: int) -> int:
    """Multiplies two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


class Counter:
    """An environment_factory class: its public method is a tool, get_reward its own reward."""

    def reset(self, **row):
        self.calls, self.target = 0, row.get("target")
        return f" (target {self.target})"

    def bump(self, by: int) -> str:
        """Adds to the counter.

        Args:
            by: How much to add.
        """
        self.calls += by
        return f"counter at {self.calls}"

    def get_reward(self) -> float:
        return float(self.calls == self.target)


class Scripted:
    """A policy that writes `turns[k]` as its k-th turn in every running episode (then EOS); the
    rest (tokenizer, encode, eos ids) is the tiny model's."""

    def __init__(self, policy, turns):
        self.policy, self.turns, self.calls = policy, turns, 0

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def generate_ids(self, ids, mask, max_new_tokens, **_):
        tok = self.policy.tokenizer
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        row = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        completion = torch.tensor([row] * ids.size(0))
        return completion, torch.ones_like(completion), torch.full(completion.shape, -0.5)


def save_byte_llama(directory):
    """A 2-layer, 32-dim Llama whose byte-level BPE covers every byte (the tool calls' braces and
    quotes included), with test_hf's ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="<|im_end|>",
                                     chat_template=TEMPLATE)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=0,
                                         bos_token_id=1, eos_token_id=2))
    model.save_pretrained(directory)
    hf_tok.save_pretrained(directory)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tools")
    save_byte_llama(root / "model")
    return root / "model"


@pytest.fixture(scope="module")
def policy(tiny_dir):
    torch.manual_seed(0)
    return load_hf_policy(str(tiny_dir))[0]


def _prompts(tmp_path, rows):
    for name in ("train", "test"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(tmp_path / "train.jsonl"), str(tmp_path / "test.jsonl")


CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'


def test_a_tool_call_runs_and_its_result_goes_back_as_a_tool_message(policy, tmp_path):
    train, test = _prompts(tmp_path, [{"prompt": "What is 12 * 34?", "ground_truth": "408"}])
    base = PromptTask(train, test, policy.tokenizer, scorer=None, max_new_tokens=40)
    task = ToolPromptTask(base, tools=[multiply], max_turns=4)
    assert "multiply" in task.system_text  # the tiny model's ChatML template does not render tools= itself
    ro = task.rollout(Scripted(policy, [CALL, "It is 408."]), torch.tensor([0, 0]))
    messages = ro.transcripts[0]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[3] == {"role": "tool", "name": "multiply", "content": "408"}
    assert ro.infos[0]["turns"] == 2 and ro.infos[0]["tool_calls_total"] == 1
    # the tool's result is context (mask 0) between the model's two turns (mask 1)
    tok = policy.tokenizer
    result = tok.decode(ro.completions[0][ro.mask[0] == 0], skip_special_tokens=True)
    assert "408" in result and "408" not in tok.decode(ro.completions[0][:ro.mask[0].argmin()])

    seen = {}

    def exact(prompts, completions, ground_truth, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [float(c[-1]["content"].endswith(g + ".")) for c, g in zip(completions, ground_truth)]

    rewards, metrics = RewardFunctions([exact]).score(task, torch.tensor([0, 0]), ro, TrainerState())
    assert rewards.tolist() == [1.0, 1.0]
    assert seen["prompts"][0][-1] == {"role": "user", "content": "What is 12 * 34?"}
    assert [m["role"] for m in seen["completions"][0]] == ["assistant", "tool", "assistant"]


def test_a_malformed_or_failing_call_is_answered_with_an_error_and_the_episode_goes_on(policy, tmp_path):
    train, test = _prompts(tmp_path, [{"prompt": "What is 12 * 34?"}])
    task = ToolPromptTask(PromptTask(train, test, policy.tokenizer, scorer=None, max_new_tokens=40),
                          tools=[multiply], max_turns=3)
    bad = ['<tool_call>{"name": "multiply", "arguments": {"a": 1}', '<tool_call>{"name": "divide"}</tool_call>',
           "done"]
    ro = task.rollout(Scripted(policy, bad), torch.tensor([0]))
    tools = [m for m in ro.transcripts[0] if m["role"] == "tool"]
    assert len(tools) == 2 and all("error" in m["content"] for m in tools)
    assert "unknown tool 'divide'" in tools[1]["content"]
    assert not ro.failed.any() and ro.infos[0]["tool_failures_total"] == 2 and ro.infos[0]["turns"] == 3


def test_an_environment_factory_gives_tools_a_prompt_suffix_and_a_reward_named_after_its_class(policy, tmp_path):
    train, test = _prompts(tmp_path, [{"prompt": "Bump the counter to 2.", "target": 2}])
    task = ToolPromptTask(PromptTask(train, test, policy.tokenizer, scorer=None, max_new_tokens=40),
                          environment_factory=Counter, max_turns=3)
    assert task.reward_source == "Counter" and [s["function"]["name"] for s in task.schemas] == ["bump"]
    call = '<tool_call>{"name": "bump", "arguments": {"by": 2}}</tool_call>'
    ro = task.rollout(Scripted(policy, [call, "ok"]), torch.tensor([0, 0]))
    assert ro.transcripts[0][1]["content"] == "Bump the counter to 2. (target 2)"  # reset(**row)'s text appended
    reward = RewardFunctions([environment_reward("Counter")])
    rewards, metrics = reward.score(task, torch.tensor([0, 0]), ro, TrainerState())
    assert rewards.tolist() == [1.0, 1.0] and "rewards/Counter/mean" in metrics


def test_rl_trainer_answers_prompts_with_tools_and_logs_tool_metrics(tiny_dir, tmp_path):
    rows = [{"prompt": f"What is {a} * 7?", "ground_truth": str(7 * a)} for a in range(8)]

    def length(completions, **kwargs):
        return [float(len(c)) for c in completions]  # messages in the episode: more when tools are called

    cfg = load_config("adder", [
        "model.type=hf", f"model.path={tiny_dir}", f"run.dir={tmp_path / 'run'}", "task.name=prompts",
        "task.max_new_tokens=6", "sft.steps=0", "algo.name=grpo", "algo.group_size=2", "train.steps=2",
        "train.rollout_size=4", "train.eval_every=2", "train.log_every=1", "eval.size=2", "eval.batch_size=2",
        "env.max_turns=2", "train.stopping_threshold=null", "train.ema_decay=0", "run.mixed_precision=",
        "model.dropout=0", "run.progress=false", "run.tensorboard=false", "run.threads=1"])
    trainer = RLTrainer(cfg, train_dataset=rows, reward_funcs=length, tools=[multiply])
    assert isinstance(trainer.task, ToolPromptTask)
    assert trainer.train()["steps_done"] == 2
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in logged if "train/avg_reward" in r]
    assert rl and all("tools/calls" in r and "rollout/turns" in r for r in rl)


def test_trls_grpo_trainer_takes_tools_and_an_environment_factory(tiny_dir, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=6, max_tool_calling_iterations=1, report_to=[],
                      use_cpu=True, logging_steps=1)
    trainer = GRPOTrainer(str(tiny_dir), args=args, train_dataset=[{"prompt": [{"role": "user", "content": "Go"}],
                                                                     "target": 1}] * 4,
                          tools=[multiply], environment_factory=Counter)
    assert trainer.config.env.max_turns == 2
    assert [s["function"]["name"] for s in trainer.task.schemas] == ["multiply", "bump"]
    assert trainer.reward_fn.names == ["Counter"]
    trainer.train()
    logged = (tmp_path / "trl" / "metrics.jsonl").read_text()
    assert "rewards/Counter/mean" in logged and "tools/calls" in logged


def test_env_tools_and_python_tools_answer_the_prompts_together(tiny_dir, tmp_path):
    def add(a: int, b: int) -> int:
        """Adds two integers.

        Args:
            a: The first term.
            b: The second term.
        """
        return a + b

    cfg = load_config("adder", [
        "model.type=hf", f"model.path={tiny_dir}", f"run.dir={tmp_path / 'run'}", "task.name=prompts",
        "task.max_new_tokens=6", "sft.steps=0", "env.max_turns=2", "env.tools=[tests.test_tool_training:multiply]",
        "train.ema_decay=0", "run.mixed_precision=", "model.dropout=0", "run.tensorboard=false", "run.threads=1"])
    trainer = RLTrainer(cfg, train_dataset=[{"prompt": "What is 2 * 3?"}] * 4, reward_funcs=lambda completions, **_:
                        [0.0] * len(completions), tools=[add])
    assert [s["function"]["name"] for s in trainer.task.schemas] == ["multiply", "add"]
    assert trainer.task.turn_tokens == 6 and trainer.task.max_new_tokens == 12  # one budget per turn, not compounded


# -- threads and failures: each episode's instance on one thread; a broken one ends its own episode -----------
class UserDB:
    """An environment_factory class that opens its database in __init__, as TRL's examples do (a sqlite3
    connection works only in the thread that opened it)."""

    def __init__(self):
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE TABLE users(name)")

    def reset(self, **row):
        self.db.executemany("INSERT INTO users VALUES (?)", [("a",), ("b",), ("c",)])

    def count(self, table: str) -> int:
        """Counts a table's rows.

        Args:
            table: The table's name.
        """
        return self.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]

    def get_reward(self) -> float:
        return float(self.count("users") == 3)


USERS = sqlite3.connect(":memory:")  # made at import, in the trainer's thread, as a module's TRL tool would be
USERS.execute("CREATE TABLE users(name)")
USERS.executemany("INSERT INTO users VALUES (?)", [("a",), ("b",)])


def count_users(table: str) -> int:
    """Counts a table's rows in the shared database.

    Args:
        table: The table's name.
    """
    return USERS.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def _count(name):
    return f'<tool_call>{{"name": "{name}", "arguments": {{"table": "users"}}}}</tool_call>'


def test_an_environment_factory_instance_is_made_called_and_read_on_one_thread(policy, tmp_path):
    train, test = _prompts(tmp_path, [{"prompt": "How many users?"}])
    task = ToolPromptTask(PromptTask(train, test, policy.tokenizer, scorer=None, max_new_tokens=40),
                          environment_factory=UserDB, max_turns=2)
    ro = task.rollout(Scripted(policy, [_count("count"), "3"]), torch.tensor([0, 0]))
    assert not ro.failed.any(), [i.get("env_error") for i in ro.infos]
    assert [m["content"] for m in ro.transcripts[0] if m["role"] == "tool"] == ["3"]
    assert ro.final_rewards == [1.0, 1.0]  # get_reward() read on the instance's own thread, as the episode ended
    rewards, _ = RewardFunctions([environment_reward("UserDB")]).score(task, torch.tensor([0, 0]), ro, TrainerState())
    assert rewards.tolist() == [1.0, 1.0]


def test_with_no_step_time_limit_tools_run_in_the_callers_thread_as_trl_runs_them(policy, tmp_path):
    train, test = _prompts(tmp_path, [{"prompt": "How many users?"}])
    task = ToolPromptTask(PromptTask(train, test, policy.tokenizer, scorer=None, max_new_tokens=40),
                          tools=[count_users], max_turns=2, step_timeout_s=None)
    ro = task.rollout(Scripted(policy, [_count("count_users"), "2"]), torch.tensor([0]))
    assert [m["content"] for m in ro.transcripts[0] if m["role"] == "tool"] == ["2"]


def _picky(how: str):
    """Counter misbehaving in the way `how` says on the rows whose target is 2."""
    bad = {"reset_raises": {"reset": lambda self, **row: 1 / 0 if row["target"] == 2 else Counter.reset(self, **row)},
           "reward_nan": {"get_reward": lambda self: float("nan") if self.target == 2 else 1.0},
           "reward_str": {"get_reward": lambda self: "1.0" if self.target == 2 else 1.0},
           "reward_none": {"get_reward": lambda self: None if self.target == 2 else 1.0},
           "reward_raises": {"get_reward": lambda self: 1 / 0 if self.target == 2 else 1.0}}[how]
    return type("Picky", (Counter,), bad)


BROKEN_ENVIRONMENTS = [
    ("reset_raises", r"environment ToolEnv\(Picky\): reset\(\) raised ZeroDivisionError: division by zero"),
    ("reward_nan", r"environment Picky: get_reward\(\) returned reward nan; a reward is a finite number"),
    ("reward_str", r"environment Picky: get_reward\(\) returned reward '1.0' \(str\); a reward is a finite number"),
    ("reward_none", r"environment ToolEnv\(Picky\): get_reward\(\) returned None; it returns the episode's reward"),
    ("reward_raises", r"environment ToolEnv\(Picky\): get_reward\(\) raised ZeroDivisionError: division by zero"),
]


@pytest.mark.parametrize("how, message", BROKEN_ENVIRONMENTS, ids=[h for h, _ in BROKEN_ENVIRONMENTS])
def test_an_environment_factory_instance_that_breaks_fails_its_own_episode_only(policy, tmp_path, how, message):
    train, test = _prompts(tmp_path, [{"prompt": "Bump the counter to 1.", "target": 1},
                                      {"prompt": "Bump the counter to 2.", "target": 2}])
    task = ToolPromptTask(PromptTask(train, test, policy.tokenizer, scorer=None, max_new_tokens=40),
                          environment_factory=_picky(how), max_turns=2)
    ids = torch.tensor([0, 1])
    ro = task.rollout(Scripted(policy, ['<tool_call>{"name": "bump", "arguments": {"by": 1}}</tool_call>', "done"]),
                      ids)
    assert ro.failed.tolist() == [False, True] and re.search(message, ro.infos[1]["env_error"])
    reward = RewardFunctions([environment_reward("Picky")])
    task.score_with(reward)
    rewards, _, extras = score_rollout(task, ids, ro, reward)  # no RewardError: the broken episode is left out
    assert rewards[0].item() == 1.0 and rewards[1].isnan() and extras["env/errors"].tolist() == [0.0, 1.0]


def test_an_environment_factory_that_raises_after_the_probe_fails_that_episode(policy, tmp_path):
    class Flaky(Counter):
        made = 0

        def __init__(self):
            Flaky.made += 1
            if Flaky.made == 2:  # the probe is the first; the first episode's is the second
                raise RuntimeError("no free sandbox")

    train, test = _prompts(tmp_path, [{"prompt": "Bump the counter to 1.", "target": 1}])
    task = ToolPromptTask(PromptTask(train, test, policy.tokenizer, scorer=None, max_new_tokens=40),
                          environment_factory=Flaky, max_turns=2, workers=1)
    ro = task.rollout(Scripted(policy, ['<tool_call>{"name": "bump", "arguments": {"by": 1}}</tool_call>', "done"]),
                      torch.tensor([0, 0]))
    assert ro.failed.tolist() == [True, False]
    assert ro.infos[0]["env_error"] == "environment ToolEnv(Flaky): its factory raised RuntimeError: no free sandbox"
    assert ro.environments[0] is None and isinstance(ro.environments[1], Flaky) and ro.final_rewards == [None, 1.0]


def test_a_tool_without_a_docstring_is_one_error_line_from_the_cli(tiny_dir, tmp_path, capsys):
    train, test = _prompts(tmp_path, [{"prompt": "What is 2 * 3?"}])
    code = main(["train", "adder", "model.type=hf", f"model.path={tiny_dir}", f"run.dir={tmp_path / 'run'}",
                 "task.name=prompts", f"task.train_file={train}", f"task.test_file={test}", "sft.steps=0",
                 "env.tools=[tests.test_tools:undocumented]", "reward.funcs=[tests.trl_rewards:reward_len]",
                 "run.progress=false", "run.tensorboard=false", "--no-wandb"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("lmrl train: error: tool 'undocumented' has no docstring")
