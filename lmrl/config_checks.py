"""Config checks: every value a run reads is checked before any training starts, and each
problem is one line naming the key (see `lmrl.config` for the classes and loading)."""

from __future__ import annotations

from .config import ALGORITHMS, TRAINERS, Config, ConfigError, TaskConfig, _suggest

ARITHMETIC = ("addition", "multiplication")


CHOICES = {
    "run.trainer": TRAINERS,
    "run.resume": ["never", "auto"],
    "run.wandb_mode": ["online", "offline"],
    "model.type": ["gpt", "hf"],
    "model.dtype": ["fp32", "bf16"],
    "task.name": ["addition", "multiplication", "math", "sql", "prompts"],
    "task.reward": ["exact", "digits", "per_digit", "per_step"],
    "task.generate": ["", "word-problems", "addition-chat", "preferences"],
    "schedule.name": ["constant", "linear", "cosine", "plateau"],
    "data.generate": ["", "preferences", "preferences-sft", "sql-demos"],
    "dpo.loss_type": ["sigmoid", "ipo", "hinge"],
    "algo.name": ALGORITHMS,
    "algo.adv_mode": ["raw", "grpo", "grpo_no_std"],
    "algo.loss_level": ["token", "sequence", "constant"],
    "algo.kl_estimator": ["k1", "k2", "k3"],
    "algo.value_model": ["none", "head", "separate"],
    "rollout.engine": ["local", "vllm"],
    "distributed.backend": ["torch", "ray"],
    "distributed.strategy": ["ddp", "fsdp"],
}


def arithmetic_seq_len(task: TaskConfig) -> int:
    """Positions an arithmetic problem needs: prompt + answer."""
    from .tasks.arithmetic import answer_length

    prompt = 2 * task.ndigit + (2 if task.use_format else 0)
    return prompt + answer_length(task.name, task.ndigit, task.scratchpad)


def validate(cfg: Config) -> None:
    for dotted, options in CHOICES.items():
        section, key = dotted.split(".")
        value = getattr(getattr(cfg, section), key)
        if value not in options:
            raise ConfigError(f"{dotted}={value!r} is not one of {', '.join(options)}{_suggest(str(value), options)}")
    checks = [
        (cfg.train.steps >= 0, "train.steps must be >= 0"),
        (cfg.train.rollout_size > 0, "train.rollout_size must be > 0"),
        (cfg.train.temperature > 0, "train.temperature must be > 0"),
        (cfg.train.ga_steps >= 1, "train.ga_steps must be >= 1"),
        (cfg.train.time_limit_min >= 0, "train.time_limit_min must be >= 0 (0 = no limit)"),
        (cfg.train.rollout_size % cfg.train.ga_steps == 0,
         f"train.rollout_size={cfg.train.rollout_size} must be divisible by train.ga_steps={cfg.train.ga_steps}"),
        (min(cfg.train.log_every, cfg.train.eval_every, cfg.train.ckpt_every) >= 1,
         "train.log_every, eval_every and ckpt_every must be >= 1"),
        (0 <= cfg.algo.baseline_decay < 1, "algo.baseline_decay must be in [0, 1)"),
        (cfg.sft.steps >= 0 and cfg.sft.examples >= 0, "sft.steps and sft.examples must be >= 0"),
        (cfg.sft.steps == 0 or cfg.sft.examples > 0, "sft.steps > 0 needs sft.examples > 0 (the label budget)"),
        (len(cfg.optim.betas) == 2 and all(0 <= b < 1 for b in cfg.optim.betas),
         f"optim.betas must be two numbers in [0, 1), got {cfg.optim.betas}"),
        (cfg.train.patience >= 0 and cfg.train.early_stop_threshold >= 0,
         "train.patience and train.early_stop_threshold must be >= 0"),
        (cfg.train.best_metric == "" or cfg.train.best_metric.startswith("eval/"),
         f"train.best_metric must name an eval metric (eval/...), got {cfg.train.best_metric!r}"),
        (0 < cfg.schedule.plateau_factor < 1 and cfg.schedule.plateau_patience >= 1,
         "schedule.plateau_factor must be in (0, 1) and schedule.plateau_patience >= 1"),
        (not cfg.reward.model or not cfg.reward.cls, "set reward.model or reward.cls, not both"),
        (cfg.reward.model_batch_size >= 1, "reward.model_batch_size must be >= 1"),
    ]
    if cfg.run.trainer != "rl":
        env_checks = [] if cfg.data.generate != "sql-demos" else _env_checks(cfg) + [  # demonstrations play in env
            (cfg.env.max_rounds >= 2, f"data.generate=sql-demos plays 2 turns (a query, then the answer): "
                                      f"env.max_rounds must be >= 2, got {cfg.env.max_rounds}")]
        for ok, msg in checks + _offline_checks(cfg) + env_checks:
            if not ok:
                raise ConfigError(msg)
        return
    task_checks = _arithmetic_checks(cfg) if cfg.task.name in ARITHMETIC else _text_task_checks(cfg)
    if cfg.task.name == "sql":
        task_checks += _env_checks(cfg)
    for ok, msg in checks + task_checks + _algo_checks(cfg) + _scale_checks(cfg):
        if not ok:
            raise ConfigError(msg)


