"""The config's sections: one dataclass per YAML section, each field with its default, its help
text and what values it takes, and each section's `check` beside its fields. Loading, overrides
and validation live in `lmrl.config`, which re-exports everything here.

A field's metadata says what it takes: `choices` (the registry of the module that implements them,
read when the config is checked, so a registered algorithm is a valid `algo.name` at once; a literal
tuple only where no module below the config declares the names), bounds `ge`/`gt`/`le`/`lt`, and
every float must be finite. `Section.problems` checks those, then the section's own `check` (rules
between its fields); `cross_section_problems` holds the rules that join sections."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import ClassVar

from ..algos import ALGORITHMS
from ..algos.advantages import GROUP_MODES, SCALE_REWARDS
from ..algos.losses import KL_ESTIMATORS, LOSS_LEVELS, RATIO_LEVELS
from ..algos.preference_losses import DPO_LOSS_TYPES, SMOOTHED_DPO_LOSSES
from ..common.chat import template_kwargs_problem
from ..common.errors import ConfigError  # noqa: F401  (re-exported: `from lmrl.config import ConfigError`)
from ..models.heads import VALUE_MODELS
from ..common.options import Section, _bounds_text, option as _f, suggest  # noqa: F401  (re-exported)
from ..engines.registry import ENGINES
from ..engines.vllm_engine import unsupported_reason as vllm_unsupported_reason
from ..common.schedules import DECAY_SHAPES, SCHEDULES
from ..envs.registry import ENVS
from ..parallel.ddp import DEVICES, device_problem
from ..tasks import GENERATORS, TASKS, generators_for, task_spec
from ..tasks.arithmetic import REWARDS as ARITHMETIC_REWARDS, seq_len as arithmetic_seq_len  # noqa: F401  (re-exported)
from ..tasks.text_batches import PACKING_STRATEGIES, TRUNCATION_MODES

PRESET_DIR = Path(__file__).parent / "presets"
PRESET_ALIASES = {"AdderRLConfig": "adder", "MultiplierRLConfig": "multiplier"}
# What `run.trainer` may be, each with what it trains. The trainers live in the train layer, above the
# config, so their names are declared here; each trainer class names its own (`trainer_key`) and
# `lmrl.train.trainers.TRAINERS` maps these names to the classes. "rl" runs RLTrainer, the others are the
# offline trainers (their checks differ: see `cross_section_problems`).
TRAINERS = {"rl": "warm-up + RL on a task", "sft": "supervised fine-tuning", "dpo": "DPO on preference pairs",
            "reward": "a reward model on preference pairs"}


@dataclass
class RunConfig(Section):
    name: str = _f("adder", "run name; the run dir defaults to runs/<name>")
    trainer: str = _f("rl", "what this config trains: " + " | ".join(f"{k} ({v})" for k, v in TRAINERS.items())
                            + " (all but rl: offline trainers over data.train_file)", choices=TRAINERS)
    dir: str | None = _f(None, "run directory (default runs/<name>)")
    seed: int = _f(1337, "seed for weights, prompts and sampling (below 2**32, as numpy's and transformers' seeds)",
                   ge=0, lt=2**32)
    device: str = _f("auto", DEVICES)
    resume: str = _f("never", "never | auto (continue from the latest checkpoint in the run dir)",
                     choices=("never", "auto"))
    wandb: bool = _f(False, "log to Weights & Biases (needs the wandb extra)")
    wandb_project: str = _f("lmrl", "Weights & Biases project")
    wandb_mode: str = _f("offline", "online | offline", choices=("online", "offline"))
    tensorboard: bool = _f(True, "write TensorBoard events to <run dir>/tb")
    progress: bool = _f(True, "show a progress bar")
    threads: int = _f(0, "torch CPU threads (0 = torch's default)", ge=0)
    mixed_precision: str = _f("", "bf16: training steps and rollouts run their matrix products in bfloat16 under "
                                  "torch.autocast, weights and optimizer state stay fp32; held-out evaluation runs "
                                  "in the weights' own precision ('' = off)", choices=("", "bf16"))
    resume_from: str | None = _f(None, "with run.resume=auto: resume from exactly this checkpoint dir "
                                       "(e.g. runs/x/checkpoints/step_200) instead of the run dir's newest")

    def check(self) -> list[str]:
        problem = device_problem(self.device)
        return [problem] if problem else []


@dataclass
class ModelConfig(Section):
    type: str = _f("gpt", "gpt (the built-in GPT) | hf (a transformers causal LM, see model.path)",
                   choices=("gpt", "hf"))
    path: str | None = _f(None, "hf: a local model directory, a directory holding model.gguf_file, or a "
                                "packaged name (smollm2-135m-instruct)")
    gguf_file: str | None = _f(None, "hf: the GGUF file inside model.path to load (dequantized)")
    dtype: str = _f("fp32", "hf: fp32 | bf16", choices=("fp32", "bf16"))
    gradient_checkpointing: bool = _f(False, "hf: recompute activations in the backward pass (less memory)")
    chat_template_kwargs: dict = _f({}, "hf: keyword arguments for the chat template wherever the run renders one "
                                        "(prompts, turns of an episode, training rows, a reward model's texts), as "
                                        "TRL's chat_template_kwargs: {enable_thinking: false} for Qwen3; a data "
                                        "row's chat_template_kwargs column goes over them")
    init_from: str | None = _f(None, "start from these weights: a checkpoint dir (e.g. runs/x/checkpoints/step_200) "
                                     "or a .safetensors file")
    n_layer: int = _f(4, "transformer blocks", ge=1)
    n_head: int = _f(8, "attention heads", ge=1)
    n_embd: int = _f(256, "embedding width", ge=1)
    n_position: int = _f(64, "longest sequence the model sees", ge=1)
    dropout: float = _f(0.0, "dropout probability", ge=0, lt=1)

    def check(self) -> list[str]:
        template = template_kwargs_problem(self.chat_template_kwargs)
        return [msg for ok, msg in [
            (self.type != "hf" or bool(self.path),
             "model.type=hf needs model.path (a local directory, or smollm2-135m-instruct)"),
            (self.type != "gpt" or self.n_embd % self.n_head == 0,
             f"model.n_embd={self.n_embd} must be divisible by model.n_head={self.n_head}"),
            (template is None, f"model.chat_template_kwargs {template}"),
        ] if not ok]


@dataclass
class TaskConfig(Section):
    name: str = _f("addition", "addition | multiplication (the built-in GPT) | math | prompts (JSONL prompts; "
                               "prompts are scored by reward.model, reward.cls or reward functions) | env (episodes "
                               "of the environment env.id) | a task registered with lmrl.tasks.register_task",
                   choices=TASKS)
    ndigit: int = _f(3, "digits per operand (problem ids count 10**(2*ndigit) problems in 64 bits)", ge=1, le=9)
    use_format: bool = _f(True, "prompt as 123+456= (False: bare digits 123456)")
    reverse_answer: bool = _f(True, "write the answer least-significant digit first")
    reward: str = _f("exact", "exact (1/0 per answer) | digits (fraction of digits right, per answer) | "
                              "per_digit (1/0 per digit, on that digit's token) | per_step (per_digit, the scratchpad's "
                              "product checked against the partial products written)", choices=ARITHMETIC_REWARDS)
    heldout_size: int = _f(1000, "problems reserved for evaluation, never trained on", ge=1)
    train_file: str | None = _f(None, "math / prompts: JSONL or parquet rows {prompt or messages, ground_truth, "
                                      "...} to train on (verl's rows as they are; other layouts: task.prompt_key, "
                                      "task.label_key); env.id=sql: DBBench-format JSONL (default: procedural tasks)")
    generate: str = _f("", "math and prompts: when train_file / test_file do not exist, write them first with "
                           "`lmrl data <generate>`'s defaults: word-problems | addition-chat | preferences, or "
                           "gsm8k: GSM8K's train and test splits as `lmrl prepare-data` converts them (empty: never)",
                       choices=("", *generators_for("task")))
    generate_from: str = _f("", "task.generate=gsm8k: a local directory of the data set's train*/test* .jsonl or "
                                ".parquet files to convert (empty: download it from the Hugging Face hub)")
    test_file: str | None = _f(None, "math / prompts: JSONL or parquet rows held out for evaluation; env.id=sql: "
                                     "DBBench-format JSONL")
    prompt_key: str = _f("prompt", "math / prompts: the key holding each row's prompt, a text or a list of {role, "
                                   "content} messages (verl's data.prompt_key, OpenRLHF's --input_key); a row's own "
                                   "messages are read with the default; a dotted path reads a nested key")
    label_key: str = _f("ground_truth", "math / prompts: the key holding each row's ground truth, which reward "
                                        "functions get as ground_truth (OpenRLHF's --label_key; a dotted path such as "
                                        "reward_model.ground_truth reads a nested key). With the default, a row "
                                        "without ground_truth takes verl's reward_model.ground_truth")
    max_new_tokens: int = _f(256, "longest completion sampled (env, or prompts with env.tools: longest turn)", ge=1)
    max_prompt_length: int = _f(512, "math / prompts: tokens a rendered prompt may have; a longer one keeps its last "
                                     "max_prompt_length tokens, as TRL's GRPOConfig cut them, and one line names its "
                                     "file:line and length (0 = no limit)", ge=0)
    chat: bool = _f(True, "math: wrap plain-text prompts as a user message in the model's chat template")
    system_prompt: str = _f("", "math, prompts, env: system message put before each chat prompt or episode (empty: "
                                "none)")
    prompt_template: str = _f("{prompt}", "math: how a row's prompt becomes the question asked; must hold {prompt}")
    scratchpad: bool = _f(False, "multiplication: write the partial products before the product (12*34=840|630|8040)")

    def check(self) -> list[str]:
        return [msg for ok, msg in [
            (not self.scratchpad or self.name == "multiplication", "task.scratchpad is for multiplication only"),
            (self.reward != "per_step" or self.scratchpad,
             "task.reward=per_step checks scratchpad steps: it needs task.scratchpad=true"),
            ("{prompt}" in self.prompt_template,
             f"task.prompt_template must contain {{prompt}}, got {self.prompt_template!r}"),
            (bool(self.prompt_key.strip()), "task.prompt_key must name the key that holds each row's prompt"),
            (bool(self.label_key.strip()), "task.label_key must name the key that holds each row's ground truth"),
            (not self.generate_from or (self.generate in GENERATORS and GENERATORS[self.generate].reads_source),
             f"task.generate_from is the source of a generator that converts a data set "
             f"({', '.join(n for n, g in GENERATORS.items() if g.reads_source)}); task.generate={self.generate!r} "
             f"reads none"),
        ] if not ok]


@dataclass
class EnvConfig(Section):
    """Multi-turn episodes: the environment of task.name=env, and tools offered to prompts."""
    id: str = _f("", "task.name=env: a registered environment (lmrl.envs.register_env), package.module:factory (your "
                     "own class or function), skyrl:<id> (skyrl-gym) or textarena:<id> (TextArena)")
    kwargs: dict = _f({}, "keyword arguments for the environment's factory (or the registered environment)")
    tools: list = _f([], "tools offered to the model, each package.module:function (typed, with a docstring), as "
                         "TRL's tools=: task.name=prompts answers each prompt with them over up to env.max_turns "
                         "turns")
    max_turns: int = _f(8, "agent turns per episode; an episode still running after them is cut short", ge=1)
    max_context: int = _f(2048, "tokens a conversation may reach; an episode that would outgrow it is cut short",
                          ge=1)
    step_timeout_s: float = _f(30.0, "seconds one reset or step may take before its episode ends as an error "
                                     "(0 = no limit: every call in the trainer's thread, one after another)", ge=0)
    workers: int = _f(8, "environments stepped at once (threads; each environment's calls on one thread of its "
                         "own)", ge=1)
    train_episodes: int = _f(100_000, "training episodes: seeds 0..N-1 (the environment's reset(seed))", ge=1,
                             lt=1_000_000_000)
    heldout_episodes: int = _f(64, "held-out episodes, on seeds no training episode uses", ge=1)

    def check(self) -> list[str]:
        bad = [t for t in self.tools if not callable(t) and (not isinstance(t, str) or ":" not in t)]
        return [] if not bad else [f"env.tools entries must look like package.module:function, got {bad}"]


@dataclass
class LoraConfig(Section):
    r: int = _f(0, "LoRA rank on an hf model (0 = no adapter: train every weight)", ge=0)
    alpha: float = _f(32.0, "LoRA alpha (the update is scaled by alpha / r)", gt=0)
    dropout: float = _f(0.0, "LoRA dropout", ge=0, lt=1)
    target_modules: list = _f(["all-linear"], "modules that get an adapter: [all-linear] or names such as "
                                              "[q_proj, k_proj, v_proj, o_proj]")
    peft: dict = _f({}, "further peft.LoraConfig arguments, as peft takes them (use_rslora, use_dora, modules_to_save, "
                        "bias, init_lora_weights, rank_pattern, alpha_pattern, layers_to_transform, ...; what a TRL "
                        "peft_config sets beyond r, alpha, dropout and target_modules)")

    def check(self) -> list[str]:
        given = set(self.peft or {})
        problems = [] if self.target_modules or (self.peft or {}).get("target_parameters") else \
            ["lora.target_modules must name at least one module (or all-linear)"]
        own = sorted(given & {"r", "lora_alpha", "lora_dropout", "target_modules", "task_type"})
        if own:
            problems.append(f"lora.peft sets {', '.join(own)}: use lora.r, lora.alpha, lora.dropout and "
                            f"lora.target_modules (the task type follows the trainer)")
        try:
            from peft import LoraConfig
        except ImportError:  # the hf extra is missing: the model build says so
            return problems
        unknown = sorted(given - {f.name for f in fields(LoraConfig)})
        return problems + ([f"lora.peft: {', '.join(unknown)} is not an argument of peft.LoraConfig"] if unknown else [])


@dataclass
class RewardConfig(Section):
    cls: str = _f("", "a custom reward, pkg.module:Class or path/to/file.py:Class, built with no arguments; its "
                      "instance is called as reward(prompts, completions, **columns) -> list of floats, or as "
                      "reward.funcs entries are when its __call__'s signature is TRL's (completions, **kwargs), "
                      "verl's (data_source, solution_str, ground_truth, extra_info) or OpenRLHF's (queries, "
                      "prompts, labels); a function goes in reward.funcs")
    funcs: list = _f([], "reward functions, each pkg.module:function or path/to/file.py:function (a class there is "
                         "built with no arguments): as TRL writes them, called f(prompts=, completions=, "
                         "completion_ids=, trainer_state=, **columns) -> a float or None (not applicable) per "
                         "completion; verl's compute_score(data_source, solution_str, ground_truth, extra_info) "
                         "and OpenRLHF's reward_func(queries, prompts, labels) as they are; their weighted sum "
                         "replaces the task's reward")
    weights: list = _f([], "one weight per reward.funcs entry (empty: 1.0 each)")
    funcs_timeout_s: float = _f(300.0, "seconds one reward function (reward.funcs, reward.cls, reward_funcs=) may "
                                       "take on a batch; past it its rewards count as None for that batch and a line "
                                       "says so (the call runs on in a background thread); 0 = no limit, called in "
                                       "the trainer's thread as TRL calls them", ge=0)
    format_weight: float = _f(0.0, "math: reward for a well-formed <think>...</think> <answer>...</answer>")
    correct_weight: float = _f(1.0, "math: reward for a correct answer (checked with math-verify)")
    require_format: bool = _f(True, "math: a correct answer counts only when well-formed")
    timeout_s: float = _f(5.0, "math: seconds one answer check may take before it scores 0", gt=0)
    model: str = _f("", "a reward model dir (what run.trainer=reward writes to <run dir>/reward_model, or any "
                        "AutoModelForSequenceClassification); its score of prompt + completion is the reward")
    model_batch_size: int = _f(16, "completions the reward model scores per forward pass", ge=1)
    clip: list = _f([], "RL: [low, high]: each reward (each token's, for per-token rewards) clamped to it before "
                        "the update uses it, the KL in the reward subtracted after (OpenRLHF's --reward_clip_range); "
                        "the logged rewards and evaluation stay unclamped; [] = not clamped")

    def check(self) -> list[str]:
        bad_funcs = [f for f in self.funcs if not isinstance(f, str) or ":" not in f]
        numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in self.clip)
        bad_weights = [w for w in self.weights
                       if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w)]
        return [msg for ok, msg in [
            (sum(map(bool, (self.model, self.cls, self.funcs))) <= 1,
             "set one of reward.model, reward.cls and reward.funcs"),
            (not self.cls or ":" in self.cls, f"reward.cls={self.cls!r} must look like package.module:ClassName"),
            (not bad_funcs, f"reward.funcs entries must look like package.module:function or "
                            f"path/to/file.py:function, got {bad_funcs}"),
            (not bad_weights, f"reward.weights must be finite numbers, got {bad_weights}"),
            (not self.weights or len(self.weights) == len(self.funcs),
             f"reward.weights has {len(self.weights)} weights for {len(self.funcs)} reward.funcs; "
             f"give one per function (or none: 1.0 each)"),
            (not self.clip or (len(self.clip) == 2 and numbers and self.clip[0] < self.clip[1]),
             f"reward.clip must be [low, high], two finite numbers with low < high (or [] for no clamp), "
             f"got {self.clip}"),
        ] if not ok]


@dataclass
class SFTConfig(Section):
    steps: int = _f(0, "warm-up steps (0 = no warm-up)", ge=0)
    examples: int = _f(0, "distinct labeled problems the warm-up may see", ge=0)
    batch_size: int = _f(256, "warm-up batch size (summed over ranks)", ge=1)
    lr: float = _f(1e-3, "warm-up peak learning rate (cosine decay to sft.min_lr_ratio)", ge=0)
    min_lr_ratio: float = _f(0.1, "floor of the warm-up's cosine as a fraction of sft.lr", ge=0, le=1)
    weight_decay: float = _f(0.01, "warm-up AdamW weight decay", ge=0)
    warmup_steps: int = _f(0, "linear LR warm-up steps of the warm-up stage", ge=0)
    # run.trainer=sft's loss (RL's warm-up keeps the plain cross-entropy on its answer tokens)
    loss_type: str = _f("nll", "run.trainer=sft: nll (cross-entropy) | dft (Dynamic Fine-Tuning: each token's "
                               "cross-entropy weighted by its detached probability, TRL's loss_type=dft)",
                        choices=("nll", "dft"))
    completion_only_loss: bool = _f(True, "run.trainer=sft: a prompt/completion row's loss on its completion only "
                                          "(false: on the prompt too, TRL's completion_only_loss=False)")
    assistant_only_loss: bool = _f(True, "run.trainer=sft: a conversation's loss on its assistant turns only (false: "
                                         "on every token the chat template renders, TRL's default)")
    label_smoothing: float = _f(0.0, "run.trainer=sft, loss_type=nll: label smoothing epsilon, as transformers' "
                                     "LabelSmoother (TRL's label_smoothing_factor)", ge=0, lt=1)
    neftune_noise_alpha: float = _f(0.0, "run.trainer=sft: NEFTune, uniform noise of scale alpha / sqrt(T * d) on "
                                         "the input embeddings while training, as transformers adds it (0 = off)",
                                    ge=0)

    def check(self) -> list[str]:
        return [msg for ok, msg in [
            (self.label_smoothing == 0 or self.loss_type == "nll",
             f"sft.label_smoothing={self.label_smoothing} smooths the nll loss; sft.loss_type={self.loss_type} takes "
             f"none (TRL ignores label_smoothing_factor with dft)"),
        ] if not ok]


@dataclass
class DataConfig(Section):
    """The offline trainers' data (run.trainer = sft | dpo | reward)."""
    train_file: str | None = _f(None, "JSONL or parquet rows to train on: sft {prompt, response|completion} or "
                                      "{messages}; dpo and reward {prompt|messages, chosen, rejected} (other column "
                                      "names: data.*_key)")
    eval_file: str | None = _f(None, "held-out JSONL or parquet rows in the same format, evaluated every "
                                     "train.eval_every steps")
    generate: str = _f("", "when train_file / eval_file do not exist, write them first: preferences (synthetic "
                           "pairs) | preferences-sft (their chosen side as SFT rows) | sql-demos (the SQL agent's "
                           "solved episodes, played in the sql section) (empty: never)",
                       choices=("", *generators_for("data")))
    generate_train: int = _f(600, "rows data.generate writes to train_file (the synthetic preference set has ~750 "
                                  "items)", ge=1)
    generate_test: int = _f(100, "rows data.generate writes to eval_file", ge=1)
    max_length: int = _f(256, "tokens per prompt + response; longer rows are cut and counted (a pair's prompt's "
                              "start first; an SFT row as data.truncation_mode says)", ge=2)
    batch_size: int = _f(16, "rows (pairs) per optimizer step, summed over ranks and accumulation micro-batches", ge=1)
    epochs: float = _f(1.0, "passes over train_file when train.max_steps is 0", gt=0)
    chat: bool = _f(True, "hf: put a plain-text prompt in the tokenizer's chat template as a user message")
    eval_size: int = _f(0, "held-out rows evaluated (0 = all of eval_file)", ge=0)
    # where the rows hold their fields (TRL's names by default; a dotted name reaches into a nested object)
    prompt_key: str = _f("prompt", "the column of each row's prompt, a text or {role, content} messages: sft's "
                                   "prompt/response rows, a dpo or reward pair's prompt (renamed, every pair needs it "
                                   "or messages_key; by default a pair without one shares its prompt between its "
                                   "replies) (verl's data.prompt_key, OpenRLHF's --input_key / --prompt_key)")
    response_key: str = _f("response", "sft: the column of a prompt/response row's response (the default reads TRL's "
                                       "completion too) (verl's data.response_key, OpenRLHF's --output_key)")
    messages_key: str = _f("messages", "the column of a conversation: sft's row, or a dpo or reward pair's prompt "
                                       "(verl's data.multiturn.messages_key)")
    chosen_key: str = _f("chosen", "dpo, reward: the column of a pair's preferred reply (OpenRLHF's --chosen_key)")
    rejected_key: str = _f("rejected", "dpo, reward: the column of a pair's dispreferred reply (OpenRLHF's "
                                       "--rejected_key)")
    # how SFT rows become sequences (run.trainer=sft)
    text_field: str = _f("text", "sft: the column a language-modelling row's text is read from (TRL's "
                                 "dataset_text_field)")
    truncation_mode: str = _f("keep_start", "sft: how a row longer than max_length is cut: keep_start (a conversation "
                                            "or text keeps its start; a prompt/completion row loses its prompt's start "
                                            "first, then its completion's end) | keep_end (every row keeps its last "
                                            "max_length tokens)", choices=TRUNCATION_MODES)
    packing: bool = _f(False, "sft: pack rows into sequences of up to max_length tokens, each row's positions "
                              "restarting at 0 so no row attends to another (hf models)")
    packing_strategy: str = _f("bfd", "sft, with data.packing: bfd (best-fit decreasing; a row is cut as "
                                      "truncation_mode says) | bfd_split (an over-long row is split into pieces packed "
                                      "on their own) | wrapped (the rows' tokens end to end, cut every max_length, "
                                      "attention crossing rows, as TRL's)", choices=PACKING_STRATEGIES)
    padding_free: bool = _f(False, "sft: each micro-batch as one row of all its rows' tokens, positions restarting "
                                   "per row: no pad tokens (hf models; packed rows are laid out so anyway where the "
                                   "attention is not sdpa or eager, e.g. flash attention)")

    def check(self) -> list[str]:
        columns = {k: getattr(self, k) for k in ("prompt_key", "response_key", "messages_key", "chosen_key",
                                                 "rejected_key", "text_field")}
        return [msg for ok, msg in [
            (self.packing or self.packing_strategy == "bfd",
             f"data.packing_strategy={self.packing_strategy} says how to pack: set data.packing=true too"),
            *((bool(name.strip()), f"data.{key} must name a column of the rows (got {name!r})")
              for key, name in columns.items()),
            (self.chosen_key != self.rejected_key,
             f"data.chosen_key and data.rejected_key both name {self.chosen_key!r}; a pair's two replies are two "
             f"columns"),
        ] if not ok]


