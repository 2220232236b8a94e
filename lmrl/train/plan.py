"""Will a run fit, and how long will a step take? Sized from the config alone, before anything loads.

    p = plan(load_config("math-grpo-qwen-gpu", ["model.path=DIR"]), device="h100")
    print(p.table())             # per device: weights, gradients, optimizer state, activations, KV cache, ...
    p.peak_bytes, p.fits, p.step_seconds

`lmrl plan PRESET [key=value ...] [--device h100|h200|a100|cpu] [--device-memory GB] [--world-size N]`
prints the same table.

The model's size comes from its config and nothing else: a Hugging Face model's config.json (or a
GGUF file's header) is built on the meta device, where parameters have shapes but no storage, with
the run's LoRA adapter added the same way, so parameter counts are exact; the built-in GPT is built
on the meta device from the model section. Sequence lengths come from the run's data where the files
exist (prompts rendered with the chat template and tokenized, a few hundred rows), else from the
limits in the config.

Memory per device, in bytes, for the phases of a step that do not overlap:

- always held: weights (in `model.dtype`; a LoRA adapter in fp32, as peft keeps it), AdamW's two
  moments for every trainable parameter (in the parameter's dtype), the weight average
  (`train.ema_decay`), a frozen KL / DPO reference copy (none with LoRA: the adapter switched off),
  PPO's separate value model, a sampling copy of the policy (`rollout.overlap`, colocated Ray
  workers), vLLM's share of the device (`rollout.gpu_memory_utilization` x the device's memory);
  under FSDP the weights, gradients and optimizer state divided by the ranks (sampling gathers the
  whole policy);
- the update: gradients of the trainable parameters, the activations a micro-batch keeps for its
  backward pass (per token and layer of a Llama-style block: 4 hidden + 2 KV + 3 MLP widths, plus the
  inputs of the layers that train or carry an adapter, one copy per layer where it is cast first: on
  bf16 weights an adapter's input in fp32, under autocast every such input in bf16; with gradient
  checkpointing one hidden width per layer plus one block recomputed), under autocast the bf16 copies
  of the weights, and the logits of the scored positions with their gradient;
- sampling: the KV cache of the whole rollout batch (2 x layers x KV width x (prompt + completion)
  tokens x rows), or of an evaluation batch if larger, and on a CPU the copies of the wide linear
  layers the sampling loop runs from (generation/packed_linear.py);
- the process itself: a CUDA context, or on a CPU the interpreter with torch, transformers and peft
  loaded (`RUNTIME_BYTES`, measured).

The peak is what is always held plus the larger of the update and sampling (on a CPU plus both: the
C allocator keeps what sampling freed, and the update's blocks do not reuse it). Step time is an
estimate from counted operations and bytes against the device's rates (`DEVICES`): sampling is one
prefill of the distinct prompts and one decode step per new token, each the slowest of its matrix
work, reading every weight (and the KV cache) once, and launching its operations (ReMax: once more
for the prompts' greedy decode); the update is the
forward and backward passes' matrix work (x2 forward for a LoRA backward, x3 for full training, one
more forward under gradient checkpointing, one per reference or old-log-prob pass), or launching its
micro-batches' operations if that is slower. On a GPU a small model is bound by the launches: eager
PyTorch pays ~17 us of host time per aten operation (measured on an H100 machine), and a step's
operations per layer are counted by benchmarks/launch_count.py (`common.launch_costs`); the
sampling loop's decode step is replayed as a CUDA graph there, whose cost per operation
(`Device.graph_op_us`) is assumed until the device check measures it. Attention's own arithmetic is
left out. docs/results.md compares the memory and the GPU step times with measurements.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..algos import ALGORITHMS
from ..common.chat import hold_template_kwargs
from ..common.launch_costs import (DECODE_FIXED_OPS, DECODE_OPS, GRAPH_OP_SECONDS, OP_SECONDS, UPDATE_FIXED_OPS,
                                   UPDATE_OPS, layer_ops, prompt_sharing_pays)
from ..config import Config, ConfigError
from ..tasks import task_spec

GiB = 2**30
# The process before any tensor: on a GPU its CUDA context (about 0.5 GiB under torch 2.x, not measured
# here yet: the device check's peak figures will say), on a CPU the interpreter with torch, transformers,
# peft and lmrl's trainers imported (399 MiB RSS, measured on the dev machine, 2026-11-27).
RUNTIME_BYTES = {"cuda": int(0.5 * GiB), "cpu": 399 * 2**20}


@dataclass(frozen=True)
class Device:
    name: str
    memory_gb: float | None  # None: unknown (give --device-memory)
    matmul_tflops: float     # dense bf16 (fp32 on a CPU), what a large product reaches
    bandwidth_gbs: float     # device memory, read + write counted
    kind: str = "cuda"
    op_us: float = OP_SECONDS * 1e6  # eager PyTorch: one aten operation's dispatch and launch on the host
    graph_op_us: float = GRAPH_OP_SECONDS * 1e6  # the same replayed in a CUDA graph (assumed: not measured yet)


# Rates measured on this workplace's machines where stated (docs/results.md, KINDS.md), else datasheets.
# op_us: common/launch_costs.py's, measured on the H100 machine; the other GPUs are assumed to sit on similar hosts.
DEVICES = {
    "h100": Device("h100", 80, 798, 3000),   # measured: 8192^3 bf16 product 798 TFLOP/s, copy 3.0 TB/s
    "h200": Device("h200", 141, 788, 4300),  # measured: 788 TFLOP/s, copy 4.3 TB/s
    "a100": Device("a100", 80, 250, 1500),   # datasheet 312 TFLOP/s, 2.0 TB/s, less what is usually reached
    # the 2-core dev VM: fp32 products 0.10-0.28 TFLOP/s, 19-46 GB/s read (benchmarks/hf_rollout.py, results.md)
    "cpu": Device("cpu", None, 0.2, 25, kind="cpu", op_us=0.0, graph_op_us=0.0),
}
# Fractions of the rates that real passes reach (a training pass's matrix products; decoding's weight reads).
MATMUL_EFFICIENCY, BANDWIDTH_EFFICIENCY = 0.4, 0.5


@dataclass
class ModelSize:
    """What the plan needs of a model: counts and widths, read off a meta-device build."""
    description: str
    parameters: int
    trainable: int
    lora: bool
    layers: int
    hidden: int
    intermediate: int
    kv_width: int            # key (= value) width per token and layer
    vocab: int
    largest_layer: int       # parameters of the biggest decoder layer (FSDP gathers one at a time)
    weight_bytes: int        # every parameter in its stored dtype
    trainable_bytes: int     # the trainable ones (their gradients and each AdamW moment take as much)
    llama_like: bool = True  # a Llama-style block (gated MLP); else the built-in GPT
    packable: int = 0        # parameters of the linear layers a CPU rollout runs from packed copies
    linear: int = 0          # parameters of every linear layer (the LM head included)
    heads: int = 1           # attention heads


@dataclass
class Lengths:
    prompt: int              # tokens of a prompt (the longest of the rows read)
    completion: int          # tokens sampled (or a reply, offline)
    source: str              # where the numbers come from


@dataclass
class Plan:
    """Memory per device (bytes, by part) and an estimate of a step's seconds. `table()` prints it."""
    config_name: str
    model: ModelSize
    lengths: Lengths
    device: Device
    world_size: int
    held: dict[str, int] = field(default_factory=dict)      # held through the step
    update: dict[str, int] = field(default_factory=dict)    # only during the update
    sampling: dict[str, int] = field(default_factory=dict)  # only while sampling or evaluating
    step_seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        """Held + the larger of update and sampling; on a CPU held + both: the C allocator keeps what
        sampling freed in the process, and the update's blocks do not reuse it (measured, docs/results.md)."""
        update, sampling = sum(self.update.values()), sum(self.sampling.values())
        return sum(self.held.values()) + (update + sampling if self.device.kind == "cpu" else max(update, sampling))

    @property
    def memory_gb(self) -> float | None:
        return self.device.memory_gb

    @property
    def fits(self) -> bool | None:
        return None if self.memory_gb is None else self.peak_bytes <= self.memory_gb * 1e9

    def as_dict(self) -> dict:
        return {"config": self.config_name, "model": self.model.description, "parameters": self.model.parameters,
                "trainable": self.model.trainable, "device": self.device.name, "world_size": self.world_size,
                "prompt_tokens": self.lengths.prompt, "completion_tokens": self.lengths.completion,
                "held_bytes": self.held, "update_bytes": self.update, "sampling_bytes": self.sampling,
                "peak_bytes": self.peak_bytes, "device_memory_gb": self.memory_gb, "fits": self.fits,
                "step_seconds": self.step_seconds, "notes": self.notes}

    def table(self) -> str:
        m = self.model
        lines = [f"lmrl plan {self.config_name}: {m.description}, {m.parameters / 1e6:,.1f}M parameters "
                 f"({m.trainable / 1e6:,.2f}M trainable{', LoRA' if m.lora else ''}), "
                 f"{self.world_size} process{'es' if self.world_size > 1 else ''}, device {self.device.name}",
                 f"sequences: {self.lengths.prompt} prompt + {self.lengths.completion} completion tokens "
                 f"({self.lengths.source})", "", f"{'per device':44s}{'GiB':>9s}"]
        for title, part in (("held through the step", self.held), ("the update", self.update),
                            ("sampling", self.sampling)):
            lines.append(f"{title}:")
            lines += [f"  {name:42s}{size / GiB:9.2f}" for name, size in part.items()]
        peak = self.peak_bytes / GiB
        verdict = ""
        if self.memory_gb is not None:
            share = self.peak_bytes / (self.memory_gb * 1e9)
            verdict = f"  of {self.memory_gb:.3g} GB: {'fits' if self.fits else 'does NOT fit'} ({share:.0%})"
        how = "held + update + sampling (CPU)" if self.device.kind == "cpu" else "held + max(update, sampling)"
        lines += [f"{'peak: ' + how:44s}{peak:9.2f}{verdict}"]
        if self.step_seconds:
            parts = ", ".join(f"{k} {v:.2f} s" for k, v in self.step_seconds.items() if k != "step")
            lines.append(f"step time estimate: {self.step_seconds['step']:.2f} s ({parts}; rough: counted work over "
                         f"{self.device.name} rates)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def plan(config: Config, *, device: str | None = None, device_memory_gb: float | None = None,
         world_size: int = 1) -> Plan:
    """The memory and step-time plan of `config` on `device` (a name in `DEVICES`; default: this machine's
    GPU if the run would use one, else its CPU), with `world_size` torchrun processes."""
    if world_size < 1:
        raise ConfigError(f"--world-size must be at least 1, got {world_size}")
    name = device or _this_device(config.run.device)
    if name not in DEVICES:
        raise ConfigError(f"--device {name!r} is not one plan knows: {', '.join(DEVICES)}")
    if device_memory_gb is not None and device_memory_gb <= 0:
        raise ConfigError(f"--device-memory must be a positive number of GB, got {device_memory_gb}")
    dev = DEVICES[name]
    if device is None and dev.kind == "cuda":  # this machine's GPU: its own memory
        dev = dataclasses.replace(dev, memory_gb=torch.cuda.get_device_properties(0).total_memory / 1e9)
    if device_memory_gb is not None:
        dev = dataclasses.replace(dev, memory_gb=device_memory_gb)
    elif dev.memory_gb is None and dev.kind == "cpu":
        dev = dataclasses.replace(dev, memory_gb=_host_memory_gb())
    size, tokenizer = model_size(config)
    lengths = sequence_lengths(config, tokenizer)
    out = Plan(_config_name(config), size, lengths, dev, world_size)
    if config.run.trainer == "rl":
        _rl_memory(config, out)
    else:
        _offline_memory(config, out)
    out.step_seconds = _step_time(config, out)
    return out


