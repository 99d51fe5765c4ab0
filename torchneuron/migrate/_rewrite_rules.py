"""The rules of ``torchneuron migrate`` (see :mod:`torchneuron.migrate.rewrite`): what is CUDA-specific,
the survey of a module's names, and the libcst transformer that rewrites it and lists what it leaves."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

import libcst as cst
import libcst.helpers  # noqa: F401  (cst.helpers)
from libcst.metadata import ParentNodeProvider, PositionProvider, QualifiedNameProvider


@dataclass(frozen=True)
class Finding:
    """Something CUDA-specific the rewriter left as it was.

    Attributes:
        path: the file.
        line: 1-based line.
        what: what it is.
        hint: what to do about it.
        code: the source line.
    """

    path: str
    line: int
    what: str
    hint: str
    code: str = ""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}: {self.hint}"


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------

# torch.cuda.<fn>(...) -> torch.accelerator.<fn>(...). "plain": safe without an accelerator;
# otherwise guarded by torch.accelerator.is_available(), with this value when there is none.
_ACCELERATOR = {
    "is_available": ("is_available", "plain"),
    "device_count": ("device_count", "plain"),
    "current_device": ("current_device_index", "0"),
    "set_device": ("set_device_index", None),
    "synchronize": ("synchronize", None),
    "empty_cache": ("empty_cache", None),
    "memory_allocated": ("memory_allocated", "0"),
    "max_memory_allocated": ("max_memory_allocated", "0"),
    "memory_reserved": ("memory_reserved", "0"),
    "max_memory_reserved": ("max_memory_reserved", "0"),
    "memory_stats": ("memory_stats", "{}"),
    "reset_peak_memory_stats": ("reset_peak_memory_stats", None),
    "reset_accumulated_memory_stats": ("reset_accumulated_memory_stats", None),
    "reset_max_memory_allocated": ("reset_peak_memory_stats", None),
}
_SEED = {"manual_seed", "manual_seed_all"}
# torch.cuda.<fn> -> the device module's on an accelerator, this on the CPU.
_RNG = {
    "get_rng_state": "{t}.get_rng_state()",
    "get_rng_state_all": "[{t}.get_rng_state()]",
    "set_rng_state": "{t}.set_rng_state({a0})",
    "set_rng_state_all": "{t}.set_rng_state({a0}[0])",
}
_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")

_FLAGGED_CUDA = {
    "nvtx": ("NVTX range", "use torch.profiler.record_function(...), which every device's profiler shows"),
    "graph": ("CUDA graph", "CUDA graphs have no device-agnostic form; use torch.compile(mode=\"reduce-overhead\") "
                            "or keep this path CUDA-only"),
    "graphs": ("CUDA graph", "CUDA graphs have no device-agnostic form; keep this path CUDA-only"),
    "CUDAGraph": ("CUDA graph", "CUDA graphs have no device-agnostic form; use torch.compile(mode=\"reduce-overhead\") "
                                "or keep this path CUDA-only"),
    "make_graphed_callables": ("CUDA graph", "keep this path CUDA-only"),
    "Stream": ("CUDA stream", "torch.Stream / torch.accelerator.current_stream() work on any accelerator "
                              "(not on the CPU)"),
    "Event": ("CUDA event", "torch.Event works on any accelerator (not on the CPU); for timing, "
                            "time.perf_counter() after torch.accelerator.synchronize()"),
    "current_stream": ("CUDA stream", "torch.accelerator.current_stream() works on any accelerator"),
    "default_stream": ("CUDA stream", "torch.accelerator.current_stream() works on any accelerator"),
    "stream": ("CUDA stream", "torch.accelerator.stream(...) / torch.Stream work on any accelerator"),
    "StreamContext": ("CUDA stream", "torch.accelerator.stream(...) works on any accelerator"),
}
_LEGACY_TYPES = re.compile(r"^(Float|Double|Half|BFloat16|Long|Int|Short|Char|Byte|Bool)Tensor$")
_CUDA_STR = re.compile(r"^cuda(:[\w{}%]*)?$")

_FOREIGN_MODULES = {
    "triton": ("Triton kernel", "Triton kernels run on CUDA/ROCm only: keep a PyTorch fallback for other devices"),
    "cupy": ("cupy", "cupy arrays live on CUDA: use torch tensors, or keep this path CUDA-only"),
    "pycuda": ("pycuda", "pycuda talks to the CUDA driver: keep this path CUDA-only"),
    "numba.cuda": ("numba.cuda kernel", "numba.cuda kernels run on CUDA only: keep a PyTorch fallback"),
    "cuda": ("CUDA Python bindings", "keep this path CUDA-only"),
    "apex": ("NVIDIA apex", "use torch.amp and torch.optim (fused=True where supported) instead"),
}
_EXTENSIONS = {
    "torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline",
    "torch.utils.cpp_extension.CUDAExtension", "torch.utils.cpp_extension.BuildExtension",
}

# libcst node types in which an expression needs no parentheses around it.
_SAFE_PARENTS = (cst.Arg, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Return, cst.If, cst.While, cst.Assert,
                 cst.BooleanOperation, cst.Expr, cst.Element, cst.DictElement, cst.IfExp, cst.Lambda,
                 cst.FormattedStringExpression, cst.Yield)


def _expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def _paren(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


# --------------------------------------------------------------------------------------
# First pass: what the module binds and imports
# --------------------------------------------------------------------------------------

class _Survey(cst.CSTVisitor):
    """Names the module binds, how it imports torch, and its top-level import block."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.torch_alias: Optional[str] = None
        self.dist_alias: Optional[str] = None

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = cst.helpers.get_full_name_for_node(alias.name)
            bound = alias.evaluated_alias or name.split(".")[0]
            self.bound.add(bound)
            if name == "torch" or (name.startswith("torch.") and alias.asname is None):
                self.torch_alias = self.torch_alias or (alias.evaluated_alias or "torch")
            if name == "torch.distributed" and alias.asname is not None:
                self.dist_alias = alias.evaluated_alias

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        module = cst.helpers.get_full_name_for_node(node.module) if node.module else ""
        for alias in node.names:
            bound = alias.evaluated_alias or cst.helpers.get_full_name_for_node(alias.name)
            self.bound.add(bound)
            if module == "torch" and alias.evaluated_name == "distributed":
                self.dist_alias = self.dist_alias or bound

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._targets(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._targets(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._targets(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._targets(node.asname.name)

    def visit_Param(self, node: cst.Param) -> None:
        self.bound.add(node.name.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.bound.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.bound.add(node.name.value)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._targets(node.target)

    def _targets(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self.bound.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self._targets(el.value)
        elif isinstance(target, cst.StarredElement):
            self._targets(target.value)


# --------------------------------------------------------------------------------------
# Second pass: the rewrite
# --------------------------------------------------------------------------------------

class _Rewriter(cst.CSTTransformer):
    """The rewrite of one file: CUDA device strings, ``torch.cuda`` calls, ``.cuda()``, autocast, NCCL.

    One class of about 400 lines, on purpose: libcst calls ``visit_<Node>``/``leave_<Node>`` methods by
    node type on a single transformer, and every handler shares the file's state (the changes made,
    the findings, the f-string quotes around the node, whether ``torch`` or the device name must be
    imported). Its sections: helpers, strings, attributes, calls, statements and imports.
    """

    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider, ParentNodeProvider)

    def __init__(self, path: str, lines: list[str], torch_name: str, dev: str, dist: str):
        super().__init__()
        self.path = path
        self.lines = lines
        self.t = torch_name
        self.dev = dev
        self.dist = dist
        self.changes: list[str] = []
        self.findings: list[Finding] = []
        self.uses_device = False
        self.needs_torch = False
        # id(rewritten call) -> (test, statement for else or None), for calls that are a whole statement
        self._guard: dict[int, tuple[str, Optional[str]]] = {}
        self._flagged: set[tuple[int, str]] = set()
        self._removed_imports: set[str] = set()
        self._fstring_quotes: list[str] = []

    # ---- helpers ----------------------------------------------------------------------

    def _line(self, node: cst.CSTNode) -> int:
        try:
            return self.get_metadata(PositionProvider, node).start.line
        except KeyError:
            return 0

    def _qname(self, node: cst.CSTNode) -> Optional[str]:
        """The qualified name of a dotted name such as ``torch.cuda.synchronize`` (None for ``f().x``)."""
        inner = node
        while isinstance(inner, cst.Attribute):
            inner = inner.value
        if not isinstance(inner, cst.Name):
            return None
        try:
            names = self.get_metadata(QualifiedNameProvider, node)
        except KeyError:
            return None
        for q in sorted(names, key=lambda q: q.name):
            return q.name
        return None

    def _parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        try:
            return self.get_metadata(ParentNodeProvider, node)
        except KeyError:
            return None

    def _change(self, node: cst.CSTNode, what: str) -> None:
        self.changes.append(f"line {self._line(node)}: {what}")

    def _flag(self, node: cst.CSTNode, what: str, hint: str) -> None:
        line = self._line(node)
        if (line, what) in self._flagged:
            return
        self._flagged.add((line, what))
        code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.findings.append(Finding(self.path, line, what, hint, code))

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        self._fstring_quotes.append(node.quote)

    def _cpu(self) -> str:
        """The literal 'cpu' with quotes that may appear inside the f-strings around the node (Python 3.11)."""
        used = "".join(self._fstring_quotes)
        return "'cpu'" if '"' in used and "'" not in used else '"cpu"'

    def _device(self) -> cst.BaseExpression:
        self.uses_device = True
        return cst.Name(self.dev)

    def _device_type(self) -> cst.BaseExpression:
        self.uses_device = True
        return _expr(f"{self.dev}.type")

    def _torch(self, rest: str) -> cst.BaseExpression:
        self.needs_torch = True
        return _expr(f"{self.t}.{rest}")

    def _in_comparison(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is an operand of a comparison (possibly inside a tuple/list/set for ``in``)."""
        parent = self._parent(node)
        while isinstance(parent, (cst.Element, cst.Tuple, cst.List, cst.Set)):
            parent = self._parent(parent)
        return isinstance(parent, (cst.Comparison, cst.ComparisonTarget))

    def _is_statement_call(self, node: cst.Call) -> bool:
        parent = self._parent(node)
        if not isinstance(parent, cst.Expr) or node.lpar:
            return False
        line = self._parent(parent)
        return isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1

    # ---- strings ----------------------------------------------------------------------

    def _string_role(self, node: cst.CSTNode) -> str:
        """How a "cuda" string is used: as a device ("device"), a device type ("type"), or "skip"."""
        parent = self._parent(node)
        if isinstance(parent, cst.DictElement) and parent.key is node:
            return "skip"  # map_location={"cuda:0": ...} keys name where a checkpoint was saved
        if isinstance(parent, cst.Expr):
            return "skip"  # a docstring
        if isinstance(parent, cst.Arg):
            call = self._parent(parent)
            kw = parent.keyword.value if parent.keyword else None
            if kw in ("device", "map_location"):
                return "device"
            if isinstance(call, cst.Call):
                func = call.func
                fname = func.attr.value if isinstance(func, cst.Attribute) else (
                    func.value if isinstance(func, cst.Name) else "")
                first = call.args and call.args[0] is parent and kw is None
                if first and fname == "to":
                    return "device"
        return "type"

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString
                           ) -> cst.BaseExpression:
        try:
            value = original_node.evaluated_value
        except Exception:  # noqa: BLE001 - odd literals are left alone
            return updated_node
        if not isinstance(value, str):
            return updated_node
        if value == "nccl":
            if self._in_comparison(original_node):
                self._flag(original_node, "comparison with 'nccl'",
                           "the backend is chosen at run time now; compare with "
                           f"{self.dist}.get_default_backend_for_device(...) or drop the check")
                return updated_node
            if self._string_role(original_node) == "skip":
                return updated_node
            self._change(original_node, "'nccl' -> the backend for the device, chosen at run time")
            self.uses_device = True
            self.needs_torch = True
            return _expr(f"{self.dist}.get_default_backend_for_device({self.dev})")
        if value == "CUDA_VISIBLE_DEVICES":
            self._flag(original_node, "CUDA_VISIBLE_DEVICES",
                       "selects CUDA devices only, other devices ignore it: pick a device with "
                       "torch.accelerator.set_device_index(...)")
            return updated_node
        if not _CUDA_STR.match(value):
            return updated_node
        if self._in_comparison(original_node):
            self._flag(original_node, "comparison with 'cuda'",
                       f"decide what it means on other devices: e.g. compare with {self.dev}.type, "
                       "or test torch.accelerator.is_available()")
            return updated_node
        role = self._string_role(original_node)
        if role == "skip":
            return updated_node
        self._change(original_node, f"{original_node.value} -> the device chosen at run time")
        if value == "cuda":
            return self._device() if role == "device" else self._device_type()
        rest = value[4:]
        quote = original_node.quote if original_node.quote in ("'", '"') else '"'
        self.uses_device = True
        if "{" in rest or "%" in rest:
            return _paren(_expr(f"{self.dev}.type + {quote}{rest}{quote}"))
        return _expr(f"f{quote}{{{self.dev}.type}}{rest}{quote}")

    def leave_FormattedString(self, original_node: cst.FormattedString, updated_node: cst.FormattedString
                              ) -> cst.BaseExpression:
        self._fstring_quotes.pop()
        parts = updated_node.parts
        if not parts or not isinstance(parts[0], cst.FormattedStringText):
            return updated_node
        text = parts[0].value
        if not (text == "cuda" or text.startswith("cuda:")):
            return updated_node
        if self._in_comparison(original_node):
            self._flag(original_node, "comparison with 'cuda'",
                       f"decide what it means on other devices: e.g. compare with {self.dev}.type")
            return updated_node
        self._change(original_node, "f-string 'cuda:...' -> the device type chosen at run time")
        self.uses_device = True
        new_parts = [cst.FormattedStringExpression(expression=_expr(f"{self.dev}.type"))]
        if text[4:]:
            new_parts.append(cst.FormattedStringText(text[4:]))
        return updated_node.with_changes(parts=[*new_parts, *parts[1:]])

    # ---- attributes -------------------------------------------------------------------

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        parent = self._parent(original_node)
        if isinstance(parent, cst.Attribute) and parent.value is original_node:
            return updated_node  # only the full dotted name is looked at
        called = isinstance(parent, cst.Call) and parent.func is original_node
        attr = original_node.attr.value
        q = self._qname(original_node) or ""

        if attr == "is_cuda" and not called and not q.startswith("torch."):
            self._change(original_node, ".is_cuda -> is on the chosen device")
            self.uses_device = True
            new = cst.Comparison(
                left=cst.Attribute(value=cst.Attribute(value=updated_node.value, attr=cst.Name("device")),
                                   attr=cst.Name("type")),
                comparisons=[cst.ComparisonTarget(cst.Equal(), _expr(f"{self.dev}.type"))])
            if not isinstance(parent, _SAFE_PARENTS) and not (
                    isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not)):
                new = _paren(new)
            return new
        if attr == "cuda" and not called and not q.startswith("torch.cuda"):
            self._flag(original_node, ".cuda used as a value", f"use .to({self.dev}) instead")
            return updated_node
        if not q.startswith("torch.cuda."):
            return self._other_qualified(original_node, updated_node, q)
        if called or isinstance(parent, cst.Decorator):
            return updated_node  # leave_Call / leave_Decorator decide
        rest = q[len("torch.cuda."):]
        if rest == "OutOfMemoryError":
            self._change(original_node, "torch.cuda.OutOfMemoryError -> torch.OutOfMemoryError")
            return self._torch("OutOfMemoryError")
        self._flag_cuda(original_node, rest)
        return updated_node

    def _other_qualified(self, original_node: cst.CSTNode, updated_node: cst.BaseExpression, q: str
                         ) -> cst.BaseExpression:
        if q == "torch.version.cuda":
            self._flag(original_node, "torch.version.cuda",
                       "is None on builds without CUDA: check torch.accelerator.current_accelerator() instead")
        return updated_node

    def _flag_cuda(self, node: cst.CSTNode, rest: str) -> None:
        head = rest.split(".")[0]
        if head in _FLAGGED_CUDA:
            what, hint = _FLAGGED_CUDA[head]
            self._flag(node, what, hint)
        elif _LEGACY_TYPES.match(head):
            self._flag(node, f"legacy tensor type torch.cuda.{head}",
                       f"use torch.tensor(..., dtype=..., device={self.dev})")
        elif head == "amp":
            self._flag(node, f"torch.cuda.{rest}", "use torch.amp with device_type=device.type")
        else:
            self._flag(node, f"torch.cuda.{rest}",
                       "CUDA-specific: use torch.accelerator / torch.get_device_module(device), "
                       "or keep it behind torch.cuda.is_available()")

    # ---- calls ------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        q = self._qname(func) or ""
        if q.startswith("torch.cuda."):
            return self._torch_cuda_call(original_node, updated_node, q[len("torch.cuda."):])
        if q in ("torch.device",) and len(original_node.args) == 1 and not original_node.args[0].keyword:
            arg = original_node.args[0].value
            if isinstance(arg, cst.SimpleString) and arg.evaluated_value == "cuda" \
                    and not self._in_comparison(original_node):
                return self._device()
        if q in ("torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.cpu.amp.GradScaler"):
            has_device = any(a.keyword is None or a.keyword.value == "device" for a in original_node.args)
            if not has_device:
                self._change(original_node, "GradScaler() (CUDA by default) -> GradScaler(device.type)")
                return updated_node.with_changes(args=[cst.Arg(self._device_type()), *updated_node.args])
            return updated_node
        if q in _EXTENSIONS:
            self._flag(original_node, "custom C++/CUDA extension",
                       "its kernels are built for CUDA: provide a CPU/neuron fallback or a torch.library op")
            return updated_node
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda" and not q.startswith("torch."):
            return self._dot_cuda(original_node, updated_node)
        return updated_node

    def _dot_cuda(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        target: Optional[cst.BaseExpression] = None
        original_target: Optional[cst.BaseExpression] = None
        rest = []
        for i, (orig, a) in enumerate(zip(original_node.args, updated_node.args)):
            kw = a.keyword.value if a.keyword else None
            if (kw is None and i == 0) or kw == "device":
                target, original_target = a.value, orig.value
            else:
                rest.append(a)
        if target is None or (isinstance(target, cst.Name) and target.value == "None"):
            dest: cst.BaseExpression = self._device()
            what = ".cuda() -> .to(device)"
        elif isinstance(original_target, (cst.SimpleString, cst.FormattedString)):
            dest = target  # a device string, already rewritten
            what = ".cuda('cuda:i') -> .to(...)"
        else:
            dest = cst.Call(func=self._torch("device"), args=[cst.Arg(self._device_type()), cst.Arg(target)])
            what = ".cuda(i) -> .to(torch.device(device.type, i))"
        self._change(original_node, what)
        func = updated_node.func
        assert isinstance(func, cst.Attribute)
        args = [cst.Arg(dest), *rest]
        args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
        return updated_node.with_changes(func=func.with_changes(attr=cst.Name("to")), args=args)

    def _torch_cuda_call(self, original_node: cst.Call, updated_node: cst.Call, rest: str) -> cst.BaseExpression:
        t = self.t
        args = updated_node.args
        if rest in _ACCELERATOR:
            name, default = _ACCELERATOR[rest]
            call = updated_node.with_changes(func=self._torch(f"accelerator.{name}"))
            self._change(original_node, f"torch.cuda.{rest}() -> torch.accelerator.{name}()")
            if default == "plain":
                return call
            test = f"{t}.accelerator.is_available()"
            if default is None and self._is_statement_call(original_node):
                self._guard[id(call)] = (test, None)
                return call
            return _paren(cst.IfExp(test=_expr(test), body=call, orelse=_expr(default or "None")))
        if rest in _SEED:
            self._change(original_node, f"torch.cuda.{rest}(s) -> torch.manual_seed(s)")
            return updated_node.with_changes(func=self._torch("manual_seed"))
        if rest in _RNG:
            self.uses_device = True
            self.needs_torch = True
            a0 = cst.Module([]).code_for_node(args[0].value) if args else ""
            on_device = updated_node.with_changes(func=_expr(f"{t}.get_device_module({self.dev}).{rest}"))
            on_cpu = _expr(_RNG[rest].format(t=t, a0=a0))
            self._change(original_node, f"torch.cuda.{rest} -> the device's generator (the CPU's on the CPU)")
            test = f"{self.dev}.type != {self._cpu()}"
            if rest.startswith("set_") and self._is_statement_call(original_node):
                self._guard[id(on_device)] = (test, cst.Module([]).code_for_node(on_cpu))
                return on_device
            return _paren(cst.IfExp(test=_expr(test), body=on_device, orelse=on_cpu))
        if rest == "get_device_name":
            self.uses_device = True
            on_device = updated_node.with_changes(func=self._torch(f"get_device_module({self.dev}).get_device_name"))
            self._change(original_node, "torch.cuda.get_device_name -> the device's name")
            return _paren(cst.IfExp(test=_expr(f"{self.dev}.type != {self._cpu()}"), body=on_device,
                                    orelse=_expr(self._cpu())))
        if rest == "amp.autocast":
            return self._autocast(original_node, updated_node)
        if rest == "amp.GradScaler":
            self._change(original_node, "torch.cuda.amp.GradScaler(...) -> torch.amp.GradScaler(device.type, ...)")
            return updated_node.with_changes(func=self._torch("amp.GradScaler"),
                                             args=[cst.Arg(self._device_type()), *args])
        if rest in ("amp.custom_fwd", "amp.custom_bwd"):
            self._change(original_node, f"torch.cuda.{rest} -> torch.{rest}(device_type=device.type)")
            return updated_node.with_changes(
                func=self._torch(rest),
                args=[*args, cst.Arg(self._device_type(), keyword=cst.Name("device_type"))])
        self._flag_cuda(original_node, rest)
        return updated_node

    def _autocast(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        kwargs = []
        for i, a in enumerate(updated_node.args):
            if a.keyword is None and a.star == "" and i < len(_AUTOCAST_POSITIONAL):
                a = a.with_changes(keyword=cst.Name(_AUTOCAST_POSITIONAL[i]),
                                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                         whitespace_after=cst.SimpleWhitespace("")))
            kwargs.append(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        if not any(a.keyword is not None and a.keyword.value == "dtype" for a in kwargs):
            kwargs.insert(0, cst.Arg(_expr(f"{self.t}.float16"), keyword=cst.Name("dtype"),
                                     equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                           whitespace_after=cst.SimpleWhitespace(""))))
        self._change(original_node, "torch.cuda.amp.autocast(...) -> torch.autocast(device.type, float16, ...)")
        return updated_node.with_changes(func=self._torch("autocast"),
                                         args=[cst.Arg(self._device_type()), *kwargs])

    def leave_Decorator(self, original_node: cst.Decorator, updated_node: cst.Decorator) -> cst.Decorator:
        q = self._qname(original_node.decorator) or ""
        if q in ("torch.cuda.amp.custom_fwd", "torch.cuda.amp.custom_bwd") and not isinstance(
                original_node.decorator, cst.Call):
            name = q.rsplit(".", 1)[1]
            self._change(original_node, f"@torch.cuda.amp.{name} -> @torch.amp.{name}(device_type=device.type)")
            self.uses_device = True
            return updated_node.with_changes(decorator=self._torch(f"amp.{name}(device_type={self.dev}.type)"))
        if q.startswith("triton.") and q.split(".")[-1] in ("jit", "autotune", "heuristics"):
            what, hint = _FOREIGN_MODULES["triton"]
            self._flag(original_node, what, hint)
        return updated_node

    # ---- statements and imports -------------------------------------------------------

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.BaseStatement:
        if len(updated_node.body) == 1 and isinstance(updated_node.body[0], cst.Expr):
            guard = self._guard.pop(id(updated_node.body[0].value), None)
            if guard is not None:
                test, otherwise = guard
                inner = updated_node.with_changes(leading_lines=[])
                orelse = None if otherwise is None else cst.Else(
                    body=cst.IndentedBlock([cst.parse_statement(otherwise + "\n")]))
                return cst.If(test=_expr(test), body=cst.IndentedBlock([inner]), orelse=orelse,
                              leading_lines=updated_node.leading_lines)
        return updated_node

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._flag_foreign(node, cst.helpers.get_full_name_for_node(alias.name) or "")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = cst.helpers.get_full_name_for_node(node.module) if node.module else ""
        self._flag_foreign(node, module or "")
        if module == "numba" and not isinstance(node.names, cst.ImportStar):
            if any(a.evaluated_name == "cuda" for a in node.names):
                self._flag_foreign(node, "numba.cuda")

    def _flag_foreign(self, node: cst.CSTNode, module: str) -> None:
        for name, (what, hint) in _FOREIGN_MODULES.items():
            if module == name or module.startswith(name + "."):
                self._flag(node, what, hint)

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
                         ) -> Union[cst.ImportFrom, cst.RemovalSentinel]:
        module = cst.helpers.get_full_name_for_node(original_node.module) if original_node.module else ""
        if module != "torch.cuda.amp" or isinstance(updated_node.names, cst.ImportStar):
            return updated_node
        keep = [a for a in updated_node.names if a.evaluated_name not in self._removed_imports]
        if len(keep) == len(updated_node.names):
            return updated_node
        self._change(original_node, "import from torch.cuda.amp no longer needed")
        if not keep:
            return cst.RemoveFromParent()
        keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(names=keep)


class _AmpUses(cst.CSTVisitor):
    """Names imported from torch.cuda.amp, and whether each is used other than as a rewritten call."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider, ParentNodeProvider)
    REWRITTEN = {"autocast", "GradScaler", "custom_fwd", "custom_bwd"}

    def __init__(self) -> None:
        self.imported: dict[str, str] = {}   # local name -> torch.cuda.amp name
        self.other_use: set[str] = set()

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        module = cst.helpers.get_full_name_for_node(node.module) if node.module else ""
        if module == "torch.cuda.amp" and not isinstance(node.names, cst.ImportStar):
            for a in node.names:
                self.imported[a.evaluated_alias or a.evaluated_name] = a.evaluated_name
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value not in self.imported:
            return
        real = self.imported[node.value]
        parent = self.get_metadata(ParentNodeProvider, node, None)
        as_call = isinstance(parent, cst.Call) and parent.func is node
        as_decorator = isinstance(parent, cst.Decorator) and real in ("custom_fwd", "custom_bwd")
        if real not in self.REWRITTEN or not (as_call or as_decorator):
            self.other_use.add(real)


def _insert_after_imports(module: cst.Module, torch_alias: Optional[str], dev: str, add_torch: bool,
                          add_device: bool) -> cst.Module:
    """Put ``import torch`` (if missing) and the device definition after the module's leading imports."""
    body = list(module.body)
    index = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
            index = i + 1
        elif i == 0 and isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr) \
                and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
            index = 1  # the docstring
        elif isinstance(stmt, cst.Try) or (isinstance(stmt, cst.If) and index == i):
            continue  # try: import x / except ImportError, if TYPE_CHECKING: ...
        else:
            break
    t = torch_alias or "torch"
    new: list[cst.BaseStatement] = []
    if add_torch:
        new.append(cst.parse_statement("import torch\n"))
    if add_device:
        definition = cst.parse_statement(
            f'{dev} = {t}.accelerator.current_accelerator(check_available=True) or {t}.device("cpu")\n')
        comment = cst.EmptyLine(comment=cst.Comment(
            "# The accelerator (cuda, neuron, ...) or else the CPU: added by `torchneuron migrate`."))
        definition = definition.with_changes(
            leading_lines=[cst.EmptyLine(), comment] if index < len(body) or index else [comment])
        new.append(definition)
    if index < len(body) and not body[index].leading_lines:
        body[index] = body[index].with_changes(leading_lines=[cst.EmptyLine()])
    return module.with_changes(body=[*body[:index], *new, *body[index:]])


def _device_name(bound: set[str]) -> str:
    for name in ("device", "accel_device", "accelerator_device"):
        if name not in bound:
            return name
    i = 2
    while f"accel_device{i}" in bound:
        i += 1
    return f"accel_device{i}"