@dataclass
class DPOConfig(Section):
    beta: float = _f(0.1, "beta: how far the policy may move from the reference (implicit reward scale)", gt=0)
    loss_type: str = _f("sigmoid", "sigmoid (DPO) | ipo | hinge | robust (rDPO)", choices=DPO_LOSS_TYPES)
    label_smoothing: float = _f(0.0, "sigmoid (conservative DPO; TRL's sigmoid ignores it) and robust: the chance a "
                                     "pair's label is flipped, in [0, 0.5)", ge=0, lt=0.5)
    ipo_length_normalize: bool = _f(True, "ipo: each response's log-ratio averaged over its tokens, as TRL and the IPO "
                                          "authors (false: summed, as the IPO paper's formula reads)")

    def check(self) -> list[str]:
        return [] if self.label_smoothing == 0 or self.loss_type in SMOOTHED_DPO_LOSSES else [
            f"dpo.label_smoothing is for loss_type {' or '.join(SMOOTHED_DPO_LOSSES)}, not {self.loss_type}"]


@dataclass
class AlgoConfig(Section):
    name: str = _f("reinforce", "RL algorithm: reinforce | rloo | grpo | ppo | reinforce_plus_plus | "
                                    "reinforce_plus_plus_baseline | remax, or one registered with "
                                    "lmrl.algos.register_algorithm. reinforce is REINFORCE with a moving-average "
                                    "baseline; reinforce_plus_plus is REINFORCE++ (OpenRLHF's reinforce): returns of "
                                    "the KL-shaped token rewards whitened over the batch's tokens; remax is ReMax "
                                    "(verl's remax): those returns minus the reward of the prompt's greedy completion",
                   choices=ALGORITHMS)
    baseline_decay: float = _f(0.9, "reinforce: moving-average baseline b <- decay*b + (1-decay)*mean reward",
                               ge=0, lt=1)
    group_size: int = _f(1, "completions sampled per prompt (G); rloo, grpo (but for adv_mode=raw) and "
                            "reinforce_plus_plus_baseline need >= 2", ge=1)
    adv_mode: str = _f("grpo", "grpo group advantage: raw (A=r) | grpo ((r-mean)/(std+eps)) | grpo_no_std (r-mean) | "
                               "passk (only the group's best: (r_max-r_second)/(std+eps), verl's grpo_passk) | opo "
                               "(r minus the group's length-weighted mean reward) | gpg (r-mean, times B over the "
                               "completions in groups whose rewards differ)", choices=GROUP_MODES)
    adv_eps: float = _f(1e-4, "eps in the grpo advantage's denominator (TRL's 1e-4; verl's 1e-6, OpenRLHF's "
                              "group_norm 1e-9)", gt=0)
    scale_rewards: str = _f("group", "grpo advantage's divisor, as TRL: group (each prompt's reward std) | batch (the "
                                     "whole batch's std) | none (no division, Dr. GRPO)", choices=SCALE_REWARDS)
    normalize_advantages: bool | None = _f(None, "whiten advantages over every rank's batch (mean 0, std 1); null: the "
                                                 "algorithm's own choice: ppo whitens (as verl, OpenRLHF and TRL "
                                                 "whiten PPO's advantages), reinforce_plus_plus always whitens "
                                                 "its returns, grpo and rloo do not")
    normalize_advantages_std: bool = _f(True, "whitening (algo.normalize_advantages, and reinforce_plus_plus's) divides "
                                              "by the batch std; false: it only subtracts the mean (OpenRLHF's "
                                              "--no_advantage_std_norm)")
    clip_range_left: float = _f(0.2, "ratio clipped below at 1 - clip_range_left", ge=0, lt=1)
    clip_range_right: float = _f(0.2, "ratio clipped above at 1 + clip_range_right (DAPO's clip-higher: 0.28)", ge=0)
    ratio_level: str = _f("token", "what one clipped ratio covers, as TRL's importance_sampling_level: token | "
                                   "sequence (GSPO: exp of the mean token log-ratio, one per completion) | "
                                   "sequence_token (GSPO-token: the completion's ratio with each token's gradient) | "
                                   "sequence_sum (TRL's RLOOTrainer: exp of the summed token log-ratios, the ratio "
                                   "of the completion's probabilities, one per completion)",
                          choices=RATIO_LEVELS)
    clip_ratio_max: float | None = _f(None, "INTELLECT-2's two-sided clipping (TRL's delta): the unclipped term's "
                                            "ratio is capped at this, > 1 + clip_range_right (null = no cap)")
    loss_level: str = _f("token", "loss aggregation: token (mean over all valid tokens) | sequence (mean per "
                                  "sequence, then over sequences) | constant (sum / (B * loss_constant), Dr. GRPO)",
                         choices=LOSS_LEVELS)
    loss_constant: float = _f(0.0, "normaliser for loss_level=constant (0 = the completion length budget)", ge=0)
    ppo_epochs: int = _f(1, "passes over each rollout batch", ge=1)
    minibatch_size: int = _f(0, "completions per optimizer step within a pass (0 = the whole rollout)", ge=0)
    kl_coef: float = _f(0.0, "beta: weight of KL(policy || reference); > 0 makes a frozen reference (with LoRA: "
                              "the policy with its adapter off)", ge=0)
    kl_estimator: str = _f("k3", "KL estimator: k1 | k2 | k3", choices=KL_ESTIMATORS)
    kl_clamp: float | None = _f(None, "bound each token's KL estimate to [-kl_clamp, kl_clamp] (verl's low_var_kl: 10; "
                                      "null = unbounded, as TRL)", gt=0)
    kl_in_reward: bool = _f(False, "subtract beta*KL from the reward (PPO/RLHF style) instead of adding it to the loss")
    kl_ratio_weighted: bool = _f(False, "weight the loss's per-token KL by the importance ratio (at algo.ratio_level) so "
                                        "its gradient is the unbiased reverse-KL one (DeepSeek-V3.2; TRL's "
                                        "use_bias_correction_kl)")
    kl_target: float = _f(0.0, "adaptive KL: the KL summed over a completion's tokens that the coefficient steers "
                               "towards, a per-completion sum (verl's and OpenRLHF's target is a per-token mean) "
                               "(0 = fixed beta)", ge=0)
    kl_horizon: int = _f(10000, "adaptive KL: horizon (in completions) of the coefficient's adjustment", ge=1)
    ent_coef: float = _f(0.0, "entropy bonus weight")
    skip_zero_advantage: bool = _f(True, "leave completions whose advantage is 0 (a GRPO group that scored alike) out "
                                         "of the update's forward/backward pass: the gradient is the same, unless "
                                         "KL in the loss, ent_coef or a value model make every completion count")
    value_model: str = _f("none", "ppo value function: none | head (on the policy's trunk) | separate (own network)",
                          choices=("none", *VALUE_MODELS))
    vf_coef: float = _f(0.5, "ppo value loss weight", ge=0)
    critic_lr: float | None = _f(None, "ppo: the value function's peak learning rate, on the policy's schedule (its "
                                       "parameters are an optimizer group of their own, clipped to train.grad_clip "
                                       "on their own, as verl's critic.optim.lr and OpenRLHF's "
                                       "--critic_learning_rate; null: optim.lr)", gt=0)
    value_clip: float = _f(0.2, "ppo value clipping range (0 = off)", ge=0)
    gamma: float = _f(1.0, "discount of ppo's GAE and of reinforce_plus_plus's and remax's returns", ge=0, le=1)
    lam: float = _f(0.95, "ppo GAE lambda", ge=0, le=1)
    dynamic_sampling: bool = _f(False, "DAPO's dynamic sampling (verl's algorithm.filter_groups, OpenRLHF's "
                                       "--dynamic_filtering): keep only the groups whose rewards differ, sampling "
                                       "more batches of prompts until train.rollout_size completions of them are "
                                       "kept (groups that tied fill the batch once algo.max_sample_batches are "
                                       "sampled); needs algo.group_size > 1")
    max_sample_batches: int = _f(10, "algo.dynamic_sampling: the most batches one step samples (verl's "
                                     "filter_groups.max_num_gen_batches)", ge=1)
    mask_truncated_completions: bool = _f(False, "leave completions cut off at the length limit (no end of sequence; "
                                                 "an agent episode: the turn or context limit) out of the loss (DAPO); "
                                                 "they still count in their group's reward statistics")
    top_entropy_quantile: float = _f(1.0, "train on the completion tokens whose entropy is in this top fraction of "
                                          "the micro-batch's (Beyond the 80/20 rule: 0.2; TRL's top_entropy_quantile; "
                                          "1 = every token)", ge=0, le=1)
    off_policy_mask_threshold: float | None = _f(None, "leave out of the policy loss the completions with a negative "
                                                       "advantage whose mean log pi_old - log pi over their tokens "
                                                       "exceeds this (DeepSeek-V3.2; TRL's off_policy_mask_threshold; "
                                                       "null = off)", gt=0)

    def check(self) -> list[str]:
        """The algorithm's own requirements (`Algorithm.check_config`), then the KL's and the ratio cap's."""
        own = ALGORITHMS[self.name].check_config(self)
        cap, ceiling = self.clip_ratio_max, 1 + self.clip_range_right
        return own + [msg for ok, msg in [
            (self.kl_target == 0 or self.kl_coef > 0,
             "algo.kl_target > 0 (adaptive KL) needs an initial algo.kl_coef > 0"),
            (cap is None or cap > ceiling, f"algo.clip_ratio_max={cap} must be > 1 + algo.clip_range_right = "
                                           f"{ceiling:g}: it caps the ratio above the clip (TRL's delta)"),
            (not (self.kl_ratio_weighted and self.kl_in_reward),
             "algo.kl_ratio_weighted weights the KL in the loss; algo.kl_in_reward puts it in the reward: set one"),
            (not self.dynamic_sampling or self.group_size > 1,
             f"algo.dynamic_sampling keeps the groups whose rewards differ: it needs algo.group_size > 1, got "
             f"{self.group_size}"),
        ] if not ok]


