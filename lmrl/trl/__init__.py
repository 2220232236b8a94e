"""TRL's scripts and trainer calls on lmrl, unchanged but for the import: `from trl import ...` becomes
`from lmrl.trl import ...`.

    from lmrl.trl import GRPOConfig, GRPOTrainer          # was: from trl import GRPOConfig, GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(c)) for c in completions]

    args = GRPOConfig(output_dir="runs/grpo", learning_rate=1e-5, num_generations=4, max_steps=50)
    trainer = GRPOTrainer(model="path/to/model", reward_funcs=reward_len, args=args, train_dataset=dataset)
    trainer.train()
    trainer.save_model()                                   # output_dir: what from_pretrained loads

- configs (`configs`): `GRPOConfig`, `RLOOConfig`, `DPOConfig`, `SFTConfig`, `RewardConfig` are TRL's
  dataclasses, so `TrlParser`, `--config file.yaml`, `to_dict()` and every default are TRL's; each field
  is carried into lmrl's run, has no effect (named in the run log when set), or is refused with the
  reason when set to what lmrl cannot do: `fields` is that table (docs/trl-fields.md is generated from it);
- trainers (`trainers`): `GRPOTrainer`, `RLOOTrainer`, `DPOTrainer`, `SFTTrainer`, `RewardTrainer`, with
  the `transformers.Trainer` surface TRL's scripts use (state, callbacks, save_model, resume, ...);
  RLOOTrainer is lmrl's rloo with TRL's RLOO loss (one clipped ratio per completion, the ratio of its
  probabilities; the KL to the reference, k1, in the reward);
- scripts (`scripts`): TRL's own `trl/scripts/*.py` run on lmrl (`lmrl trl grpo ARGS`, `lmrl trl rloo ARGS`);
- TRL's helpers the scripts import are TRL's own: `TrlParser`, `ScriptArguments`, `ModelConfig`,
  `DatasetMixtureConfig`, `get_dataset`, `get_peft_config`, `get_quantization_config`, and
  `lmrl.trl.rewards` (TRL's reward functions); so is every other name TRL exports that lmrl does not
  replace (`apply_chat_template`, `clone_chat_template`, `pack_dataset`, the callbacks, `__version__`, ...),
  loaded from TRL on first use; the trainers lmrl does not run (`KTOTrainer`, `DistillationTrainer`)
  are refused with what to use instead.

The model is a path (a local directory, a .gguf file, or a packaged name such as
smollm2-135m-instruct) or a loaded transformers model with its tokenizer as `processing_class`; data
sets are `datasets.Dataset`s or lists of dicts in TRL's formats. Needs the `trl` extra."""

# Loaded on first use: `lmrl trl` and `lmrl.trl.scripts` name the scripts without importing TRL.
_FROM_TRL = ("DatasetMixtureConfig", "ModelConfig", "ScriptArguments", "TrlParser", "get_dataset", "get_peft_config",
             "get_quantization_config")
_OURS = {"DPOConfig": "configs", "GRPOConfig": "configs", "RewardConfig": "configs", "RLOOConfig": "configs",
         "SFTConfig": "configs", "DPOTrainer": "trainers", "GRPOTrainer": "trainers", "RewardTrainer": "trainers",
         "RLOOTrainer": "trainers", "SFTTrainer": "trainers"}

_MODULES = ("configs", "fields", "rewards", "scripts", "trainers")  # lmrl.trl's own, never TRL's of the same name
# TRL's trainers lmrl does not run: the import fails with what to use instead
_REFUSED = {"KTOConfig": "KTO (unpaired preferences) is not an lmrl trainer: use DPOTrainer on paired rows",
            "KTOTrainer": "KTO (unpaired preferences) is not an lmrl trainer: use DPOTrainer on paired rows",
            "DistillationConfig": "distillation is not an lmrl trainer: use SFTTrainer on the teacher's outputs",
            "DistillationTrainer": "distillation is not an lmrl trainer: use SFTTrainer on the teacher's outputs"}

__all__ = sorted([*_FROM_TRL, *_OURS])


def __getattr__(name: str):
    import importlib

    if name in _OURS:
        return getattr(importlib.import_module(f"{__name__}.{_OURS[name]}"), name)
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _REFUSED:
        raise ImportError(f"lmrl.trl.{name}: {_REFUSED[name]}")
    if name in _FROM_TRL or (not name.startswith("__") or name == "__version__"):
        trl = importlib.import_module("trl")
        if hasattr(trl, name):  # anything else TRL exports, TRL's own
            return getattr(trl, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
