"""Tasks: where prompts come from and how completions are scored.

Imports are lazy, so a light module (e.g. `math_reward`, which reward worker processes import)
does not pull in torch through this package."""


def build_task(cfg):
    """The task described by the `task` config section."""
    from .arithmetic import ArithmeticTask

    return ArithmeticTask(name=cfg.name, ndigit=cfg.ndigit, use_format=cfg.use_format,
                          reverse_answer=cfg.reverse_answer, reward=cfg.reward, heldout_size=cfg.heldout_size)


def __getattr__(name):
    if name == "ArithmeticTask":
        from .arithmetic import ArithmeticTask

        return ArithmeticTask
    raise AttributeError(f"module 'lmrl.tasks' has no attribute {name!r}")


__all__ = ["ArithmeticTask", "build_task"]
