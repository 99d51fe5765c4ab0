"""Programs to project from the command line: the demo's GPT, a Llama training step, Whisper.

    torchneuron project --target trn2.48xlarge --compare p5.48xlarge -m torchneuron.projection.workloads gpt
    torchneuron project --fake --target trn1.32xlarge@dp=4:tp=8:microbatches=8 \\
        --compare p5.48xlarge@dp=4:tp=8:microbatches=8 -m torchneuron.projection.workloads llama --model llama3-8b
    python -m torchneuron.projection.workloads whisper --model whisper-medium

``gpt`` and ``llama`` are ordinary training loops (run them under ``torchneuron project``, which
counts them); each marks its steps with the tokens they processed and declares the model's layers
and hidden size. ``llama`` builds the model on the neuron device, so a model larger than this
machine needs ``--fake``. ``whisper`` prints the transcription projection (hours of audio per
dollar) itself: serving is projected from counted prefill and decode steps, not from a loop.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import torch
import torch.nn.functional as F

from torchneuron.projection import report


def _gpt(args: argparse.Namespace) -> None:
    from torchneuron.models.gpt import GPT, GPTConfig

    # The configuration `torchneuron demo` trains (torchneuron.demo.demo_config, BATCH_SIZE).
    config = GPTConfig(vocab_size=args.vocab, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    torch.manual_seed(0)
    model = GPT(config).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, foreach=False)
    report.declare(layers=config.n_layer, hidden=config.n_embd)
    for _ in range(args.steps):
        idx = torch.randint(0, args.vocab, (args.batch, config.block_size + 1), device=args.device)
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        report.mark_step(tokens=args.batch * config.block_size, samples=args.batch)


def _llama(args: argparse.Namespace) -> None:
    from torchneuron.projection.models import LLAMA_CONFIGS, build

    cfg = LLAMA_CONFIGS[args.model]
    if not report.counting_fake() and cfg.num_params() > 1e9:
        raise SystemExit(f"{args.model} has {cfg.num_params() / 1e9:.0f}B parameters: run it under "
                         "`torchneuron project --fake` (nothing is allocated)")
    model = build(cfg, device=args.device)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    report.declare(model=model, layers=cfg.n_layers, hidden=cfg.dim)
    for _ in range(args.steps):
        tokens = torch.zeros(args.batch, args.seq, dtype=torch.long, device=args.device)
        F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        report.mark_step(tokens=args.batch * args.seq, samples=args.batch)


def _whisper(args: argparse.Namespace) -> None:
    from torchneuron.projection.serving import project_transcription

    targets = [t for t in args.targets.split(",") if t]
    prices = {}
    for item in args.price:
        name, _, usd = item.partition("=")
        prices[name] = float(usd)
    rows = project_transcription(args.model, targets, batch=args.batch, tokens_per_clip=args.tokens, prices=prices)
    print(f"== {report.LABEL} ==")
    print(f"{args.model}: transcribing {args.batch} clips of 30 s per device at a time, {args.tokens} tokens per clip; "
          "every device a replica; compiled")
    head = (f"{'target':<18}{'encoder':>11}{'decode/token':>14}{'batch':>11}{'audio h/h':>11}{'$/hour':>9}"
            f"{'audio h/$':>11}  memory/device")
    print(head)
    print("-" * len(head))
    for r in rows:
        price = "n/a" if r["usd_per_hour"] is None else f"{r['usd_per_hour']:.2f}*"
        per_usd = "n/a" if r["audio_hours_per_usd"] is None else f"{r['audio_hours_per_usd']:,.1f}"
        print(f"{r['target']:<18}{report._time(r['encoder_s']):>11}{report._time(r['decode_s_per_token']):>14}"
              f"{report._time(r['batch_s']):>11}{r['audio_hours_per_instance_hour']:>11,.0f}{price:>9}{per_usd:>11}  "
              f"{report._bytes(r['memory_per_device_bytes'])} of {report._bytes(r['capacity_bytes'])} "
              f"{'fits' if r['fits'] else 'does not fit'}")
    print("audio h/h = hours of audio transcribed per instance-hour; '*' = price not read from AWS's pricing page; "
          "n/a = no published price found (hardware.json)")
    if prices:
        print("prices given by the user, not from hardware.json: "
              + ", ".join(f"{k} ${v:,.2f}" for k, v in prices.items()))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchneuron.projection.workloads",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="workload", required=True)
    gpt = sub.add_parser("gpt", help="the demo's GPT (4 layers, 128 wide), AdamW training steps")
    gpt.add_argument("--device", default="neuron")
    gpt.add_argument("--steps", type=int, default=5)
    gpt.add_argument("--batch", type=int, default=16, help="sequences of 64 tokens per step (the demo's 16)")
    gpt.add_argument("--vocab", type=int, default=65, help="characters in the corpus (the demo's 65)")
    llama = sub.add_parser("llama", help="a Llama-style model's training steps (AdamW), built from its config")
    llama.add_argument("--model", default="llama3-8b")
    llama.add_argument("--device", default="neuron")
    llama.add_argument("--steps", type=int, default=1)
    llama.add_argument("--batch", type=int, default=1, help="sequences per microbatch")
    llama.add_argument("--seq", type=int, default=8192, help="tokens per sequence")
    whisper = sub.add_parser("whisper", help="transcription with a Whisper-style model: hours of audio per dollar")
    whisper.add_argument("--model", default="whisper-medium")
    whisper.add_argument("--targets", default="trn1.32xlarge,trn2.48xlarge,g5.xlarge,p4de.24xlarge,p5.48xlarge")
    whisper.add_argument("--batch", type=int, default=16, help="clips per device at a time")
    whisper.add_argument("--tokens", type=int, default=128, help="text tokens per 30 s clip")
    whisper.add_argument("--price", action="append", default=[], metavar="NAME=USD",
                         help="USD per instance-hour for NAME, in place of the data file's (repeatable)")
    args = parser.parse_args(argv)
    {"gpt": _gpt, "llama": _llama, "whisper": _whisper}[args.workload](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
