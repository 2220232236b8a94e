"""Tasks: where prompts come from and how completions are scored."""

from .arithmetic import ArithmeticTask


def build_task(cfg) -> ArithmeticTask:
    """The task described by the `task` config section."""
    return ArithmeticTask(name=cfg.name, ndigit=cfg.ndigit, use_format=cfg.use_format,
                          reverse_answer=cfg.reverse_answer, reward=cfg.reward, heldout_size=cfg.heldout_size)


__all__ = ["ArithmeticTask", "build_task"]