@dataclass
class OptimConfig(Section):
    lr: float = _f(1e-4, "peak learning rate (RL, and the offline trainers)", ge=0)
    weight_decay: float = _f(0.01, "AdamW weight decay", ge=0)
    betas: list = _f([0.9, 0.99], "AdamW betas [beta1, beta2]")
    eps: float = _f(1e-8, "AdamW epsilon", gt=0)

    def check(self) -> list[str]:
        ok = len(self.betas) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                                          for b in self.betas)
        return [] if ok else [f"optim.betas must be two numbers in [0, 1), got {self.betas}"]


@dataclass
class ScheduleConfig(Section):
    name: str = _f("constant", "LR schedule: constant | linear | cosine (warm-up, decay to the floor) | "
                               "wsd (warm-up, the peak held, decay over the last schedule.decay_steps) | "
                               "plateau (drop on a stalled eval metric, see train.best_metric)", choices=SCHEDULES)
    warmup_steps: int = _f(0, "linear LR warm-up steps", ge=0)
    min_lr_ratio: float = _f(0.1, "floor of cosine, linear, wsd and plateau as a fraction of the peak LR", ge=0, le=1)
    decay_steps: int = _f(0, "wsd: the steps of its final decay to the floor (>= 1 with schedule.name=wsd)", ge=0)
    decay_shape: str = _f("cosine", "wsd: the final decay's shape: cosine | linear | 1-sqrt", choices=DECAY_SHAPES)
    plateau_factor: float = _f(0.5, "plateau: the LR is multiplied by this when the eval metric stops improving",
                               gt=0, lt=1)
    plateau_patience: int = _f(2, "plateau: evaluations without improvement before the LR drops", ge=1)

    def check(self) -> list[str]:
        return [] if self.name != "wsd" or self.decay_steps >= 1 else [
            "schedule.name=wsd decays over its last schedule.decay_steps steps: set schedule.decay_steps >= 1"]


