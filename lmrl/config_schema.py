"""The config's sections: one dataclass per YAML section, each field with its default and a help
text. Loading, overrides and validation live in `lmrl.config`, which re-exports everything here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError  # noqa: F401  (re-exported)

PRESET_DIR = Path(__file__).parent / "configs"
PRESET_ALIASES = {"AdderRLConfig": "adder", "MultiplierRLConfig": "multiplier"}
ALGORITHMS = ["reinforce", "rloo", "grpo", "ppo"]
TRAINERS = ["rl", "sft", "dpo", "reward"]


def _f(default, help: str, **kw):
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class RunConfig:
    name: str = _f("adder", "run name; the run dir defaults to runs/<name>")
    trainer: str = _f("rl", "what this config trains: rl (warm-up + RL on a task) | sft | dpo | reward "
                            "(offline trainers over data.train_file)")
    dir: str | None = _f(None, "run directory (default runs/<name>)")
    seed: int = _f(1337, "seed for weights, prompts and sampling")
    device: str = _f("auto", "auto | cpu | cuda | cuda:N")
    resume: str = _f("never", "never | auto (continue from the latest checkpoint in the run dir)")
    wandb: bool = _f(False, "log to Weights & Biases (needs the wandb extra)")
    wandb_project: str = _f("lmrl", "Weights & Biases project")
    wandb_mode: str = _f("offline", "online | offline")
    tensorboard: bool = _f(True, "write TensorBoard events to <run dir>/tb")
    progress: bool = _f(True, "show a progress bar")
    threads: int = _f(0, "torch CPU threads (0 = torch's default)")


@dataclass
class ModelConfig:
    type: str = _f("gpt", "gpt (the built-in GPT) | hf (a transformers causal LM, see model.path)")
    path: str | None = _f(None, "hf: a local model directory, a directory holding model.gguf_file, or a "
                                "packaged name (smollm2-135m-instruct)")
    gguf_file: str | None = _f(None, "hf: the GGUF file inside model.path to load (dequantized)")
    dtype: str = _f("fp32", "hf: fp32 | bf16")
    gradient_checkpointing: bool = _f(False, "hf: recompute activations in the backward pass (less memory)")
    init_from: str | None = _f(None, "start from these weights: a checkpoint dir (e.g. runs/x/checkpoints/step_200) "
                                     "or a .safetensors file")
    n_layer: int = _f(4, "transformer blocks")
    n_head: int = _f(8, "attention heads")
    n_embd: int = _f(256, "embedding width")
    n_position: int = _f(64, "longest sequence the model sees")
    dropout: float = _f(0.0, "dropout probability")


@dataclass
class TaskConfig:
    name: str = _f("addition", "addition | multiplication | math | sql | prompts (open prompts scored by "
                                 "reward.model)")
    ndigit: int = _f(3, "digits per operand")
    use_format: bool = _f(True, "prompt as 123+456= (False: bare digits 123456)")
    reverse_answer: bool = _f(True, "write the answer least-significant digit first")
    reward: str = _f("exact", "exact (1/0 per answer) | digits (fraction of digits right, per answer) | "
                              "per_digit (1/0 per digit, on that digit's token) | per_step (per_digit, the scratchpad's "
                              "product checked against the partial products written)")
    heldout_size: int = _f(1000, "problems reserved for evaluation, never trained on")
    train_file: str | None = _f(None, "math: JSONL rows {prompt or messages, ground_truth} to train on; "
                                      "sql: DBBench-format JSONL (default: procedural tasks)")
    generate: str = _f("", "math: when train_file / test_file do not exist, write them first with "
                           "`lmrl data <generate>`'s defaults: word-problems | addition-chat | preferences (empty: never)")
    test_file: str | None = _f(None, "math: JSONL rows held out for evaluation; sql: DBBench-format JSONL")
    max_new_tokens: int = _f(256, "math: longest completion sampled; sql: longest agent turn")
    chat: bool = _f(True, "math: wrap plain-text prompts as a user message in the model's chat template")
    system_prompt: str = _f("", "math: system message put before each chat prompt (empty: none)")
    prompt_template: str = _f("{prompt}", "math: how a row's prompt becomes the question asked; must hold {prompt}")
    scratchpad: bool = _f(False, "multiplication: write the partial products before the product (12*34=840|630|8040)")


@dataclass
class EnvConfig:
    """The SQL agent's environment (task.name=sql), DBBench-style."""
    max_rounds: int = _f(15, "agent turns per episode, the answer turn included (DBBench: 15)")
    max_rows: int = _f(100, "rows shown per query result")
    max_chars: int = _f(800, "characters per observation; more are cut with [TRUNCATED] (DBBench: 800)")
    query_timeout_s: float = _f(2.0, "wall-clock limit of one SQL statement")
    reward_correct: float = _f(1.0, "reward of a correct final answer (or table state)")
    reward_wrong: float = _f(-0.1, "reward of a wrong final answer")
    reward_timeout: float = _f(-0.3, "reward of an episode that ends with no answer")
    invalid_action_penalty: float = _f(0.0, "subtracted for each turn that breaks the protocol (>= 0)")
    max_context: int = _f(2048, "tokens a conversation may reach; an episode that would outgrow it ends as a timeout")
    train_tasks: int = _f(2000, "procedural training tasks (distinct)")
    heldout_per_skill: int = _f(10, "procedural held-out tasks of each skill")
    skills: list = _f([], "procedural skills to draw from (empty: all of filter, count, sum, avg, max, min, "
                          "ranking, group_by, comparison, insert, update, delete)")


