"""A small Whisper with random weights, a Whisper tokenizer and feature extractor built offline, saved as a model directory.

Run as ``python vllm_tiny_whisper.py DIR``. The audio window is 2 s (``chunk_length=2``:
200 mel frames, 100 encoder positions) instead of 30 s, so the encoder is cheap. The weights
are drawn larger than Whisper's default init and the output embedding (tied to the decoder's
input embedding) is scaled so that the logits are far from flat and greedy decoding gives
varied tokens that depend on the audio; special tokens and ``<|endoftext|>`` get zero logits,
so the text is ordinary tokens and decoding runs to ``max_tokens``. ``sine_wav(path, hz)`` writes a test WAV with the
standard library's ``wave`` module.
"""

import json
import math
import struct
import sys
import wave
from pathlib import Path

TEXT = ["the quick brown fox jumps over the lazy dog", "hello world, this is a small test of speech",
        "a neuron device transcribes the audio", "tokens come one at a time from the decoder"] * 8
SAMPLE_RATE = 16000
CHUNK_SECONDS = 2


def sine_wav(path: str, hz: float, seconds: float = 1.5, amplitude: float = 0.5) -> str:
    """A mono 16-bit 16 kHz WAV of a sine wave."""
    n = int(seconds * SAMPLE_RATE)
    frames = b"".join(struct.pack("<h", int(round(amplitude * 32767 * math.sin(2 * math.pi * hz * i / SAMPLE_RATE))))
                      for i in range(n))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(frames)
    return str(path)


def read_wav(path: str) -> list[float]:
    """The samples of a 16-bit mono WAV as floats in [-1, 1) (x / 32768, as FFmpeg converts s16 to float)."""
    with wave.open(str(path), "rb") as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1
        raw = w.readframes(w.getnframes())
    return [s / 32768.0 for (s,) in struct.iter_unpack("<h", raw)]


def build(directory: str, d_model: int = 128, layers: int = 2, heads: int = 4) -> str:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperProcessor
    from transformers import WhisperTokenizer
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tokenizer = WhisperTokenizer(vocab=state["vocab"], merges=merges)
    specials = (["<|startoftranscript|>"] + [f"<|{code}|>" for code in LANGUAGES]
                + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                   "<|notimestamps|>"])
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    features = WhisperFeatureExtractor(feature_size=80, sampling_rate=SAMPLE_RATE, chunk_length=CHUNK_SECONDS)
    WhisperProcessor(feature_extractor=features, tokenizer=tokenizer).save_pretrained(root)

    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in ("<|endoftext|>", "<|startoftranscript|>")}
    config = WhisperConfig(vocab_size=len(tokenizer), num_mel_bins=80, d_model=d_model,
                           encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
                           decoder_attention_heads=heads, encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
                           max_source_positions=features.nb_max_frames // 2, max_target_positions=128,
                           pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"],
                           eos_token_id=ids["<|endoftext|>"], decoder_start_token_id=ids["<|startoftranscript|>"],
                           suppress_tokens=[], begin_suppress_tokens=[], torch_dtype="float32")
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    decoder = model.model.decoder
    with torch.no_grad():  # larger weights than the default init: logits far from flat, tokens that vary
        for name, p in model.named_parameters():
            if p.dim() > 1 and "embed_positions" not in name:
                p.normal_(0.0, 0.1)
        decoder.embed_tokens.weight.mul_(3.0)  # tied to proj_out: the logits' scale
        # Large learned positions: the next token depends on where it is, not only on the last one.
        decoder.embed_positions.weight.normal_(0.0, 2.0)
        # Special tokens (and <|endoftext|>) get zero logits: text tokens win, and decoding runs to max_tokens.
        decoder.embed_tokens.weight[ids["<|endoftext|>"]] = 0.0
        decoder.embed_tokens.weight[ids["<|startoftranscript|>"]:] = 0.0
    model.generation_config.forced_decoder_ids = None
    model.save_pretrained(root, safe_serialization=True)
    json.dump({"built_by": "tests/data/vllm_tiny_whisper.py"}, open(root / "tiny.json", "w"))
    return str(root)


if __name__ == "__main__":
    print(build(sys.argv[1]))
