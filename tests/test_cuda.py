"""What only a CUDA GPU can show (marker `cuda`; every test here is skipped without one, and
`scripts/gpu_check.sh` runs them on a GPU machine): the sampling loop's recorded log-probs equal the
learner's on CUDA, its greedy decoding equals `model.generate` there, its decode step replays as a
CUDA graph and samples what the eager step samples, a bf16 mixed-precision step trains, a LoRA GRPO
step in bf16 weights trains only the adapter, and the CPU-only fast path (weights prepacked for
oneDNN) stays out of a CUDA model's way. The models are tiny and built here (the tokenizer is
SmolLM2's, from scripts/gpu_check_assets): no hub, no network, and nothing the GPU machine lacks
(no gguf, no math-verify)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")]


from lmrl.generation.hf_generate import generate  # noqa: E402
from lmrl.generation.packed_linear import packed_linears, packing_available  # noqa: E402
from tests.conftest import TINY  # noqa: E402
from tests.test_hf_generate import PAD, VOCAB, peaked_llama  # noqa: E402

GPU_CHECK = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def llama():
    """tests/test_hf_generate.py's peaked Llama, on the GPU in fp32."""
    return peaked_llama().cuda()


@pytest.fixture(scope="module")
def prompts():
    """Six ragged prompts, left-padded, on the GPU."""
    g = torch.Generator().manual_seed(1)
    lengths = [5, 4, 9, 7, 4, 9]
    ids = torch.full((len(lengths), max(lengths)), PAD)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, -n:] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[i, -n:] = 1
    return ids.cuda(), mask.cuda()


def _full_forward_logprobs(model, ids, mask, completion, cmask, temperature):
    full = torch.cat([ids, completion], 1)
    fmask = torch.cat([mask, cmask.long()], 1)
    pos = (fmask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=fmask, position_ids=pos).logits
    logits = logits[:, ids.size(1) - 1:-1].float() / temperature
    logp = F.log_softmax(logits, -1).gather(-1, completion[..., None]).squeeze(-1)
    return logp.masked_fill(cmask == 0, 0.0)


def test_sampling_loop_logprobs_on_cuda_equal_a_full_forward_recomputation(llama, prompts):
    ids, mask = prompts
    completion, cmask, logprobs = generate(llama, ids, mask, 16, eos_token_ids=[VOCAB + 5], pad_token_id=PAD,
                                           temperature=0.7, generator=torch.Generator("cuda").manual_seed(0))
    assert completion.is_cuda and logprobs.is_cuda and completion.shape == (6, 16)
    ref = _full_forward_logprobs(llama, ids, mask, completion, cmask, 0.7)
    assert torch.allclose(logprobs, ref, atol=1e-3), (logprobs - ref).abs().max()
    again = generate(llama, ids, mask, 16, eos_token_ids=[VOCAB + 5], pad_token_id=PAD, temperature=0.7,
                     generator=torch.Generator("cuda").manual_seed(0))[0]
    assert torch.equal(again, completion), "a seeded CUDA generator must reproduce the samples"


def test_greedy_sampling_loop_on_cuda_equals_hf_generate(llama, prompts):
    ids, mask = prompts
    with torch.no_grad():
        ref = llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                             eos_token_id=VOCAB + 1, pad_token_id=PAD)[:, ids.size(1):]
    completion = generate(llama, ids, mask, 12, eos_token_ids=[VOCAB + 1], pad_token_id=PAD, greedy=True)[0]
    assert torch.equal(completion, ref)


@pytest.mark.parametrize("options", [dict(temperature=0.7),
                                     dict(temperature=0.7, top_k=20, min_p=0.05, repetition_penalty=1.3)], ids=str)
def test_the_decode_step_is_replayed_as_a_cuda_graph_and_samples_as_the_eager_loop(llama, prompts, monkeypatch,
                                                                                   options):
    """The sampling options (the penalty's seen-token mask included) run on the graph's logits, outside it."""
    from lmrl.generation import decode_graph

    ids, mask = prompts
    replays = []
    replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: (replays.append(1), replay(graph))[1])

    def run(**kw):
        return generate(llama, ids, mask, 16, eos_token_ids=[VOCAB + 1], pad_token_id=PAD,
                        generator=torch.Generator("cuda").manual_seed(0), **options, **kw)

    graphed = run()
    assert type(llama) not in decode_graph._capture_failed
    assert len(replays) == 14  # 16 tokens: the 1st from the prefill, the 2nd's step eager, then 14 replays
    eager = run(cuda_graph=False, cache="static", compact_at=None)  # the same step on the same buffers, eager
    assert len(replays) == 14
    assert torch.equal(graphed[0], eager[0]) and torch.equal(graphed[1], eager[1])
    torch.testing.assert_close(graphed[2], eager[2], rtol=1e-5, atol=1e-5)