@dataclass
class TrainConfig(Section):
    steps: int = _f(200, "RL updates (run.trainer=rl; the offline trainers count train.max_steps)", ge=0)
    max_steps: int = _f(0, "offline trainers (sft, dpo, reward): optimizer steps (0 = data.epochs passes over "
                           "data.train_file)", ge=0)
    rollout_size: int = _f(256, "completions sampled per update (summed over ranks)", ge=1)
    temperature: float = _f(1.0, "sampling temperature", gt=0)
    top_k: int = _f(0, "sample from the k most likely tokens (0 = off)", ge=0)
    top_p: float = _f(1.0, "nucleus sampling: sample from the most likely tokens whose probabilities sum to top_p "
                           "(1 = off)", gt=0, le=1)
    min_p: float = _f(0.0, "min-p sampling: drop the tokens whose probability is below min_p times the most "
                           "likely token's, after temperature, top_k and top_p (0 = off)", ge=0, le=1)
    repetition_penalty: float = _f(1.0, "divide the positive logits (multiply the negative ones) of every token "
                                        "already in the prompt or the completion by this, before temperature "
                                        "(1 = off; > 1 discourages repeats, < 1 encourages them)", gt=0)
    disable_dropout: bool = _f(True, "RL: the policy samples and learns with its dropout layers off, so the learner "
                                     "scores what was sampled (model.dropout then regularises the warm-up only)")
    ga_steps: int = _f(1, "gradient-accumulation micro-batches per update", ge=1)
    grad_clip: float = _f(1.0, "max gradient norm (0 = off)", ge=0)
    log_every: int = _f(10, "log metrics every N steps", ge=1)
    log_completions: bool = _f(False, "RL: at every step that logs its metrics, append the step's completions to "
                                      "<run dir>/completions.jsonl (prompt, completion, reward, each reward "
                                      "function's reward, advantage, the functions' log_extra columns) and, with "
                                      "run.wandb, log them as the table 'completions' (TRL's log_completions)")
    completions_to_print: int = _f(0, "RL, with train.log_completions: print this many of each logged step's "
                                      "completions to the console and train.log (0 = none)", ge=0)
    eval_every: int = _f(50, "held-out evaluation every N steps (RL updates, or the offline trainers' optimizer "
                             "steps)", ge=1)
    evaluate: bool = _f(True, "offline trainers: evaluate the held-out rows during the run (every train.eval_every "
                              "steps and after the last); false: only when asked (TRL's eval_strategy=no)")
    ckpt_every: int = _f(50, "checkpoint every N steps", ge=1)
    keep_checkpoints: int = _f(2, "step checkpoints kept (0 = all)", ge=0)
    max_nonfinite: int = _f(5, "consecutive NaN/inf losses that stop the run", ge=1)
    patience: int = _f(0, "early stopping: evaluations without improvement of train.best_metric before the run "
                          "stops (0 = never)", ge=0)
    early_stop_threshold: float = _f(0.0, "early stopping: an evaluation improves when it beats the best by more than this",
                                     ge=0)
    stopping_threshold: float | None = _f(None, "early stopping: stop once an evaluation's train.best_metric reaches "
                                                "this value (at or above it; at or below for a loss) (null = never)")
    best_metric: str = _f("", "eval metric that picks checkpoints/best, early stopping and the plateau schedule "
                              "(empty: eval/accuracy; eval/loss for SFT; eval/reward for a task with no verifier, "
                              "such as prompts; a name holding 'loss' is minimised, others maximised)")
    time_limit_min: float = _f(0.0, "stop training (RL after its warm-up, or an offline trainer) once the run's "
                                    "wall time reaches this many minutes, then evaluate and save as at the last "
                                    "step (0 = no limit)", ge=0)
    ema_decay: float = _f(0.0, "evaluate, keep as best and export an exponential moving average of the trained "
                               "weights, avg = decay * avg + (1 - decay) * weights after every update, while the "
                               "weights themselves train and sample (0 = off: the weights themselves; RL's "
                               "warm-up is never averaged)", ge=0, lt=1)
    replay_fraction: float = _f(0.0, "RL: this fraction of each batch's prompts is drawn again from the last "
                                     "train.replay_size training prompts the policy got wrong, the rest uniformly "
                                     "(0 = off; one process only)", ge=0, lt=1)
    replay_size: int = _f(1024, "RL: how many recently failed training prompts train.replay_fraction draws from", ge=1)
    prompt_order: str = _f("shuffled", "RL: how a task with a training set of rows draws its prompts: shuffled (every "
                                       "row once per epoch, in an order drawn per epoch, as TRL's, verl's and "
                                       "OpenRLHF's samplers), in_order (the data set's order, epoch after epoch; "
                                       "TRL's shuffle_dataset=False), random (uniformly with replacement); a task "
                                       "that generates its problems (arithmetic) draws at random",
                           choices=("shuffled", "in_order", "random"))

    def check(self) -> list[str]:
        return [msg for ok, msg in [
            (self.rollout_size % self.ga_steps == 0,
             f"train.rollout_size={self.rollout_size} must be divisible by train.ga_steps={self.ga_steps}"),
            (self.best_metric == "" or self.best_metric.startswith("eval/"),
             f"train.best_metric must name an eval metric (eval/...), got {self.best_metric!r}"),
            (self.completions_to_print == 0 or self.log_completions,
             f"train.completions_to_print={self.completions_to_print} prints logged completions: set "
             f"train.log_completions=true too"),
        ] if not ok]


