"""Greedy transcription tokens from vLLM's ``LLM`` for a Whisper model and WAV files; prints one JSON line.

Run with the vLLM environment's python: ``vllm_whisper.py SPEC_JSON``. The spec names the
model, the WAV files (16 kHz mono, read with the ``wave`` module), ``max_tokens`` and ``eager``;
the platform is whatever vLLM picks (neuron while the plugin is on, the CPU with
``TORCHNEURON_VLLM=0``). Each request is Whisper's encoder-decoder prompt: the audio for the
encoder, ``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`` for the decoder. With
``endpoint_wav``, one more request has that file as the transcription endpoint decodes an
upload (vLLM's ``load_audio``, which gives 16-bit samples unscaled when it need not resample).
"""

import json
import sys
from io import BytesIO
from pathlib import Path

DECODER_PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"


def main(spec: dict) -> dict:
    import numpy as np
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vllm_tiny_whisper import SAMPLE_RATE, read_wav

    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=spec.get("eager", True), max_model_len=128,
              max_num_seqs=8, seed=0, block_size=32, max_num_batched_tokens=256,
              kv_cache_memory_bytes=spec.get("kv_bytes"), gpu_memory_utilization=spec.get("util", 0.9),
              limit_mm_per_prompt={"audio": 1})
    audios = [np.array(read_wav(path), dtype=np.float32) for path in spec["wavs"]]
    if spec.get("endpoint_wav"):
        # The same file decoded as the transcription endpoint decodes an upload (vLLM's load_audio).
        from vllm.multimodal.media.audio import load_audio

        audios.append(load_audio(BytesIO(Path(spec["endpoint_wav"]).read_bytes()), sr=SAMPLE_RATE)[0])
    prompts = [{"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio, SAMPLE_RATE)}},
                "decoder_prompt": DECODER_PROMPT} for audio in audios]
    params = SamplingParams(max_tokens=spec.get("max_tokens", 16), temperature=0.0, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    result = {"tokens": [list(o.outputs[0].token_ids) for o in outputs],
              "text": [o.outputs[0].text for o in outputs],
              "prompt_ids": [list(o.prompt_token_ids) for o in outputs],
              "platform": current_platform.device_type}
    if current_platform.device_type == "neuron":
        result["worker_memory"] = llm.collective_rpc("device_memory")
    del llm
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