@dataclass
class LoraConfig:
    r: int = _f(0, "LoRA rank on an hf model (0 = no adapter: train every weight)")
    alpha: float = _f(32.0, "LoRA alpha (the update is scaled by alpha / r)")
    dropout: float = _f(0.0, "LoRA dropout")
    target_modules: list = _f(["all-linear"], "modules that get an adapter: [all-linear] or names such as "
                                              "[q_proj, k_proj, v_proj, o_proj]")


@dataclass
class RewardConfig:
    cls: str = _f("", "a custom reward, pkg.module:Class; an instance is called as "
                      "reward(prompts, completions, ground_truth=[...]) -> list of floats")
    format_weight: float = _f(0.0, "math: reward for a well-formed <think>...</think> <answer>...</answer>")
    correct_weight: float = _f(1.0, "math: reward for a correct answer (checked with math-verify)")
    require_format: bool = _f(True, "math: a correct answer counts only when well-formed")
    timeout_s: float = _f(5.0, "math: seconds one answer check may take before it scores 0")
    model: str = _f("", "a reward model dir (what run.trainer=reward writes to <run dir>/reward_model, or any "
                        "AutoModelForSequenceClassification); its score of prompt + completion is the reward")
    model_batch_size: int = _f(16, "completions the reward model scores per forward pass")


@dataclass
class SFTConfig:
    steps: int = _f(0, "warm-up steps (0 = no warm-up)")
    examples: int = _f(0, "distinct labeled problems the warm-up may see")
    batch_size: int = _f(256, "warm-up batch size (summed over ranks)")
    lr: float = _f(1e-3, "warm-up peak learning rate (cosine decay to schedule.min_lr_ratio)")
    weight_decay: float = _f(0.01, "warm-up AdamW weight decay")
    warmup_steps: int = _f(0, "linear LR warm-up steps of the warm-up stage")


@dataclass
class DataConfig:
    """The offline trainers' data (run.trainer = sft | dpo | reward)."""
    train_file: str | None = _f(None, "JSONL rows to train on: sft {prompt, response|completion} or {messages}; "
                                      "dpo and reward {prompt|messages, chosen, rejected}")
    eval_file: str | None = _f(None, "held-out JSONL rows in the same format, evaluated every train.eval_every steps")
    generate: str = _f("", "when train_file / eval_file do not exist, write them first: preferences (synthetic "
                           "pairs) | preferences-sft (their chosen side as SFT rows) | sql-demos (the SQL agent's "
                           "solved episodes, played in the env section) (empty: never)")
    generate_train: int = _f(600, "rows data.generate writes to train_file (the synthetic preference set has ~750 "
                                  "items)")
    generate_test: int = _f(100, "rows data.generate writes to eval_file")
    max_length: int = _f(256, "tokens per prompt + response; longer rows are cut (the prompt's start first) and counted")
    batch_size: int = _f(16, "rows (pairs) per optimizer step, summed over ranks and accumulation micro-batches")
    epochs: float = _f(1.0, "passes over train_file when train.steps is 0")
    chat: bool = _f(True, "hf: put a plain-text prompt in the tokenizer's chat template as a user message")
    eval_size: int = _f(0, "held-out rows evaluated (0 = all of eval_file)")