@dataclass
class EvalConfig(Section):
    size: int = _f(1000, "held-out problems evaluated", ge=1)
    batch_size: int = _f(500, "evaluation batch size", ge=1)


@dataclass
class RolloutConfig(Section):
    engine: str = _f("local", "what samples completions: local (the policy's own KV-cache loop) | vllm (an HF "
                              "policy served by vLLM; the learner recomputes log-probs; needs the vllm extra)",
                     choices=ENGINES)
    workers: int = _f(0, "Ray rollout workers, each with its own copy of the policy (0 = sample in the "
                         "learner's process; needs distributed.backend=ray)", ge=0)
    overlap: bool = _f(False, "sample the next batch while the learner trains on this one (one step off-policy; "
                              "staleness in rollout/staleness)")
    worker_gpus: float = _f(0.0, "GPUs per rollout worker (a fraction shares one: 0.5 + learner 0.5 = colocated)", ge=0)
    worker_cpus: float = _f(1.0, "CPUs per rollout worker", ge=0)
    timeout_s: float = _f(600.0, "a rollout not back in this many seconds counts as a failed worker", gt=0)
    max_restarts: int = _f(1, "times a dead or stuck rollout worker is replaced and its batch retried before "
                              "the run stops (its last checkpoint intact)", ge=0)
    gpu_memory_utilization: float = _f(0.4, "vllm: fraction of the GPU the engine may take (the learner needs the rest "
                                            "when colocated)", gt=0, le=1)
    max_model_len: int = _f(0, "vllm: longest prompt + completion (0 = the model's own limit)", ge=0)


