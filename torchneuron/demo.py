"""End-to-end demo: train a small character-level GPT on the host CPU and on a device, then compare."""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import torch
from tqdm import tqdm

from torchneuron.data import load_text
from torchneuron.models import GPT, CharTokenizer, GPTConfig, get_batch

logger = logging.getLogger(__name__)

BATCH_SIZE = 16
LEARNING_RATE = 2e-3
MIN_LR_FRACTION = 0.1
WARMUP_STEPS = 20
GRAD_CLIP = 1.0
LOSS_ATOL = 1e-4
SAMPLE_TEMPERATURE = 0.8
DEFAULT_STEPS = 200


WARMUP_RUN_STEPS = 8  # untimed steps per device before the measured runs


def demo_config(vocab_size: int) -> GPTConfig:
    """Return the model configuration used by the demo.

    Args:
        vocab_size: number of distinct characters in the corpus.
    """
    return GPTConfig(vocab_size=vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)


@dataclass
class RunResult:
    """Losses and timings of one training run.

    Args:
        name: short label of the run (``compare``, ``device`` or ``compile``).
        device: device the run trained on.
        tokens_per_step: tokens consumed by each optimizer step.
        losses: training loss of each step.
        step_seconds: wall time of each step.
        error: message of the exception that stopped the run, if any.
    """

    name: str
    device: str
    tokens_per_step: int
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    error: Optional[str] = None

    def _timed(self) -> list[float]:
        """Return step times without the first (warm-up) step when there is more than one."""
        return self.step_seconds[1:] if len(self.step_seconds) > 1 else self.step_seconds

    @property
    def seconds(self) -> float:
        """Return the total wall time of the run."""
        return sum(self.step_seconds)

    @property
    def ms_per_step(self) -> float:
        """Return the mean step time in milliseconds, excluding the warm-up step."""
        timed = self._timed()
        return 1000.0 * sum(timed) / len(timed) if timed else float("nan")

    @property
    def tokens_per_s(self) -> float:
        """Return the training throughput, excluding the warm-up step."""
        timed = self._timed()
        return self.tokens_per_step * len(timed) / sum(timed) if timed and sum(timed) > 0 else float("nan")


class _Output:
    """Write plain lines, status lines and tables to a text stream or a ``rich`` console.

    Args:
        console: ``None`` (stdout, through ``rich`` when it is installed), a ``rich``
            console, or any object with a ``write`` method.
    """

    def __init__(self, console: Any = None) -> None:
        if console is None:
            try:
                from rich.console import Console

                console = Console()
            except ImportError:
                console = sys.stdout
        self.console = console
        self.rich = type(console).__module__.startswith("rich")

    def line(self, text: str = "", style: Optional[str] = None) -> None:
        """Print one line of text.

        Args:
            text: the text, printed verbatim.
            style: optional ``rich`` style, ignored for plain streams.
        """
        if self.rich:
            self.console.print(text, style=style, markup=False, highlight=False)
        else:
            self.console.write(text + "\n")
            if hasattr(self.console, "flush"):
                self.console.flush()

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]], title: str = "") -> None:
        """Print a table whose first column is left-aligned and the others right-aligned.

        Args:
            headers: column titles.
            rows: rows of already formatted cells.
            title: optional caption printed above the table.
        """
        if self.rich:
            from rich.table import Table

            table = Table(title=title or None)
            for i, header in enumerate(headers):
                table.add_column(header, justify="left" if i == 0 else "right")
            for row in rows:
                table.add_row(*row)
            self.console.print(table)
            return
        widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
        fmt = lambda cells: "  ".join(  # noqa: E731
            str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )
        if title:
            self.line(title)
        self.line(fmt(headers))
        self.line("  ".join("-" * w for w in widths))
        for row in rows:
            self.line(fmt(row))


def learning_rate(step: int, steps: int) -> float:
    """Return the learning rate of ``step``: linear warm-up, then cosine decay to 10% of the peak.

    A gentle schedule keeps training well conditioned, so float32 rounding differences
    between devices stay at rounding level instead of being amplified by loss spikes.

    Args:
        step: zero-based optimizer step.
        steps: total number of steps of the run.
    """
    warmup = min(1.0, (step + 1) / WARMUP_STEPS)
    cosine = 0.5 * (1.0 + math.cos(math.pi * step / max(1, steps - 1)))
    return LEARNING_RATE * warmup * (MIN_LR_FRACTION + (1.0 - MIN_LR_FRACTION) * cosine)