@dataclass
class DPOConfig:
    beta: float = _f(0.1, "beta: how far the policy may move from the reference (implicit reward scale)")
    loss_type: str = _f("sigmoid", "sigmoid (DPO) | ipo | hinge")
    label_smoothing: float = _f(0.0, "sigmoid: the chance a pair's label is flipped (conservative DPO), in [0, 0.5)")


@dataclass
class AlgoConfig:
    name: str = _f("reinforce", "RL algorithm: " + " | ".join(ALGORITHMS))
    baseline_decay: float = _f(0.9, "reinforce: moving-average baseline b <- decay*b + (1-decay)*mean reward")
    group_size: int = _f(1, "completions sampled per prompt (G); rloo and grpo need >= 2")
    adv_mode: str = _f("grpo", "grpo group advantage: raw (A=r) | grpo ((r-mean)/(std+eps)) | grpo_no_std (r-mean)")
    adv_eps: float = _f(1e-6, "eps in the grpo advantage's denominator")
    normalize_advantages: bool = _f(False, "whiten advantages over the batch (mean 0, std 1)")
    clip_range_left: float = _f(0.2, "ratio clipped below at 1 - clip_range_left")
    clip_range_right: float = _f(0.2, "ratio clipped above at 1 + clip_range_right (DAPO's clip-higher: 0.28)")
    loss_level: str = _f("token", "loss aggregation: token (mean over all valid tokens) | sequence (mean per "
                                  "sequence, then over sequences) | constant (sum / (B * loss_constant), Dr. GRPO)")
    loss_constant: float = _f(0.0, "normaliser for loss_level=constant (0 = the completion length budget)")
    ppo_epochs: int = _f(1, "passes over each rollout batch")
    minibatch_size: int = _f(0, "completions per optimizer step within a pass (0 = the whole rollout)")
    kl_coef: float = _f(0.0, "beta: weight of KL(policy || reference); > 0 loads a frozen reference")
    kl_estimator: str = _f("k3", "KL estimator: k1 | k2 | k3")
    kl_in_reward: bool = _f(False, "subtract beta*KL from the reward (PPO/RLHF style) instead of adding it to the loss")
    kl_target: float = _f(0.0, "adaptive KL: per-completion KL the coefficient steers towards (0 = fixed beta)")
    kl_horizon: int = _f(10000, "adaptive KL: horizon (in completions) of the coefficient's adjustment")
    ent_coef: float = _f(0.0, "entropy bonus weight")
    value_model: str = _f("none", "ppo value function: none | head (on the policy's trunk) | separate (own network)")
    vf_coef: float = _f(0.5, "ppo value loss weight")
    value_clip: float = _f(0.2, "ppo value clipping range (0 = off)")
    gamma: float = _f(1.0, "ppo discount")
    lam: float = _f(0.95, "ppo GAE lambda")


@dataclass
class OptimConfig:
    lr: float = _f(1e-4, "RL peak learning rate")
    weight_decay: float = _f(0.01, "AdamW weight decay")
    betas: list = _f([0.9, 0.99], "AdamW betas [beta1, beta2]")
    eps: float = _f(1e-8, "AdamW epsilon")