@dataclass
class DistributedConfig(Section):
    backend: str = _f("torch", "torch (one process, or torchrun's process group when launched by torchrun) | "
                               "ray (rollout workers and the learner as Ray actors)", choices=("torch", "ray"))
    strategy: str = _f("ddp", "how torchrun ranks share the model: ddp (a full copy each) | fsdp (parameters, "
                              "gradients and optimizer state sharded; HF policies)", choices=("ddp", "fsdp"))
    address: str = _f("", "ray: cluster address (empty = start a local Ray; 'auto' = the cluster this node is in)")
    connect_timeout_s: float = _f(60.0, "ray: give up connecting to distributed.address after this many seconds", gt=0)
    learner_gpus: float = _f(0.0, "ray: GPUs for the learner actor (0 on a CPU machine; 0.5 with rollout.worker_gpus=0.5 "
                                  "shares one GPU)", ge=0)
    learner_cpus: float = _f(1.0, "ray: CPUs for the learner actor", ge=0)


class ConfigBase:
    """What every config shares; `Config` is this with one field per section (see `_config_class`)."""

    # One line per TRL name `lmrl.config.load_config` translated (not a field: never saved or compared)
    aliases: ClassVar[tuple[str, ...]] = ()

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir or f"runs/{self.run.name}")

    def problems(self) -> list[str]:
        """The first section's problems that has any, else the rules that join sections (which
        may then divide by any size and look up any choice)."""
        for f in fields(self):
            found = getattr(self, f.name).problems(f.name)
            if found:
                return found
        return cross_section_problems(self)