def test_a_small_model_on_cuda_scores_its_rows_in_one_pass_instead_of_sharing_prompts():
    """Launch-bound: the shared-prompt pass's two extra passes cost more than a small model's prompt work."""
    from types import SimpleNamespace

    from lmrl.models.hf import HFPolicy

    stub = SimpleNamespace(_parameters_count=None, model=torch.nn.Linear(4, 4),
                           config=SimpleNamespace(num_hidden_layers=30))
    ids = torch.zeros(8, 218, dtype=torch.long, device="cuda")
    assert not HFPolicy._sharing_pays(stub, ids, 128)
    assert stub._parameters_count == 20
    assert HFPolicy._sharing_pays(stub, ids.cpu(), 128)


def test_the_cpu_prepacked_linear_path_is_not_used_on_cuda():
    """`packed_linears` replaces wide CPU layers' forward (oneDNN); on a CUDA model it must change nothing."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))
    if packing_available():  # the same model on the CPU does get the packed path: the check below can fail
        with packed_linears(model, rows=8):
            assert all("forward" in vars(layer) for layer in model)
    model = model.cuda()
    x = torch.randn(8, 512, device="cuda")
    with torch.inference_mode():
        expected = model(x)
        with packed_linears(model, rows=8):
            assert not any("forward" in vars(layer) for layer in model)
            assert torch.equal(model(x), expected)


def test_a_bf16_mixed_precision_rl_run_on_cuda_trains_fp32_weights(tmp_path):
    from lmrl.config import load_config
    from lmrl.train.rl_trainer import RLTrainer

    cfg = load_config("adder", TINY + [f"run.dir={tmp_path / 'run'}", "run.device=cuda", "run.mixed_precision=bf16",
                                       "train.steps=4"])
    trainer = RLTrainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    summary = trainer.train()
    assert summary["rl_steps"] == 4
    params = dict(trainer.model.named_parameters())
    assert all(p.is_cuda and p.dtype == torch.float32 for p in params.values())
    assert any(not torch.equal(params[n], before[n]) for n in before), "the update changed nothing"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/policy_loss"] for r in rows if "train/policy_loss" in r]
    assert losses and all(torch.isfinite(torch.tensor(losses)))


class DistinctCharacters:
    """A reward for random models: the number of distinct characters of a completion (varies, so
    advantages and updates are not zero)."""

    def __call__(self, prompts, completions, **kwargs):
        return [float(len(set(c))) for c in completions]


@pytest.fixture(scope="module")
def smollm2_shaped(tmp_path_factory):
    """A 2-layer Llama with SmolLM2's tokenizer and chat template, bf16 weights, saved as a model dir,
    and 2-digit addition prompts as train/test JSONL."""
    from lmrl.tasks.word_problems import write_addition_chat

    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    root = tmp_path_factory.mktemp("cuda-hf")
    model_dir = gpu_check.random_model_dir("smollm2", root, cpu=True)  # the tiny shape, drawn on the CPU
    write_addition_chat(root / "data", n_train=32, n_test=8, seed=0)
    return root, model_dir


def test_a_lora_grpo_run_in_bf16_weights_on_cuda_trains_only_the_adapter(smollm2_shaped, tmp_path):
    from lmrl.config import load_config
    from lmrl.train.rl_trainer import RLTrainer

    root, model_dir = smollm2_shaped
    cfg = load_config("math-grpo-qwen-gpu", [
        f"model.path={model_dir}", "task.name=prompts", "task.generate=",
        f"task.train_file={root / 'data/train.jsonl'}",
        f"task.test_file={root / 'data/test.jsonl'}", "reward.cls=tests.test_cuda:DistinctCharacters",
        "algo.skip_zero_advantage=false", "task.max_new_tokens=8", "train.steps=2", "train.rollout_size=16",
        "algo.group_size=4", "train.ga_steps=2", "train.eval_every=1000", "train.ckpt_every=1000", "eval.size=4",
        "eval.batch_size=4", "run.device=cuda", "run.progress=false", "run.tensorboard=false",
        f"run.dir={tmp_path / 'run'}", "optim.lr=1e-2"])
    trainer = RLTrainer(cfg)
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    adapter = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    summary = trainer.train()
    assert summary["rl_steps"] == 2
    params = dict(trainer.model.named_parameters())
    assert all(p.is_cuda for p in params.values())
    assert {params[n].dtype for n in frozen} == {torch.bfloat16}
    assert all(torch.equal(params[n], frozen[n]) for n in frozen), "a frozen base weight changed"
    assert any(not torch.equal(params[n], adapter[n]) for n in adapter), "the adapter did not train"