def _arithmetic_checks(cfg: Config) -> list[tuple[bool, str]]:
    """The built-in GPT on an arithmetic task: the problem must fit the model, the budget the task."""
    m, t = cfg.model, cfg.task
    space = 10 ** (2 * t.ndigit)  # distinct problems
    checks = [
        (m.type == "gpt", f"task.name={t.name} is written for the built-in GPT's character tokenizer: "
                          f"model.type must be gpt, got {m.type!r} (an hf model takes task.name=math)"),
        (m.n_embd % m.n_head == 0, f"model.n_embd={m.n_embd} must be divisible by model.n_head={m.n_head}"),
        (t.ndigit >= 1, "task.ndigit must be >= 1"),
        (t.heldout_size >= 1, "task.heldout_size must be >= 1"),
        (1 <= cfg.eval.size <= t.heldout_size,
         f"eval.size={cfg.eval.size} must be between 1 and task.heldout_size={t.heldout_size}"),
        (not t.scratchpad or t.name == "multiplication", "task.scratchpad is for multiplication only"),
        (t.reward != "per_step" or t.scratchpad,
         "task.reward=per_step checks scratchpad steps: it needs task.scratchpad=true"),
        (t.heldout_size < space, f"task.heldout_size={t.heldout_size} leaves no training problems for "
                                 f"ndigit={t.ndigit}"),
        (cfg.sft.examples <= space - t.heldout_size,
         f"sft.examples={cfg.sft.examples} is more than the {max(space - t.heldout_size, 0)} training "
         f"problems of ndigit={t.ndigit} with task.heldout_size={t.heldout_size}"),
    ]
    if t.ndigit >= 1:
        need = arithmetic_seq_len(t)
        checks.append((need <= m.n_position, f"task.ndigit={t.ndigit} needs {need} positions but "
                                             f"model.n_position is {m.n_position}"))
    return checks


def _text_task_checks(cfg: Config) -> list[tuple[bool, str]]:
    """A Hugging Face model on text prompts from JSONL files."""
    m, t, lora = cfg.model, cfg.task, cfg.lora
    return [
        (m.type == "hf", f"task.name={t.name} needs a Hugging Face model: set model.type=hf and model.path"),
        (bool(m.path), "model.type=hf needs model.path (a local directory, or smollm2-135m-instruct)"),
        (t.name == "sql" or (bool(t.train_file) and bool(t.test_file)),
         f"task.name={t.name} reads its problems from JSONL: set task.train_file and task.test_file "
         f"(`lmrl data word-problems OUT_DIR` writes a pair offline)"),
        ("{prompt}" in t.prompt_template, f"task.prompt_template must contain {{prompt}}, got {t.prompt_template!r}"),
        (t.max_new_tokens >= 1, f"task.max_new_tokens must be >= 1, got {t.max_new_tokens}"),
        (cfg.eval.size >= 1, f"eval.size must be >= 1, got {cfg.eval.size}"),
        (cfg.sft.steps == 0, "sft.steps > 0: the supervised warm-up is for the arithmetic tasks; a text task "
                             "starts from the pretrained model (set sft.steps=0)"),
        (lora.r >= 0 and lora.alpha > 0 and 0 <= lora.dropout < 1,
         "lora.r must be >= 0, lora.alpha > 0 and lora.dropout in [0, 1)"),
        (bool(lora.target_modules), "lora.target_modules must name at least one module (or all-linear)"),
        (not cfg.reward.cls or ":" in cfg.reward.cls,
         f"reward.cls={cfg.reward.cls!r} must look like package.module:ClassName"),
        (cfg.reward.timeout_s > 0, "reward.timeout_s must be > 0"),
        (t.name != "prompts" or bool(cfg.reward.model or cfg.reward.cls),
         "task.name=prompts is scored by a learned reward: set reward.model (a reward model dir) or reward.cls"),
    ]