def _config_class() -> type:
    """The config: lmrl's sections, and after `env` the sections registered environments and tasks
    declare for their own options (e.g. `sql`, the SQL agent's)."""
    core = [("run", RunConfig), ("model", ModelConfig), ("task", TaskConfig), ("lora", LoraConfig), ("env", EnvConfig)]
    declared = {s.section: s.options for s in list(ENVS.values()) + list(TASKS.values())
                if getattr(s, "options", None) is not None}
    rest = [("data", DataConfig), ("dpo", DPOConfig), ("reward", RewardConfig), ("sft", SFTConfig), ("algo", AlgoConfig),
            ("optim", OptimConfig), ("schedule", ScheduleConfig), ("train", TrainConfig), ("eval", EvalConfig),
            ("rollout", RolloutConfig), ("distributed", DistributedConfig)]
    taken = {name for name, _ in core + rest}
    clash = sorted(set(declared) & taken)
    if clash:
        raise ValueError(f"a registered environment or task declares section {clash[0]!r}, which is lmrl's own")
    sections = core + sorted(declared.items()) + rest
    config = make_dataclass("Config", [(name, cls, field(default_factory=cls)) for name, cls in sections],
                            bases=(ConfigBase,))
    config.__module__ = __name__  # where pickle (Ray, deepcopy) finds it
    return config


Config = _config_class()


# -- rules that join sections ------------------------------------------------------------------------
def cross_section_problems(cfg: Config) -> list[str]:
    """What `run.trainer` needs of the other sections: an RL run its task's model, data and budget,
    its algorithm's batch shape and its rollout engine; an offline run its data and model."""
    common = [(cfg.lora.r == 0 or cfg.model.type == "hf", "lora.r > 0 needs an hf model (model.type=hf)"),
              (not cfg.run.resume_from or cfg.run.resume == "auto",
               f"run.resume_from={cfg.run.resume_from} resumes a run: set run.resume=auto too "
               f"(--resume_from_checkpoint PATH sets both)")]
    sft_only = _sft_only_problem(cfg)
    common.append((sft_only is None, sft_only))
    if cfg.run.trainer != "rl":
        rules = common + _offline_rules(cfg)
    else:
        steps = cfg.train.max_steps
        common.append((steps == TrainConfig.max_steps, f"train.max_steps={steps} counts the offline trainers' "
                                                       f"optimizer steps; run.trainer=rl counts RL updates in train.steps"))
        common.append((cfg.train.evaluate, "train.evaluate=false leaves the offline trainers' held-out rows until asked; "
                                            "an RL run evaluates at its start and end: make eval.size small instead"))
        split = batch_split_problem(cfg)
        rules = _task_rules(cfg) + common + [(split is None, split)] + _scale_rules(cfg)
    sched, steps = cfg.schedule, cfg.train.steps if cfg.run.trainer == "rl" else cfg.train.max_steps
    rules.append((sched.name != "wsd" or not steps or sched.warmup_steps + sched.decay_steps <= steps,
                  f"schedule.warmup_steps={sched.warmup_steps} and schedule.decay_steps={sched.decay_steps} add up to "
                  f"more than the run's {steps} steps"))
    rules.append((cfg.distributed.strategy != "fsdp" or cfg.train.ema_decay == 0,
                  f"train.ema_decay={cfg.train.ema_decay} averages whole weights, which FSDP holds in shards: set "
                  f"train.ema_decay=0 or distributed.strategy=ddp"))
    return [msg for ok, msg in rules if not ok] or (task_spec(cfg.task.name).problems(cfg)
                                                    if cfg.run.trainer == "rl" else [])


def _task_rules(cfg: Config) -> list[tuple[bool, str]]:
    """What the task's traits ask of the run (its own rules, `TaskSpec.check`, follow once these hold)."""
    t, spec = cfg.task, task_spec(cfg.task.name)
    model = {"gpt": "the built-in GPT (model.type=gpt)", "hf": "a Hugging Face model: set model.type=hf and model.path"}
    return [
        (cfg.model.type == spec.model, f"task.name={t.name} needs {model[spec.model]}, got model.type={cfg.model.type}"),
        (cfg.sft.steps == 0 or spec.labeled, f"sft.steps > 0: the supervised warm-up needs labeled problems, which "
                                             f"task.name={t.name} has not (set sft.steps=0)"),
        (cfg.sft.steps == 0 or cfg.sft.examples > 0, "sft.steps > 0 needs sft.examples > 0 (the label budget)"),
        (not cfg.env.tools or spec.tools, f"env.tools answer a prompt task's prompts (task.name=prompts); "
                                          f"task.name={t.name} does not take them"),
        (not cfg.reward.model or spec.needs_reward,
         f"reward.model scores tasks without a verifier of their own (task.name="
         f"{' | '.join(n for n, s in TASKS.items() if s.needs_reward)}); task.name={t.name} is scored by its own "
         f"verifier, which reward.funcs or reward.cls replace"),
    ]


def batch_split_problem(cfg: Config, world_size: int = 1) -> str | None:
    """The line saying a step's rows do not split evenly over `world_size` processes, or None: an RL
    rollout (run.trainer=rl) must give each process whole groups of algo.group_size, an offline batch
    each process train.ga_steps equal micro-batches. The config checks one process, a trainer its
    process group."""
    where = f" on each of {world_size} processes" if world_size > 1 else ""
    if cfg.run.trainer == "rl":
        t, a = cfg.train, cfg.algo
        ok = t.rollout_size % (world_size * a.group_size) == 0
        return None if ok else (f"train.rollout_size={t.rollout_size} must split into whole groups of "
                                f"algo.group_size={a.group_size}{where}")
    d, ga = cfg.data, cfg.train.ga_steps
    ok = d.batch_size % (world_size * ga) == 0
    return None if ok else f"data.batch_size={d.batch_size} must split into train.ga_steps={ga} micro-batches{where}"


