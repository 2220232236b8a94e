"""TRL's reward functions (`trl.rewards`: accuracy_reward, think_format_reward, ...), for scripts that
import them from `lmrl.trl.rewards`: they are plain functions with TRL's calling convention, which
lmrl's GRPO calls as TRL does."""

from trl.rewards import *  # noqa: F401,F403
from trl.rewards import __all__  # noqa: F401