def _build_model(config: GPTConfig, seed: int, device: str) -> GPT:
    """Build the model on the CPU under ``seed`` and move it to ``device``.

    Args:
        config: model hyper-parameters.
        seed: seed for the initial weights.
        device: target device.
    """
    torch.manual_seed(seed)
    return GPT(config).to(device)


def _train(
    run: RunResult,
    model: GPT,
    data: torch.Tensor,
    steps: int,
    seed: int,
    compile_model: bool = False,
    progress: bool = True,
) -> GPT:
    """Train ``model`` with AdamW and gradient clipping, filling ``run`` with losses and timings.

    Args:
        run: record to fill; ``run.device`` is where batches are sent.
        model: the model, already on ``run.device``.
        data: 1-D CPU tensor of token ids.
        steps: number of optimizer steps.
        seed: seed of the CPU generator that draws the batches.
        compile_model: train through ``torch.compile(model)``.
        progress: show a ``tqdm`` progress bar on stderr.
    """
    # foreach=False keeps the same code path on every device, so runs are comparable.
    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate(0, steps), foreach=False)
    step_fn = torch.compile(model) if compile_model else model
    gen = torch.Generator().manual_seed(seed)
    block_size = model.config.block_size
    batch_size = run.tokens_per_step // block_size
    model.train()
    bar = tqdm(range(steps), desc=f"{run.name:>7} [{run.device}]", unit="step", disable=not progress, file=sys.stderr)
    for step in bar:
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, steps)
        x, y = get_batch(data, block_size, batch_size, gen, run.device)
        _, loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP, foreach=False)
        opt.step()
        run.losses.append(loss.item())
        run.step_seconds.append(time.perf_counter() - t0)
        bar.set_postfix(loss=f"{run.losses[-1]:.4f}", tok_s=f"{run.tokens_per_s:,.0f}", refresh=False)
    bar.close()
    return model


def _max_diff(a: Sequence[float], b: Sequence[float]) -> float:
    """Return the largest absolute step-wise difference of two loss curves (inf if lengths differ).

    Args:
        a: first loss curve.
        b: second loss curve.
    """
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) for x, y in zip(a, b))


def _sample(model: GPT, tokenizer: CharTokenizer, device: str, n_chars: int, seed: int) -> str:
    """Generate ``n_chars`` characters from ``model`` starting from a newline.

    Args:
        model: trained model on ``device``.
        tokenizer: tokenizer the model was trained with.
        device: device of the model.
        n_chars: number of characters to generate.
        seed: seed of the CPU sampling generator.
    """
    start = "\n" if "\n" in tokenizer.stoi else tokenizer.chars[0]
    idx = torch.tensor([tokenizer.encode(start)], dtype=torch.long).to(device)
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    out = model.generate(idx, n_chars, temperature=SAMPLE_TEMPERATURE, generator=gen)
    return tokenizer.decode(out[0, 1:].cpu())


def _report(out: _Output, runs: list[RunResult], steps: int) -> None:
    """Print the per-run table of final loss and speed.

    Args:
        out: where to print.
        runs: finished runs; the first one is the speed reference.
        steps: requested number of steps.
    """
    ref = runs[0].tokens_per_s
    rows = []
    for run in runs:
        if run.error or len(run.losses) < steps:
            rows.append([run.name, run.device, "failed", "-", "-", "-"])
            continue
        rows.append([
            run.name,
            run.device,
            f"{run.losses[-1]:.4f}",
            f"{run.tokens_per_s:,.0f}",
            f"{run.ms_per_step:.1f}",
            f"{run.tokens_per_s / ref:.2f}x",
        ])
    headers = ["run", "device", "final loss", "tokens/s", "ms/step", "speed vs " + runs[0].device]
    out.table(headers, rows, title=f"Results after {steps} steps (timings exclude the first step)")


def _check(out: _Output, runs: list[RunResult], steps: int) -> tuple[dict[str, float], bool]:
    """Compare every run's loss curve with the first run's, print PASS/FAIL lines and return the verdict.

    Args:
        out: where to print.
        runs: finished runs; the first one is the reference.
        steps: requested number of steps.
    """
    ref = runs[0]
    diffs = {run.name: _max_diff(ref.losses, run.losses) for run in runs[1:]}
    match = True
    for run in runs[1:]:
        ok = run.error is None and diffs[run.name] <= LOSS_ATOL
        match = match and ok
        detail = run.error or (
            f"max |loss difference| over {steps} steps = {diffs[run.name]:.3e} (tolerance {LOSS_ATOL:.0e})"
        )
        out.line(
            f"{'PASS' if ok else 'FAIL'}: {run.name} run on {run.device} vs {ref.device}: {detail}",
            style="bold green" if ok else "bold red",
        )
    return diffs, match