def _offline_checks(cfg: Config) -> list[tuple[bool, str]]:
    """run.trainer = sft | dpo | reward: a model, data files, and the trainer's own options."""
    d, m, trainer = cfg.data, cfg.model, cfg.run.trainer
    return [
        (bool(d.train_file), f"run.trainer={trainer} reads data.train_file (JSONL); set it (data.generate="
                             f"preferences writes synthetic pairs offline)"),
        (trainer != "reward" or m.type == "hf", "run.trainer=reward trains a Hugging Face model: set model.type=hf "
                                                "and model.path"),
        (m.type != "hf" or bool(m.path), "model.type=hf needs model.path (a local directory, or smollm2-135m-instruct)"),
        (m.type == "hf" or m.n_embd % m.n_head == 0, f"model.n_embd={m.n_embd} must be divisible by model.n_head={m.n_head}"),
        (d.max_length >= 2, f"data.max_length must be >= 2, got {d.max_length}"),
        (d.batch_size >= 1 and d.batch_size % cfg.train.ga_steps == 0,
         f"data.batch_size={d.batch_size} must be >= 1 and divisible by train.ga_steps={cfg.train.ga_steps}"),
        (d.epochs > 0 and d.eval_size >= 0, "data.epochs must be > 0 and data.eval_size >= 0"),
        (d.generate_train >= 1 and d.generate_test >= 1, "data.generate_train and data.generate_test must be >= 1"),
        (cfg.dpo.beta > 0, f"dpo.beta must be > 0, got {cfg.dpo.beta}"),
        (0 <= cfg.dpo.label_smoothing < 0.5, f"dpo.label_smoothing must be in [0, 0.5), got {cfg.dpo.label_smoothing}"),
        (cfg.dpo.label_smoothing == 0 or cfg.dpo.loss_type == "sigmoid",
         f"dpo.label_smoothing is for loss_type=sigmoid, not {cfg.dpo.loss_type}"),
        (cfg.lora.r >= 0 and cfg.lora.alpha > 0 and 0 <= cfg.lora.dropout < 1,
         "lora.r must be >= 0, lora.alpha > 0 and lora.dropout in [0, 1)"),
        (cfg.lora.r == 0 or m.type == "hf", "lora.r > 0 needs an hf model (model.type=hf)"),
    ]


def _env_checks(cfg: Config) -> list[tuple[bool, str]]:
    from .tasks.sql.procedural import SKILLS

    e = cfg.env
    unknown = [s for s in e.skills if s not in SKILLS]
    return [
        (e.max_rounds >= 1, f"env.max_rounds must be >= 1, got {e.max_rounds}"),
        (e.max_rows >= 1 and e.max_chars >= 1, "env.max_rows and env.max_chars must be >= 1"),
        (e.query_timeout_s > 0, f"env.query_timeout_s must be > 0, got {e.query_timeout_s}"),
        (e.invalid_action_penalty >= 0, f"env.invalid_action_penalty is subtracted, so it must be >= 0, "
                                        f"got {e.invalid_action_penalty}"),
        (e.max_context > cfg.task.max_new_tokens, f"env.max_context={e.max_context} leaves no room for one "
                                                  f"turn of task.max_new_tokens={cfg.task.max_new_tokens}"),
        (e.train_tasks >= 1 and e.heldout_per_skill >= 1, "env.train_tasks and env.heldout_per_skill must be >= 1"),
        (not unknown, f"env.skills: unknown skill(s) {unknown}; choose from {', '.join(SKILLS)}"),
    ]


