"""A user's own vLLM script, as a user writes it, with nothing of this project in it.

``python vllm_serve.py MODEL_DIR [REQUESTS OUTPUT_TOKENS]``: serves REQUESTS prompts of different
lengths, and one more that starts as an earlier one does, with vLLM's offline ``LLM``, and prints
the prompt and output tokens it got back.
"""

import sys

from vllm import LLM, SamplingParams

WORDS = "the quick brown fox jumps over the lazy dog while a neuron device runs the model".split()


def main(model: str, requests: int = 6, output_tokens: int = 8) -> None:
    prompts = [" ".join(WORDS[: 3 + (5 * i) % len(WORDS)] * (1 + i % 3)) for i in range(requests)]
    prompts.append(prompts[2] + " once more")  # shares its first blocks with an earlier prompt: the prefix cache
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=4,
              block_size=32, max_num_batched_tokens=64, gpu_memory_utilization=0.5, seed=0)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True),
                           use_tqdm=False)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    output = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"served {len(outputs)} requests: {prompt_tokens} prompt tokens, {output} output tokens")


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:4]))