def _run_all(
    plan: list[tuple[str, str, bool]],
    config: GPTConfig,
    data: torch.Tensor,
    steps: int,
    seed: int,
    progress: bool,
) -> tuple[list[RunResult], Optional[GPT]]:
    """Train one fresh model per entry of ``plan`` and return the runs and the ``device`` run's model.

    A failing compiled run is recorded in its ``RunResult.error``; other failures propagate.

    Args:
        plan: ``(name, device, use_compile)`` for each run, reference first.
        config: model hyper-parameters.
        data: 1-D CPU tensor of token ids.
        steps: optimizer steps per run.
        seed: seed for the initial weights and the batches.
        progress: show ``tqdm`` progress bars on stderr.
    """
    tokens_per_step = BATCH_SIZE * config.block_size
    # A few untimed steps first: a fresh process pays once for warming up the host's memory
    # allocator and kernels, and that cost must not land on whichever run happens to go first.
    for dev in dict.fromkeys(dev for _, dev, _ in plan):
        warm = RunResult(name="warm-up", device=dev, tokens_per_step=tokens_per_step)
        _train(warm, _build_model(config, seed, dev), data, WARMUP_RUN_STEPS, seed, False, False)
    runs: list[RunResult] = []
    device_model: Optional[GPT] = None
    for name, dev, use_compile in plan:
        run = RunResult(name=name, device=dev, tokens_per_step=tokens_per_step)
        runs.append(run)
        try:
            model = _train(run, _build_model(config, seed, dev), data, steps, seed, use_compile, progress)
        except Exception as exc:  # the compiled run may not be supported yet: report it, do not crash
            if not use_compile:
                raise
            run.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            logger.debug("compiled run failed", exc_info=True)
            continue
        if name == "device":
            device_model = model
    return runs, device_model


def run_demo(
    steps: int = DEFAULT_STEPS,
    device: str = "neuron",
    compare_device: str = "cpu",
    compile: bool = False,
    seed: int = 0,
    console: Any = None,
    sample_chars: int = 200,
    progress: bool = True,
) -> dict:
    """Train the demo GPT on ``compare_device`` then on ``device`` and check that the losses match.

    Args:
        steps: optimizer steps per run.
        device: device under test.
        compare_device: reference device, trained first.
        compile: add a third run on ``device`` through ``torch.compile``.
        seed: seed for the initial weights, the batches and the sample.
        console: where to print (see :class:`_Output`); ``None`` means stdout.
        sample_chars: characters of text to sample at the end (0 to skip).
        progress: show ``tqdm`` progress bars on stderr.
    """
    if steps < 1:
        raise ValueError("steps must be at least 1")
    out = _Output(console)
    text = load_text()
    tokenizer = CharTokenizer(text)
    data = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    config = demo_config(tokenizer.vocab_size)
    n_params = _build_model(config, seed, "cpu").num_parameters()
    out.line(
        f"GPT: {config.n_layer} layers, {config.n_head} heads, n_embd {config.n_embd}, "
        f"block {config.block_size}, {n_params / 1e6:.2f}M parameters | corpus {len(text):,} chars, "
        f"vocab {tokenizer.vocab_size} | {steps} steps x batch {BATCH_SIZE} | torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )

    plan = [("compare", compare_device, False), ("device", device, False)]
    if compile:
        plan.append(("compile", device, True))
    runs, device_model = _run_all(plan, config, data, steps, seed, progress)

    out.line()
    _report(out, runs, steps)
    out.line()
    diffs, match = _check(out, runs, steps)

    sample = ""
    if sample_chars > 0 and device_model is not None:
        sample = _sample(device_model, tokenizer, device, sample_chars, seed)
        out.line()
        out.line(f"Sample from the model trained on {device}:", style="bold")
        out.line(sample)

    return {
        "steps": steps,
        "devices": {run.name: run.device for run in runs},
        "config": asdict(config),
        "losses": {run.name: list(run.losses) for run in runs},
        "tokens_per_s": {run.name: run.tokens_per_s for run in runs},
        "ms_per_step": {run.name: run.ms_per_step for run in runs},
        "errors": {run.name: run.error for run in runs if run.error},
        "max_loss_diff": diffs["device"],
        "max_loss_diffs": diffs,
        "match": match,
        "sample": sample,
    }
