"""Which ops and modules the conformance runs.

The quick slice (the default test suite) is a fixed, representative ~5% of
``op_db``: elementwise unary and binary ops, reductions, matmul and linear
algebra, convolution and normalization, indexing and scatter, views and
shape ops, factories, random ops, sorting and FFT. Set
``TORCHNEURON_FULL_CONFORMANCE=1`` to run every OpInfo and ModuleInfo.
"""

import os

FULL = os.environ.get("TORCHNEURON_FULL_CONFORMANCE", "") not in ("", "0")

QUICK_OPS = (
    # elementwise
    "abs", "exp", "sigmoid", "add", "mul", "div.floor_rounding", "pow", "where", "clamp",
    "nn.functional.gelu",
    # reductions and scans
    "sum", "mean", "max.reduction_with_dim", "argmax", "cumsum", "var",
    # matmul, linear algebra
    "matmul", "addmm", "linalg.solve",
    # nn
    "nn.functional.conv2d", "nn.functional.layer_norm", "nn.functional.cross_entropy",
    "nn.functional.embedding", "nn.functional.dropout", "softmax",
    # indexing, scatter, masks
    "index_put", "gather", "scatter_add", "masked_fill", "nonzero",
    # views, shapes, copies
    "as_strided", "transpose", "cat", "flip", "unfold",
    # factories, random, sorting, fft
    "full_like", "bernoulli", "sort", "fft.fft",
)

QUICK_MODULES = ("nn.Linear", "nn.Conv2d", "nn.BatchNorm2d", "nn.LSTM", "nn.TransformerEncoderLayer",
                 "nn.LazyConv1d")


def _quick_slice(db, names, name_of, what, full):
    full = FULL if full is None else full
    if full:
        return list(db)
    chosen = [entry for entry in db if name_of(entry) in names]
    missing = set(names) - {name_of(entry) for entry in chosen}
    assert not missing, f"quick-slice {what} not in {what[:-1]}_db: {sorted(missing)}"
    return chosen


def selected_ops(op_db, full=None):
    return _quick_slice(op_db, QUICK_OPS, lambda op: op.full_name, "ops", full)


def selected_modules(module_db, full=None):
    return _quick_slice(module_db, QUICK_MODULES, lambda m: m.name, "modules", full)