def _offline_rules(cfg: Config) -> list[tuple[bool, str]]:
    """run.trainer = sft | dpo | reward: a model and the trainer's own options (its rows, files or a data set
    handed in, are checked by the trainer)."""
    d, m, trainer = cfg.data, cfg.model, cfg.run.trainer
    steps = cfg.train.steps
    generator, split = GENERATORS.get(d.generate), batch_split_problem(cfg)
    return [
        (steps == TrainConfig.steps, f"train.steps={steps} counts RL updates; run.trainer={trainer} counts optimizer "
                                     f"steps in train.max_steps (0 = data.epochs passes): set train.max_steps={steps}"),
        (trainer != "reward" or m.type == "hf", "run.trainer=reward trains a Hugging Face model: set model.type=hf "
                                                "and model.path"),
        (not cfg.train.log_completions, f"train.log_completions logs the completions RL samples; run.trainer={trainer} "
                                        f"samples none (set train.log_completions=false)"),
        (not cfg.reward.model, f"reward.model scores RL completions; run.trainer={trainer} does not read it (its model "
                               f"is model.path)"),
        (split is None, split),
        (m.type == "hf" or not (d.padding_free or (d.packing and d.packing_strategy != "wrapped")),
         f"data.{'padding_free' if d.padding_free else 'packing'}=true restarts positions inside a row, which the "
         f"built-in GPT does not take (it counts positions from each row's start): use data.packing_strategy=wrapped "
         f"or an hf model"),
    ] + [(False, problem) for problem in (generator.problems(cfg) if generator is not None else [])]


# the keys only run.trainer=sft reads
SFT_ONLY_KEYS = ("sft.loss_type", "sft.completion_only_loss", "sft.assistant_only_loss", "sft.label_smoothing",
                 "sft.neftune_noise_alpha", "data.text_field", "data.response_key", "data.truncation_mode",
                 "data.packing", "data.padding_free")
# the keys only the preference trainers read (run.trainer=dpo, reward)
PAIR_ONLY_KEYS = ("data.chosen_key", "data.rejected_key")


def _sft_only_problem(cfg: Config) -> str | None:
    """The line naming a key only SFT, or only the preference trainers, read, set away from its default
    for another run.trainer; or None."""
    for keys, readers in ((SFT_ONLY_KEYS, ("sft",)), (PAIR_ONLY_KEYS, ("dpo", "reward"))):
        if cfg.run.trainer in readers:
            continue
        for key in keys:
            section, name = key.split(".")
            value = getattr(getattr(cfg, section), name)
            if value != getattr(type(getattr(cfg, section))(), name):
                return (f"{key}={value} is for run.trainer={' or '.join(readers)}; run.trainer={cfg.run.trainer} "
                        f"does not read it" + (" (RL's warm-up trains with the plain cross-entropy)"
                                               if section == "sft" else ""))
    return None


# The keys RL's supervised warm-up reads (run.trainer=rl with sft.steps > 0; nothing else reads them), each
# with the key an RL run and an offline trainer use for the same thing.
WARMUP_KEYS = {"sft.steps": (None, "train.max_steps"), "sft.examples": (None, None),
               "sft.batch_size": (None, "data.batch_size"), "sft.lr": ("optim.lr", "optim.lr"),
               "sft.min_lr_ratio": ("schedule.min_lr_ratio", "schedule.min_lr_ratio"),
               "sft.weight_decay": ("optim.weight_decay", "optim.weight_decay"),
               "sft.warmup_steps": ("schedule.warmup_steps", "schedule.warmup_steps")}
# The sections only the offline trainers read, and the RL key that does the same as one of theirs.
OFFLINE_SECTIONS = {"data": "the offline trainers (run.trainer=sft, dpo, reward)", "dpo": "run.trainer=dpo"}
RL_COUNTERPARTS = {"data.train_file": "task.train_file", "data.eval_file": "task.test_file",
                   "data.prompt_key": "task.prompt_key",
                   "data.generate": "task.generate",
                   "data.max_length": "task.max_new_tokens for completions, task.max_prompt_length for prompts",
                   "data.batch_size": "train.rollout_size", "data.epochs": "train.steps", "data.chat": "task.chat",
                   "data.eval_size": "eval.size"}


def unread_keys(cfg: Config) -> list[str]:
    """The keys `cfg`'s run never reads: an offline trainer's data and dpo sections in an RL run, and the
    warm-up's keys where no warm-up runs (an offline trainer, or sft.steps=0)."""
    if cfg.run.trainer != "rl":
        return list(WARMUP_KEYS)
    offline = [f"{s}.{f.name}" for s in OFFLINE_SECTIONS for f in fields(getattr(cfg, s))]
    return offline + ([k for k in WARMUP_KEYS if k != "sft.steps"] if cfg.sft.steps == 0 else [])


def unread_key_problem(cfg: Config) -> str | None:
    """The line naming a key this run does not read (`unread_keys`), set away from its default, with
    why and the key that does the same here; or None."""
    for key in unread_keys(cfg):
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value == getattr(type(getattr(cfg, section))(), name):
            continue
        if key in WARMUP_KEYS:
            meant = WARMUP_KEYS[key][cfg.run.trainer != "rl"]
            if cfg.run.trainer == "rl":
                return (f"{key}={value} sets the supervised warm-up before RL, which sft.steps=0 skips "
                        + (f"(the RL stage's is {meant})" if meant else "(set sft.steps > 0 to run it)"))
            return (f"{key}={value} sets the supervised warm-up before RL (run.trainer=rl); run.trainer="
                    f"{cfg.run.trainer} runs none" + (f" (its own is {meant})" if meant else ""))
        meant = RL_COUNTERPARTS.get(key)
        return (f"{key}={value} is for {OFFLINE_SECTIONS[section]}; run.trainer=rl does not read it"
                + (f" (an RL run's is {meant})" if meant else ""))
    return None


def _scale_rules(cfg: Config) -> list[tuple[bool, str]]:
    """Rollout engine, Ray workers, overlap and the torchrun strategy (see lmrl.engines.local)."""
    r, d = cfg.rollout, cfg.distributed
    vllm_refusal = None
    if r.engine == "vllm":
        vllm_refusal = vllm_unsupported_reason(task_spec(cfg.task.name), cfg.model.type, workers=r.workers)
    groups = cfg.train.rollout_size // cfg.algo.group_size
    return [
        (r.workers == 0 or d.backend == "ray",
         f"rollout.workers={r.workers} runs rollout workers as Ray actors: set distributed.backend=ray"),
        (d.backend != "ray" or r.workers >= 1, "distributed.backend=ray needs rollout.workers >= 1"),
        (r.workers == 0 or groups >= r.workers,
         f"train.rollout_size={cfg.train.rollout_size} makes {groups} prompt groups, fewer than "
         f"rollout.workers={r.workers}"),
        (vllm_refusal is None, vllm_refusal),
        (r.engine != "vllm" or not cfg.env.tools, "rollout.engine=vllm samples single-turn completions; env.tools "
                                                  "answers prompts over several turns: use rollout.engine=local"),
        (d.strategy != "fsdp" or cfg.model.type == "hf",
         "distributed.strategy=fsdp shards Hugging Face policies (model.type=hf); the built-in GPT uses ddp"),
        (not (r.overlap and cfg.algo.dynamic_sampling),
         "algo.dynamic_sampling samples more batches within a step; rollout.overlap samples the next step's "
         "during this one's update: set one"),
        # a sampler other than the learner's own policy copies its weights, which FSDP holds in shards
        (d.strategy != "fsdp" or (r.engine == "local" and not r.overlap and d.backend == "torch"),
         "distributed.strategy=fsdp samples with the sharded policy itself: it needs rollout.engine=local, "
         "rollout.overlap=false and distributed.backend=torch"),
    ]
