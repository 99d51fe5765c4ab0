"""Greedy (and seeded sampled) tokens from vLLM's ``LLM`` for the prompts of a JSON spec; prints one JSON line.

Run with the vLLM environment's python: ``vllm_generate.py SPEC_JSON``. The spec
names the model, the prompts, ``eager``, ``tp`` and any sampled requests; the
platform is whatever vLLM picks (neuron while the plugin is on, the CPU with
``TORCHNEURON_VLLM=0``).
"""

import json
import sys


def main(spec: dict) -> dict:
    import torch
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=spec.get("eager", True),
              tensor_parallel_size=spec.get("tp", 1), max_model_len=256, max_num_seqs=8, seed=0,
              enable_prefix_caching=spec.get("prefix_caching", True), block_size=32,
              enable_chunked_prefill=True, max_num_batched_tokens=spec.get("max_batched", 64),
              kv_cache_memory_bytes=spec.get("kv_bytes"), gpu_memory_utilization=spec.get("util", 0.9))
    greedy = SamplingParams(max_tokens=spec.get("max_tokens", 12), temperature=0.0, ignore_eos=True)
    outputs = llm.generate(spec["prompts"], greedy, use_tqdm=False)
    result = {"greedy": [list(o.outputs[0].token_ids) for o in outputs],
              "prompt_ids": [list(o.prompt_token_ids) for o in outputs]}
    if spec.get("sampled"):
        sampled = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=spec["sampled"], ignore_eos=True)
        runs = [llm.generate(spec["prompts"][:2], sampled, use_tqdm=False) for _ in range(2)]
        result["sampled"] = [[list(o.outputs[0].token_ids) for o in run] for run in runs]
    from vllm.platforms import current_platform

    result["platform"] = current_platform.device_type
    if current_platform.device_type == "neuron":
        result["worker_memory"] = llm.collective_rpc("device_memory")
    result["num_gpu_blocks"] = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    del llm
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