@dataclass
class ScheduleConfig:
    name: str = _f("constant", "LR schedule: constant | linear | cosine (warm-up, decay to the floor) | "
                               "plateau (drop on a stalled eval metric, see train.best_metric)")
    warmup_steps: int = _f(0, "linear LR warm-up steps")
    min_lr_ratio: float = _f(0.1, "floor of cosine, linear and plateau as a fraction of the peak LR")
    plateau_factor: float = _f(0.5, "plateau: the LR is multiplied by this when the eval metric stops improving")
    plateau_patience: int = _f(2, "plateau: evaluations without improvement before the LR drops")


@dataclass
class TrainConfig:
    steps: int = _f(200, "RL updates")
    rollout_size: int = _f(256, "completions sampled per update (summed over ranks)")
    temperature: float = _f(1.0, "sampling temperature")
    top_k: int = _f(0, "sample from the k most likely tokens (0 = off)")
    ga_steps: int = _f(1, "gradient-accumulation micro-batches per update")
    grad_clip: float = _f(1.0, "max gradient norm (0 = off)")
    log_every: int = _f(10, "log metrics every N steps")
    eval_every: int = _f(50, "held-out evaluation every N RL steps")
    ckpt_every: int = _f(50, "checkpoint every N steps")
    keep_checkpoints: int = _f(2, "step checkpoints kept (0 = all)")
    max_nonfinite: int = _f(5, "consecutive NaN/inf losses that stop the run")
    patience: int = _f(0, "early stopping: evaluations without improvement of train.best_metric before the run "
                          "stops (0 = never)")
    early_stop_threshold: float = _f(0.0, "early stopping: an evaluation improves when it beats the best by more than this")
    best_metric: str = _f("", "eval metric that picks checkpoints/best, early stopping and the plateau schedule "
                              "(empty: eval/accuracy; a name holding 'loss' is minimised, others maximised)")
    time_limit_min: float = _f(0.0, "stop RL once the run's wall time reaches this many minutes, then evaluate "
                                    "and save as at the last step (0 = no limit)")


@dataclass
class EvalConfig:
    size: int = _f(1000, "held-out problems evaluated")
    batch_size: int = _f(500, "evaluation batch size")


@dataclass
class RolloutConfig:
    engine: str = _f("local", "what samples completions: local (the policy's own KV-cache loop) | vllm (an HF "
                              "policy served by vLLM; the learner recomputes log-probs; needs the vllm extra)")
    workers: int = _f(0, "Ray rollout workers, each with its own copy of the policy (0 = sample in the "
                         "learner's process; needs distributed.backend=ray)")
    overlap: bool = _f(False, "sample the next batch while the learner trains on this one (one step off-policy; "
                              "staleness in rollout/staleness)")
    worker_gpus: float = _f(0.0, "GPUs per rollout worker (a fraction shares one: 0.5 + learner 0.5 = colocated)")
    worker_cpus: float = _f(1.0, "CPUs per rollout worker")
    timeout_s: float = _f(600.0, "a rollout not back in this many seconds counts as a failed worker")
    max_restarts: int = _f(1, "times a dead or stuck rollout worker is replaced and its batch retried before "
                              "the run stops (its last checkpoint intact)")
    gpu_memory_utilization: float = _f(0.4, "vllm: fraction of the GPU the engine may take (the learner needs the rest "
                                            "when colocated)")
    max_model_len: int = _f(0, "vllm: longest prompt + completion (0 = the model's own limit)")


@dataclass
class DistributedConfig:
    backend: str = _f("torch", "torch (one process, or torchrun's process group when launched by torchrun) | "
                               "ray (rollout workers and the learner as Ray actors)")
    strategy: str = _f("ddp", "how torchrun ranks share the model: ddp (a full copy each) | fsdp (parameters, "
                              "gradients and optimizer state sharded; HF policies)")
    address: str = _f("", "ray: cluster address (empty = start a local Ray; 'auto' = the cluster this node is in)")
    connect_timeout_s: float = _f(60.0, "ray: give up connecting to distributed.address after this many seconds")
    learner_gpus: float = _f(0.0, "ray: GPUs for the learner actor (0 on a CPU machine; 0.5 with rollout.worker_gpus=0.5 "
                                  "shares one GPU)")
    learner_cpus: float = _f(1.0, "ray: CPUs for the learner actor")


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir or f"runs/{self.run.name}")