def _algo_checks(cfg: Config) -> list[tuple[bool, str]]:
    a, t = cfg.algo, cfg.train
    group = a.name in ("rloo", "grpo")
    return [
        (a.group_size >= 1, f"algo.group_size must be >= 1, got {a.group_size}"),
        (not group or a.group_size >= 2 or (a.name == "grpo" and a.adv_mode == "raw"),
         f"algo.name={a.name} compares each completion with its group: algo.group_size must be >= 2, got {a.group_size}"),
        (t.rollout_size % a.group_size == 0,
         f"train.rollout_size={t.rollout_size} must be divisible by algo.group_size={a.group_size}"),
        (a.ppo_epochs >= 1, f"algo.ppo_epochs must be >= 1, got {a.ppo_epochs}"),
        (a.minibatch_size >= 0, f"algo.minibatch_size must be >= 0, got {a.minibatch_size}"),
        (a.name != "reinforce" or (a.ppo_epochs == 1 and a.minibatch_size == 0),
         "algo.name=reinforce makes one on-policy update per rollout: algo.ppo_epochs must be 1 and "
         "algo.minibatch_size 0 (use rloo, grpo or ppo for several updates per rollout)"),
        (a.name != "ppo" or a.value_model != "none",
         "algo.name=ppo needs a value model: set algo.value_model to head or separate"),
        (min(a.clip_range_left, a.clip_range_right) >= 0 and a.clip_range_left < 1,
         "algo.clip_range_left must be in [0, 1) and algo.clip_range_right >= 0"),
        (a.kl_coef >= 0 and a.kl_target >= 0 and a.kl_horizon > 0,
         "algo.kl_coef and algo.kl_target must be >= 0, algo.kl_horizon > 0"),
        (a.kl_target == 0 or a.kl_coef > 0, "algo.kl_target > 0 (adaptive KL) needs an initial algo.kl_coef > 0"),
        (0 <= a.gamma <= 1 and 0 <= a.lam <= 1, "algo.gamma and algo.lam must be in [0, 1]"),
        (a.adv_eps > 0 and a.loss_constant >= 0 and a.value_clip >= 0,
         "algo.adv_eps must be > 0, algo.loss_constant and algo.value_clip >= 0"),
    ]


def _scale_checks(cfg: Config) -> list[tuple[bool, str]]:
    """Rollout engine, Ray workers, overlap and the torchrun strategy (see lmrl.rollout.engine)."""
    r, d = cfg.rollout, cfg.distributed
    vllm_refusal = None
    if r.engine == "vllm" and cfg.model.type == "hf":  # (a GPT is refused below)
        from .rollout.vllm_engine import unsupported_reason

        vllm_refusal = unsupported_reason(cfg.task.name, cfg.model.type, workers=r.workers)
    return [
        (r.workers >= 0, f"rollout.workers must be >= 0, got {r.workers}"),
        (r.workers == 0 or d.backend == "ray",
         f"rollout.workers={r.workers} runs rollout workers as Ray actors: set distributed.backend=ray"),
        (d.backend != "ray" or r.workers >= 1, "distributed.backend=ray needs rollout.workers >= 1"),
        (r.workers == 0 or cfg.train.rollout_size // cfg.algo.group_size >= r.workers,
         f"train.rollout_size={cfg.train.rollout_size} makes {cfg.train.rollout_size // cfg.algo.group_size} "
         f"prompt groups, fewer than rollout.workers={r.workers}"),
        (r.engine != "vllm" or cfg.model.type == "hf", "rollout.engine=vllm serves Hugging Face policies: "
                                                       "set model.type=hf (the built-in GPT samples locally)"),
        (vllm_refusal is None, vllm_refusal),
        (min(r.worker_gpus, r.worker_cpus, d.learner_gpus, d.learner_cpus) >= 0,
         "rollout.worker_gpus/worker_cpus and distributed.learner_gpus/learner_cpus must be >= 0"),
        (r.timeout_s > 0 and d.connect_timeout_s > 0, "rollout.timeout_s and distributed.connect_timeout_s must be > 0"),
        (r.max_restarts >= 0, f"rollout.max_restarts must be >= 0, got {r.max_restarts}"),
        (0 < r.gpu_memory_utilization <= 1, f"rollout.gpu_memory_utilization must be in (0, 1], "
                                            f"got {r.gpu_memory_utilization}"),
        (d.strategy != "fsdp" or cfg.model.type == "hf",
         "distributed.strategy=fsdp shards Hugging Face policies (model.type=hf); the built-in GPT uses ddp"),
        # a sampler other than the learner's own policy copies its weights, which FSDP holds in shards
        (d.strategy != "fsdp" or (r.engine == "local" and not r.overlap and d.backend == "torch"),
         "distributed.strategy=fsdp samples with the sharded policy itself: it needs rollout.engine=local, "
         "rollout.overlap=false and distributed.backend=torch"),
    ]
