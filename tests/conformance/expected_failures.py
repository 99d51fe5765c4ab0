"""The one list of what does not pass the conformance on neuron, with a reason per entry.

Every OpInfo of ``op_db`` and every ModuleInfo of ``module_db`` runs; nothing is
skipped silently. An entry here makes the conformance expect a failure of the
given aspects; a failure not listed, or a listed failure that passes, fails the
test (strict), so the list stays exact.

Entry fields:
  name     OpInfo.full_name (``"div.floor_rounding"``) or ModuleInfo name (``"nn.Linear"``);
           ``"*"`` for every one
  dtypes   dtype names (``"float32"``) or ``"*"`` for every dtype
  aspects  op aspects: forward, backward, inplace, out, device1;
           module aspects: forward, backward, state_dict, to; ``"*"`` for all
  reason   why, and what would fix it
  crash    True if running it kills the process: pytest skips it (visibly, with
           the reason) and scripts/op_support.py runs it in a child process
  strict   False when the outcome is not deterministic (the CPU kernel itself reads
           uninitialized memory): a pass is then not reported as unexpected

Reasons start with a tag: [neuron bug] for a defect of torchneuron's core (see
the bug reports), [unsupported] for a documented limitation, [pytorch] for
behaviour PyTorch itself decides per device or gets wrong on the CPU too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class XFail:
    name: str
    dtypes: tuple | str
    aspects: tuple | str
    reason: str
    crash: bool = False
    strict: bool = True

    def matches(self, name, dtype, aspect):
        return ((self.name == name or self.name == "*")
                and (self.dtypes == "*" or dtype in self.dtypes)
                and (self.aspects == "*" or aspect in self.aspects))


# ---- OpInfo (op_db) ------------------------------------------------------------------------------
ALL = ("float32", "float64", "bfloat16", "float16", "int64", "bool", "complex64")
FLOATS = ("float32", "float64", "bfloat16", "float16", "complex64")

_LCE = ("[pytorch] linear_cross_entropy's chunked path resolves acc_policy='auto' per (device, dtype): "
        "'accurate' on the CPU, the 'compact' fallback (half-precision accumulation) for unlisted "
        "devices such as neuron, so half-precision results legitimately differ; an entry for neuron in "
        "torch.nn.modules.linear_cross_entropy_options._AUTO_DEFAULTS would align them")
_BN_OUT = ("[pytorch] native_batch_norm's out= CPU kernel returns garbage for a noncontiguous input (it reads "
           "uninitialized memory on the CPU too: compare with the functional result), so neither device's "
           "result is meaningful; the outcome varies run to run")

OP_XFAILS: list[XFail] = [
    # PyTorch decides per device, or is wrong on the CPU too
    # the differences sit near the tolerance, so a run may pass: not strict
    XFail("nn.functional.linear_cross_entropy.chunked", ("bfloat16", "float16"), ("backward",), _LCE,
          strict=False),
    XFail("nn.functional.linear_cross_entropy.chunked_none", ("bfloat16", "float16"), ("forward", "backward"),
          _LCE, strict=False),
    XFail("native_batch_norm", FLOATS, ("out",), _BN_OUT, strict=False),
    XFail("_native_batch_norm_legit", FLOATS, ("out",), _BN_OUT, strict=False),
]

# ---- ModuleInfo (module_db) ----------------------------------------------------------------------
MODULE_XFAILS: list[XFail] = [
]


# ---- OptimizerInfo (optim_db): name is the optimizer class, dtypes "*", aspects the config's desc ----
OPTIM_XFAILS: list[XFail] = [
]


def expected_optim_failure(optimizer, config_desc):
    """The entry expecting the optimizer configuration ``config_desc`` to fail, or None."""
    return _lookup(OPTIM_XFAILS, optimizer, "float32", config_desc)


def _lookup(entries, name, dtype, aspect):
    for x in entries:
        if x.matches(name, dtype, aspect):
            return x
    return None


def expected_op_failure(name, dtype, aspect):
    """The entry expecting ``aspect`` of op ``name`` to fail for ``dtype`` (a dtype name), or None."""
    return _lookup(OP_XFAILS, name, dtype, aspect)


def expected_module_failure(name, dtype, aspect):
    """The entry expecting ``aspect`` of module ``name`` to fail for ``dtype``, or None."""
    return _lookup(MODULE_XFAILS, name, dtype, aspect)


def judge(entry, status):
    """What an outcome means against the list: "ok", "unexpected failure" or "unexpected pass"."""
    if status == "fail":
        return "ok" if entry is not None else "unexpected failure"
    if status == "pass" and entry is not None and entry.strict:
        return "unexpected pass"
    return "ok"


def problems(result, expected, unit):
    """Messages for each aspect of ``result`` that disagrees with the list (``expected(aspect)`` gives its entry).

    Args:
        result: an OpResult of opcheck or modcheck.
        expected: aspect -> list entry or None.
        unit: what ``samples`` counts ("samples", "inputs").
    """
    out = []
    for aspect, r in result.aspects.items():
        entry = expected(aspect)
        verdict = judge(entry, r.status)
        if verdict == "unexpected failure":
            out.append(f"{aspect} fails: {r.reason}\n{r.detail}")
        elif verdict == "unexpected pass":
            out.append(f"{aspect} passes ({r.samples} {unit}) but expected_failures.py lists it "
                       f"({entry.reason}): remove the entry")
    return out


def crashes(name, dtype, module=False):
    """The reason running ``name`` for ``dtype`` crashes the process, or None."""
    for x in (MODULE_XFAILS if module else OP_XFAILS):
        if x.crash and x.name == name and (x.dtypes == "*" or dtype in x.dtypes):
            return x.reason
    return None


# ---- CUDA-only dtypes (test_cuda_dtypes.py) ---------------------------------------------------------
# (op, dtype) pairs OpInfo lists for CUDA but not for the CPU that do not run on neuron; aspect "forward".
_NO_CPU_KERNEL = ("[unsupported] PyTorch has no CPU kernel for this op in any dtype (CUDA-only attention "
                  "kernels): no wider dtype helps; scaled_dot_product_attention runs on neuron instead")
_HALF_FFT = ("[pytorch] torch.fft's composite front end (promote_type_fft in aten/src/ATen/native/SpectralOps.cpp) "
             "accepts float16 real input only on CUDA, XPU and meta devices and raises 'Unsupported dtype Half' "
             "before any neuron kernel runs; complex32 FFTs, which pass that check, are widened")

CUDA_DTYPE_XFAILS: list[XFail] = [
    XFail("torch.ops.aten._flash_attention_forward", ("float16",), ("forward",), _NO_CPU_KERNEL),
    XFail("torch.ops.aten._efficient_attention_forward", ("float16", "float32"), ("forward",), _NO_CPU_KERNEL),
    *[XFail(f"fft.{name}", ("float16",), ("forward",), _HALF_FFT)
      for name in ("fft", "fft2", "fftn", "ifft", "ifft2", "ifftn", "rfft", "rfft2", "rfftn", "irfft", "irfft2",
                   "irfftn", "hfft", "hfft2", "hfftn", "ihfft", "ihfft2", "ihfftn")],
]


def expected_cuda_dtype_failure(name, dtype, aspect="forward"):
    return _lookup(CUDA_DTYPE_XFAILS, name, dtype, aspect)