# ------------------------------------------------------------------------------------------ the model

def model_size(config: Config) -> tuple[ModelSize, object | None]:
    """(ModelSize, tokenizer or None) from the model section, without loading any weight."""
    if config.model.type == "gpt":
        return _gpt_size(config), None
    return _hf_size(config)


def _gpt_size(config: Config) -> ModelSize:
    from ..models import GPT, GPTConfig
    from ..tasks.arithmetic import ArithmeticTask

    m, t = config.model, config.task
    vocab = ArithmeticTask(t.name, ndigit=t.ndigit, use_format=t.use_format, scratchpad=t.scratchpad,
                           heldout_size=1).tokenizer.vocab_size
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=vocab, n_position=m.n_position, n_layer=m.n_layer, n_head=m.n_head,
                              n_embd=m.n_embd, dropout=m.dropout))
    n = sum(p.numel() for p in model.parameters())
    linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    return ModelSize(f"built-in GPT ({m.n_layer} x {m.n_embd})", n, n, False, m.n_layer, m.n_embd, 4 * m.n_embd,
                     m.n_embd, vocab, 12 * m.n_embd * m.n_embd, 4 * n, 4 * n, llama_like=False, linear=linear)


def _hf_size(config: Config) -> tuple[ModelSize, object]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ..models.hf_loading import resolve_model_path

    m = config.model
    try:
        directory, gguf_file = resolve_model_path(m.path, m.gguf_file)
    except (FileNotFoundError, ModuleNotFoundError) as e:
        raise ConfigError(f"model.path={m.path}: {e} (lmrl plan reads only its config.json and tokenizer: a "
                          f"directory holding those two is enough)") from None
    kwargs = {"local_files_only": True} | ({"gguf_file": gguf_file} if gguf_file else {})
    hf_config = AutoConfig.from_pretrained(directory, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(directory, **kwargs)
    hold_template_kwargs(tokenizer, m.chat_template_kwargs)  # prompts counted as the run renders them
    if not tokenizer("Hello world", add_special_tokens=False)["input_ids"]:
        tokenizer = None  # e.g. a tokenizer_config.json without its vocabulary: lengths from the config
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[m.dtype]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    arch = (getattr(hf_config, "architectures", None) or [type(model).__name__])[0]
    lora = config.lora.r > 0
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = config.lora.target_modules
        model = get_peft_model(model, LoraConfig(r=config.lora.r, lora_alpha=config.lora.alpha,
                                                 target_modules="all-linear" if list(targets) == ["all-linear"]
                                                 else list(targets)))
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    from ..generation.packed_linear import MIN_FEATURES

    packable = sum(mod.weight.numel() for mod in model.modules() if type(mod) is torch.nn.Linear
                   and min(mod.in_features, mod.out_features) >= MIN_FEATURES)
    linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    layers_module = next((mod for name, mod in model.named_modules() if name.endswith("layers")
                          and isinstance(mod, torch.nn.ModuleList)), None)
    largest = max((sum(p.numel() for p in layer.parameters()) for layer in layers_module), default=0) \
        if layers_module is not None else 0
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv = (getattr(text, "num_key_value_heads", None) or heads) * head_dim
    source = f"{Path(directory).name}/{gguf_file}" if gguf_file else Path(directory).name
    size = ModelSize(f"{arch} from {source} ({m.dtype})", sum(p.numel() for p in params),
                     sum(p.numel() for p in trainable), lora, text.num_hidden_layers, text.hidden_size,
                     getattr(text, "intermediate_size", 4 * text.hidden_size), kv, text.vocab_size, largest,
                     sum(p.numel() * p.element_size() for p in params),
                     sum(p.numel() * (4 if lora else p.element_size()) for p in trainable), packable=packable,
                     linear=linear, heads=heads)
    if lora:  # peft keeps the adapter in fp32 on a bf16 base (autocast_adapter_dtype)
        size.weight_bytes += sum(p.numel() * (4 - p.element_size()) for p in trainable)
    return size, tokenizer


# ------------------------------------------------------------------------------------------ lengths

def sequence_lengths(config: Config, tokenizer) -> Lengths:
    """Prompt and completion tokens: from the data files where they exist, else the config's limits."""
    t = config.task
    if config.model.type == "gpt":
        from ..tasks.arithmetic import answer_length

        prompt = 2 * t.ndigit + (2 if t.use_format else 0)
        return Lengths(prompt, answer_length(t.name, t.ndigit, t.scratchpad), "the task's fixed layout")
    if config.run.trainer != "rl":
        return _offline_lengths(config, tokenizer)
    if task_spec(t.name).multi_turn:
        return Lengths(config.env.max_context - t.max_new_tokens, t.max_new_tokens,
                       "env.max_context: a whole episode at its longest")
    rows = _rows(t.train_file) if tokenizer is not None else []
    if not rows:
        why = f"no rows at task.train_file={t.train_file}" if tokenizer is not None else "no usable tokenizer"
        return Lengths(256, t.max_new_tokens, f"{why}: 256 prompt tokens assumed")
    from ..models.hf import apply_chat_template

    from ..common.data import DataError, prompt_row

    longest = 0
    for row in rows:
        try:
            row = prompt_row(row, t.prompt_key, t.label_key)  # as the task reads it (verl's message-list prompt)
        except DataError:  # a row the task refuses: its own error names it when the run starts
            continue
        if "messages" in row:
            text = apply_chat_template(tokenizer, row["messages"])
        else:
            question = t.prompt_template.format(prompt=row.get("prompt", ""))
            messages = ([{"role": "system", "content": t.system_prompt}] if t.system_prompt else []) + \
                [{"role": "user", "content": question}]
            text = apply_chat_template(tokenizer, messages) if t.chat else question
        longest = max(longest, len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return Lengths(longest, t.max_new_tokens, f"the longest of {len(rows)} prompts of {t.train_file}; "
                                              f"completions at task.max_new_tokens")


def _offline_lengths(config: Config, tokenizer) -> Lengths:
    """Offline rows: the longest prompt and reply (a pair: its longer reply), each row cut at data.max_length."""
    d = config.data
    rows = _rows(d.train_file) if tokenizer is not None else []
    if not rows:
        why = f"no rows at data.train_file={d.train_file}" if tokenizer is not None else "no usable tokenizer"
        return Lengths(d.max_length // 2, d.max_length // 2, f"{why}: data.max_length split in half")
    from ..common.data import ABSENT, value_at
    from ..models.hf import apply_chat_template
    from ..tasks.preference_data import COLUMNS, Columns, preference_row

    columns = Columns.of(d)

    def at(row: dict, key: str):  # a column, or a dotted path into nested objects; None where there is none
        value = value_at(row, key)
        return None if value is ABSENT else value

    def as_messages(value, role: str) -> list[dict]:
        return value if isinstance(value, list) else [{"role": role, "content": str(value)}]

    def count_prompt(value) -> int:  # rendered as the trainers render it: the chat template's opening included
        text = apply_chat_template(tokenizer, as_messages(value, "user")) if d.chat or isinstance(value, list) \
            else str(value)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def count_reply(value) -> int:  # its text and the turn's end
        text = "".join(str(m.get("content", "")) for m in as_messages(value, "assistant"))
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 2

    prompt = reply = 0
    for row in rows:
        if config.run.trainer in ("dpo", "reward"):
            pair = preference_row(row, columns=columns)
            p, r = count_prompt(pair.prompt), max(count_reply(pair.chosen), count_reply(pair.rejected))
        elif at(row, columns.messages) is not None or "conversations" in row:
            p, r = 0, count_reply(at(row, columns.messages) or row.get("conversations"))
        else:
            completion = row.get("completion") if columns.response == COLUMNS.response else None
            p, r = count_prompt(at(row, columns.prompt) or ""), count_reply(
                completion or at(row, columns.response) or at(row, columns.text) or "")
        p = min(p, d.max_length - 1)
        prompt, reply = max(prompt, p), max(reply, min(r, d.max_length - p))
    return Lengths(prompt, reply, f"the longest of {len(rows)} rows of {d.train_file}, cut at data.max_length")


def _rows(path: str | None, limit: int = 256) -> list[dict]:
    if not path or not Path(path).is_file():
        return []
    from ..common.data import iter_file_rows

    rows = []
    for _, row in iter_file_rows(path):
        rows.append(row)
        if len(rows) >= limit:
            break
    return rows


# ------------------------------------------------------------------------------------------ memory

def _act_bytes(config: Config) -> int:
    return 2 if config.model.dtype == "bf16" or _autocast(config) else 4


def _held(config: Config, p: Plan, *, sampling_copy: bool) -> None:
    m, shards = p.model, p.world_size if config.distributed.strategy == "fsdp" and p.world_size > 1 else 1
    p.held["weights"] = m.weight_bytes // shards
    p.held["optimizer state (AdamW, 2 moments)"] = 2 * m.trainable_bytes // shards
    if config.train.ema_decay > 0:
        p.held["weight average (train.ema_decay)"] = m.trainable_bytes
    if sampling_copy:
        p.held["sampling copy of the policy"] = m.weight_bytes
    p.held["runtime (" + ("CUDA context" if p.device.kind == "cuda" else "interpreter + libraries") + ")"] = \
        RUNTIME_BYTES[p.device.kind]
    if shards > 1:
        p.update["one decoder layer gathered (FSDP)"] = m.largest_layer * m.weight_bytes // max(m.parameters, 1)
        p.notes.append(f"FSDP over {shards} ranks: weights, gradients and optimizer state sharded; sampling and "
                       f"evaluation gather the whole policy (counted under sampling)")


def _autocast(config: Config) -> bool:
    return config.run.mixed_precision == "bf16"


def _trained_inputs(config: Config, m: ModelSize) -> tuple[int, int]:
    """(bytes, LoRA ranks) a Llama-style block saves per token beyond its fixed ones for its linear layers:
    the input of each one that trains or carries an adapter (for the weight's or adapter's gradient), and
    for an adapter the rank-r product (for B's gradient). Where the input reaches the layer as it is, the
    layers that read it share one saved copy (q/k/v one, gate/up another; o_proj's input is the attention
    output, which attention saves anyway). Each layer saves its own copy where it is cast first: under
    autocast every such layer's input in bf16, and on bf16 weights every adapter's input in fp32, the
    dtype peft keeps adapters in (measured with saved-tensor hooks, tests/test_plan.py)."""
    lora = config.lora.r > 0
    targets = set(config.lora.target_modules)
    every = not lora or "all-linear" in targets
    width = {"q_proj": m.hidden, "k_proj": m.hidden, "v_proj": m.hidden, "o_proj": m.hidden, "gate_proj": m.hidden,
             "up_proj": m.hidden, "down_proj": m.intermediate}  # each projection's input features
    saving = [name for name in PROJECTIONS if every or name in targets]
    ranks = _adapted(config) * config.lora.r
    if _autocast(config):
        return 2 * sum(width[name] for name in saving), ranks
    if lora and config.model.dtype != "fp32":
        return 4 * sum(width[name] for name in saving), ranks
    shared = (m.hidden if {"q_proj", "k_proj", "v_proj"} & set(saving) else 0) + \
        (m.hidden if {"gate_proj", "up_proj"} & set(saving) else 0) + (m.intermediate if "down_proj" in saving else 0)
    return shared * _act_bytes(config), ranks


def _activations(config: Config, p: Plan, rows: float, tokens_per_row: float, prompt_tokens: float) -> dict[str, int]:
    """The update's memory for one micro-batch: activations kept for backward, logits and their gradient.
    A Llama-style block keeps per token (measured with saved-tensor hooks, tests/test_plan.py): its two
    norms' inputs in fp32, the rotated queries, keys, values and attention output, the MLP's gate, its
    activation and up (4 hidden + 2 KV + 3 MLP widths), plus `_trained_inputs`."""
    m, b = p.model, _act_bytes(config)
    tokens = rows * tokens_per_row + prompt_tokens
    if m.llama_like:
        inputs, ranks = _trained_inputs(config, m)
        per_token_layer = (2 * m.hidden * 4 + (2 * m.hidden + 2 * m.kv_width + 3 * m.intermediate) * b + inputs
                           + ranks * 4)  # bytes: norms in fp32, an adapter's products in fp32
    else:  # the built-in GPT: attention written out, its (T x T) weights kept per head
        per_token_layer = (18 * m.hidden + 8 * (p.lengths.prompt + p.lengths.completion)) * b
    if config.model.gradient_checkpointing:
        kept = tokens * m.hidden * m.layers * b + tokens * per_token_layer  # layer inputs + one block recomputed
        label = "activations (checkpointed: layer inputs + 1 block)"
    else:
        kept = tokens * per_token_layer * m.layers
        label = "activations kept for backward"
    scored = rows * p.lengths.completion
    parts = {label: int(kept), "logits and their gradient": int(2 * scored * m.vocab * b)}
    if _autocast(config) and config.model.dtype == "fp32":  # each linear layer multiplies a bf16 copy of its weight
        kept_copies = m.vocab * m.hidden + m.largest_layer if config.model.gradient_checkpointing else m.linear
        parts["weights cast to bf16 (autocast), kept for backward"] = 2 * kept_copies
    return parts


def _kv(p: Plan, rows: float, tokens: float, b: int) -> int:
    return int(2 * p.model.layers * p.model.kv_width * tokens * rows * b)


def _rl_memory(config: Config, p: Plan) -> None:
    t, a, r, m = config.train, config.algo, config.rollout, p.model
    colocated_workers = r.workers if config.distributed.backend == "ray" and 0 < r.worker_gpus < 1 else 0
    _held(config, p, sampling_copy=r.overlap)
    if colocated_workers:
        p.held[f"{colocated_workers} colocated Ray rollout worker(s)"] = colocated_workers * m.weight_bytes
    if a.kl_coef > 0 and not m.lora:
        p.held["KL reference (frozen copy)"] = m.weight_bytes
    if a.name == "ppo" and a.value_model == "separate":
        p.held["value model (weights, gradients, AdamW)"] = m.weight_bytes + 3 * m.trainable_bytes
    if r.engine == "vllm":
        if p.memory_gb is None:
            p.notes.append("rollout.engine=vllm takes rollout.gpu_memory_utilization of the device: give "
                           "--device-memory to count it")
        else:
            p.held["vLLM (rollout.gpu_memory_utilization)"] = int(r.gpu_memory_utilization * p.memory_gb * 1e9)
            p.notes.append("vLLM holds its own weight copy and KV cache inside its share")
    rows_per_rank = t.rollout_size / p.world_size
    rows = rows_per_rank / t.ga_steps
    L = p.lengths
    shared = _shares_prompts(config, p)
    if shared:  # each distinct prompt runs once into a cache the group's rows share
        per_row, prompts = L.completion, rows / a.group_size * L.prompt
    else:
        per_row, prompts = L.prompt + L.completion, 0
    p.update["gradients (trainable)"] = m.trainable_bytes // (p.world_size if config.distributed.strategy == "fsdp"
                                                              else 1)
    p.update.update(_activations(config, p, rows, per_row, prompts))
    if shared:  # the completions attend to the prompt's cache expanded to every row, through a mask
        b_act = _act_bytes(config)
        extra = 2 * rows * L.prompt * m.kv_width * m.layers * b_act
        if p.device.kind == "cpu":  # a masked attention on the CPU keeps its probabilities (measured)
            extra += rows * m.heads * L.completion * (L.prompt + L.completion) * 4 * m.layers
        p.update["prompt cache shared by the rows"] = int(extra)
    b = 4 if config.model.dtype == "fp32" else 2  # the sampling loop's cache takes the weights' dtype
    if config.distributed.strategy == "fsdp" and p.world_size > 1:
        p.sampling["whole policy, gathered"] = m.weight_bytes - p.held["weights"]
    if p.device.kind == "cpu" and m.packable and r.engine != "vllm":  # generation/packed_linear.py: one copy per call
        copy = 2 if config.run.mixed_precision == "bf16" else (4 if config.model.dtype == "fp32" else 2)
        p.sampling["weights packed for sampling (CPU)"] = m.packable * copy
    if r.engine != "vllm":
        p.sampling[f"KV cache ({rows_per_rank:g} rows x {L.prompt + L.completion} tokens)"] = \
            _kv(p, rows_per_rank, L.prompt + L.completion, b)
    eval_rows = min(config.eval.batch_size, config.eval.size)
    evaluation = _kv(p, eval_rows, L.prompt + L.completion, b)
    kv = [k for k in p.sampling if k.startswith("KV cache")]
    if kv and evaluation > p.sampling[kv[0]]:
        del p.sampling[kv[0]]
        p.sampling[f"KV cache (evaluation: {eval_rows} rows)"] = evaluation
    if not shared and config.model.type == "hf" and a.group_size > 1:
        why = ("gradient checkpointing" if config.model.gradient_checkpointing else
               "FSDP" if config.distributed.strategy == "fsdp" else
               "this GPU (launching its extra passes would cost more than the prompt work they save)")
        p.notes.append(f"the learner's shared-prompt pass is off under {why}: every row runs its prompt")


def _offline_memory(config: Config, p: Plan) -> None:
    d, m = config.data, p.model
    _held(config, p, sampling_copy=False)
    if config.run.trainer == "dpo" and not m.lora:
        p.held["DPO reference (frozen copy)"] = m.weight_bytes
    rows = d.batch_size / p.world_size / config.train.ga_steps
    L = p.lengths
    pair = config.run.trainer in ("dpo", "reward")
    per_row = L.prompt + (2 if pair else 1) * L.completion  # a pair: its prompt once, both replies after it
    p.update["gradients (trainable)"] = m.trainable_bytes
    acts = _activations(config, p, rows, per_row, 0)
    if config.run.trainer == "reward":  # one score per side: no vocabulary-wide logits
        acts.pop("logits and their gradient")
    elif pair:  # both replies' positions are scored
        acts["logits and their gradient"] *= 2
    p.update.update(acts)
    p.sampling = {}


def _this_device(run_device: str) -> str:
    """The DEVICES entry for this machine: its GPU when the run would use one (by name; h100 for another
    GPU), else the CPU."""
    if run_device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    gpu = torch.cuda.get_device_name(0).lower()
    return next((name for name in DEVICES if name != "cpu" and name in gpu), "h100")


def _host_memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


# ------------------------------------------------------------------------------------------ time

def _step_time(config: Config, p: Plan) -> dict[str, float]:
    """Seconds of one step's sampling and update, from counted work (see the module docstring)."""
    m, dev, L = p.model, p.device, p.lengths
    flops = dev.matmul_tflops * 1e12 * MATMUL_EFFICIENCY
    bandwidth = dev.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY
    forward_per_token = 2 * m.parameters
    backward = 1 if m.lora else 2  # LoRA: activation gradients only; full: weight gradients too
    recompute = 1 if config.model.gradient_checkpointing else 0
    if config.run.trainer != "rl":
        d = config.data
        pair = config.run.trainer in ("dpo", "reward")
        tokens = d.batch_size / p.world_size * (L.prompt + (2 if pair else 1) * L.completion)
        reference = 1 if config.run.trainer == "dpo" else 0
        update = tokens * forward_per_token * (1 + backward + recompute + reference) / flops
        pass_kind = "checkpointed" if recompute else "one pass" if p.device.kind == "cuda" else "common start"
        update = max(update, config.train.ga_steps * _update_launch(config, p, pass_kind))
        return {"update": update, "step": update}
    t, a = config.train, config.algo
    rows = t.rollout_size / p.world_size
    prompts = rows / a.group_size
    prefill = prompts * L.prompt * forward_per_token / flops
    launch, kv_bytes = _decode_launch(config, p), 2 if config.model.dtype == "bf16" else 4

    def decode(n_rows: float) -> float:  # one decode step per new token, each the slowest of its bounds
        total = 0.0
        for n in range(L.completion):
            compute = n_rows * forward_per_token / flops
            memory = (m.weight_bytes + _kv(p, n_rows, L.prompt + n, kv_bytes)) / bandwidth
            total += max(compute, memory, launch)
        return total

    sampling = prefill + decode(rows)
    if ALGORITHMS[a.name].greedy_baseline:  # ReMax: each prompt decoded greedily once more
        sampling += prefill + decode(prompts)
    shared = _shares_prompts(config, p)
    learner_tokens = rows * L.completion + (prompts if shared else rows) * L.prompt
    passes = 1 + backward + recompute
    passes += 1 if a.kl_coef > 0 else 0  # the reference's log-probs
    passes += 1 if (a.ppo_epochs > 1 or 0 < a.minibatch_size < t.rollout_size) else 0  # old log-probs
    update = learner_tokens * forward_per_token * passes * a.ppo_epochs / flops
    pass_kind = ("checkpointed" if recompute else "shared prompts" if shared else
                 "one pass" if p.device.kind == "cuda" else "common start")
    update = max(update, t.ga_steps * a.ppo_epochs * _update_launch(config, p, pass_kind))
    return {"sampling": sampling, "update": update, "step": sampling + update}


def _shares_prompts(config: Config, p: Plan) -> bool:
    """Whether the learner's pass runs each distinct prompt once (`HFPolicy._forward_shared_prompts`): an
    HF policy on groups of completions, without gradient checkpointing or FSDP, and on a GPU only where
    the prompt work saved outweighs the extra passes' launches (`launch_costs.prompt_sharing_pays`)."""
    t, a = config.train, config.algo
    if (config.model.type != "hf" or config.model.gradient_checkpointing or a.group_size <= 1
            or config.distributed.strategy == "fsdp"):
        return False
    if p.device.kind != "cuda":
        return True
    return prompt_sharing_pays(parameters=p.model.parameters, layers=p.model.layers,
                               rows=max(1, int(t.rollout_size / p.world_size / t.ga_steps)),
                               prompt_tokens=p.lengths.prompt, adapted_share=_adapted_share(config),
                               pass_flops=p.device.matmul_tflops * 1e12 * MATMUL_EFFICIENCY,
                               op_seconds=p.device.op_us * 1e-6)


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # a Llama block's


def _adapted(config: Config) -> int:
    """How many of a layer's projections carry a LoRA adapter (0 without LoRA)."""
    if config.lora.r <= 0:
        return 0
    targets = set(config.lora.target_modules)
    return len(PROJECTIONS) if "all-linear" in targets else sum(n in targets for n in PROJECTIONS)


def _adapted_share(config: Config) -> float:
    return _adapted(config) / len(PROJECTIONS)


def _decode_launch(config: Config, p: Plan) -> float:
    """The host's floor under one decode step: its operations x their cost, the layers' replayed as one
    CUDA graph where the sampling loop does so (an HF policy's own loop on a GPU, outside autocast)."""
    dev, layers = p.device, p.model.layers * layer_ops(DECODE_OPS, _adapted_share(config))
    graphed = (dev.kind == "cuda" and config.model.type == "hf" and config.rollout.engine == "local"
               and config.run.mixed_precision != "bf16")
    return ((layers * (dev.graph_op_us if graphed else dev.op_us)) + DECODE_FIXED_OPS * dev.op_us) * 1e-6


def _update_launch(config: Config, p: Plan, pass_kind: str) -> float:
    """The host's floor under one micro-batch of the update: its operations x their eager cost."""
    ops = p.model.layers * layer_ops(UPDATE_OPS[pass_kind], _adapted_share(config)) + UPDATE_FIXED_OPS
    return ops * p.device.op_us * 1e-6


def _config_name(config: Config) -> str:
    return config.run.name

