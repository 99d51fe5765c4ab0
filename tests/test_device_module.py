"""What PyTorch's device-generic code reads from ``torch.neuron``, re-derived from the installed torch.

PyTorch reaches an accelerator's Python module the way it reaches ``torch.cuda``:
``torch.get_device_module(device)``, ``torch._utils._get_device_module``,
``_get_device_handle`` (DeviceMesh, DTensor, FSDP), ``getattr(torch, device_type)``,
and wrappers that forward every attribute to the module (FSDP's ``_FSDPDeviceHandle``,
``_LocalDeviceHandle``). Whatever it reads there with ``getattr(mod, "name", default)``
or ``hasattr`` silently takes a default when the module lacks it: ``torch.utils.checkpoint``
skipped the RNG state of a device whose module had no ``_initialized``.

The scan below walks torch's Python sources with ``ast`` and collects every attribute read
on such a module (and on the generators PyTorch takes from it). ``EXPECTED`` is the
reviewed result; a PyTorch release that reads something new fails
``test_every_name_read_is_reviewed`` instead of taking the default. docs/runtime.md
("What PyTorch reads from torch.neuron") shows the same table.
"""

import ast
import functools
import re
import time
import types
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

# ---- the reviewed table ----------------------------------------------------------------------
# Each name PyTorch reads from a device module -> where (paths under torch/).
EXPECTED = {
    # devices
    "is_available": "accelerator, serialization.py, autograd/graph.py, DCP, FSDP, DTensor random, torchrun, Inductor",
    "device_count": "accelerator, random.py (fork_rng), serialization.py, device_mesh.py, FSDP, DCP, torchrun",
    "current_device": "_utils.py (_get_device_index), fake_tensor.py, FSDP, DCP, sharded tensor",
    "set_device": "distributed/device_mesh.py",
    "is_initialized": "distributed/device_mesh.py, _subclasses/fake_tensor.py",
    "_initialized": "utils/checkpoint.py (stashes the device RNG state only when true)",
    "device": "utils/checkpoint.py, _utils.py (_to, storages)",
    "get_device_name": "_dynamo/package.py",
    "get_device_properties": "_utils.py (_get_devices_properties)",
    "synchronize": "autograd/profiler.py, FSDP (state dict, optimizer state, unshard)",
    "_utils": "serialization.py (map_location)",
    "_utils._get_device_index": "serialization.py (map_location)",
    "__name__": "_dynamo/variables/torch.py (traces get_device_module as torch.<last part>)",
    # streams and events
    "Stream": "FSDP (_runtime_utils.py, _fsdp_param_group.py)",
    "Event": "FSDP (_runtime_utils.py, _fsdp_param_group.py)",
    "stream": "FSDP, DCP filesystem.py, tensor parallel fsdp.py",
    "current_stream": "FSDP, DCP filesystem.py, comm hooks, tensor parallel fsdp.py",
    "_sleep": "testing/_internal/common_utils.py (device_sleep)",
    # memory
    "empty_cache": "distributed/_tools/memory_tracker.py",
    "memory_allocated": "distributed/_tools/memory_tracker.py",
    "memory_reserved": "distributed/_tools/memory_tracker.py",
    "memory_stats": "distributed/_tools/memory_tracker.py",
    "memory_summary": "distributed/fsdp/_optim_utils.py",
    "sparse": "_utils.py (_to, sparse storages)",
    # random
    "get_rng_state": "utils/checkpoint.py, random.py (fork_rng), DTensor random, LocalTensor, aot_autograd",
    "set_rng_state": "utils/checkpoint.py, random.py (fork_rng), DTensor random, LocalTensor",
    "manual_seed_all": "random.py (torch.manual_seed)",
    "_is_in_bad_fork": "random.py (torch.manual_seed)",
    "default_generators": "_prims/rng_prims.py (graph-safe RNG)",
    "_get_generator": "_functorch/_aot_autograd/utils.py (graph-safe RNG)",
    "set_rng_ctx": "distributed/tensor/_random.py (hpu only)",
    "unset_rng_ctx": "distributed/tensor/_random.py (hpu only)",
    # autocast
    "get_amp_supported_dtype": "amp/autocast_mode.py (PrivateUse1 only)",
    # Inductor's init_backend_registration (PrivateUse1 only)
    "Scheduling": "_inductor/codegen/common.py",
    "PythonWrapperCodegen": "_inductor/codegen/common.py",
    "CppWrapperCodegen": "_inductor/codegen/common.py",
    "WrapperFxCodegen": "_inductor/codegen/common.py",
}

# Names torch.cuda lacks: whether torch.neuron has them, and why.
NOT_IN_CUDA = {
    "get_amp_supported_dtype": (True, "autocast asks a PrivateUse1 module which dtypes it supports"),
    "Scheduling": (True, "Inductor's kernel scheduler for a PrivateUse1 device (loads torchneuron.compile)"),
    "PythonWrapperCodegen": (True, "Inductor's wrapper code generator for a PrivateUse1 device"),
    "CppWrapperCodegen": (False, "with all three of Scheduling, PythonWrapperCodegen and CppWrapperCodegen "
                                 "Inductor registers the device itself, replacing torchneuron's registration "
                                 "and its custom pass and config (torchneuron/compile/registration.py registers it)"),
    "WrapperFxCodegen": (False, "only passed along with CppWrapperCodegen (above)"),
    "set_rng_ctx": (False, "hpu's: DTensor selects hpu's philox generator with it"),
    "unset_rng_ctx": (False, "hpu's: pairs with set_rng_ctx"),
}

# Names torch.cuda has that torch.neuron leaves out on purpose.
LEFT_OUT = {
    "sparse": "torch.cuda.sparse holds the legacy sparse tensor types; neuron's sparse tensors are ordinary "
              "torch.sparse_coo and compressed tensors, and _to reads it only for legacy sparse storages, "
              "which neuron does not have",
}

# Names that belong to torchneuron/neuron/random.py, not added there yet.
PENDING: dict[str, str] = {}

# Reads whose attribute name is computed at run time: where -> why that is fine.
DYNAMIC = {
    "storage.py: getattr(module, storage_name)":
        "legacy typed storage classes (torch.cuda.FloatStorage); _get_legacy_storage_class returns None "
        "for the PrivateUse1 device before reading",
}

# What PyTorch reads from a device's generator (``mod.default_generators[i]``, ``mod._get_generator(d)``).
GENERATOR_EXPECTED = {
    "clone_state": "_functorch/_aot_autograd (graph-safe RNG)",
    "graphsafe_get_state": "_prims/rng_prims.py (graph-safe RNG)",
    "graphsafe_set_state": "_prims/rng_prims.py (graph-safe RNG)",
}

# A scan that misses these is broken.
MUST_FIND = {"_initialized", "get_rng_state", "set_rng_state", "device_count", "is_available",
             "current_stream", "get_amp_supported_dtype", "manual_seed_all"}


# ---- the scan ---------------------------------------------------------------------------------
TORCH_DIR = Path(torch.__file__).parent
SOURCES = {"get_device_module", "_get_device_module", "_get_device_handle"}  # calls returning a device module
DEVICE_TEXT = re.compile(r"device|backend|gpu|privateuse1", re.I)  # `x` in getattr(torch, x) names a device
_GETATTR_TORCH = re.compile(rb"getattr\(\s*torch\s*,\s*([\w.]+)")
_IDENTIFIER_BYTES = frozenset(b"_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _may_get_device_module(text):
    """Whether ``text`` has ``getattr(torch, x)`` where ``x``, or what a loop binds it to, names a device."""
    for m in _GETATTR_TORCH.finditer(text):
        x = m.group(1)
        loop = rb"for\s+" + re.escape(x) + rb"\s+in\s+[^:\n]*(?:" + DEVICE_TEXT.pattern.encode() + rb")"
        if DEVICE_TEXT.search(x.decode()) or re.search(loop, text, re.I):
            return True
    return False


def _names(text, word):
    """Whether ``text`` has ``word`` as a whole identifier (faster than one regex alternation of them all)."""
    i = text.find(word)
    while i >= 0:
        j = i + len(word)
        if (i == 0 or text[i - 1] not in _IDENTIFIER_BYTES) and (j == len(text) or text[j] not in _IDENTIFIER_BYTES):
            return True
        i = text.find(word, j)
    return False


def _callee(func):
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_BINDERS = (ast.Assign, ast.AnnAssign, ast.NamedExpr, ast.For, ast.comprehension)
_READS = (ast.Return, ast.Call, ast.Attribute)


def _partition(node):
    """A scope's own nodes that bind names, that may read, and its nested functions (with their class)."""
    binders, reads, functions, todo = [], [], [], [(child, None) for child in ast.iter_child_nodes(node)]
    while todo:
        n, cls = todo.pop()
        if isinstance(n, _FUNCTIONS):
            functions.append((n, cls))
            continue
        if isinstance(n, _BINDERS):
            binders.append(n)
        elif isinstance(n, _READS):
            reads.append(n)
        name = n.name if isinstance(n, ast.ClassDef) else None
        todo.extend((child, name) for child in ast.iter_child_nodes(n))
    return binders, reads, functions


class _Scope:
    """What a function (or module) binds: device modules, generators, strings; closures see their parent's."""

    def __init__(self, parent=None):
        self.modules = set(parent.modules) if parent else set()
        self.generators = set(parent.generators) if parent else set()
        self.strings = {k: set(v) for k, v in parent.strings.items()} if parent else {}
        self.sequences = {k: set(v) for k, v in parent.sequences.items()} if parent else {}
        self.loops = dict(parent.loops) if parent else {}
        self.function, self.params = None, []


class DeviceModuleScan:
    """Attribute reads on device modules and their generators in torch's Python sources.

    A device module is a call in ``SOURCES``, ``getattr(torch, <device type>)``, a wrapper class
    whose ``__getattr__`` forwards to one, a local name assigned one, an attribute name
    (``self._device_handle``) assigned one anywhere in torch, or a parameter named like such an
    attribute. Reads are ``mod.a.b``, ``getattr``/``hasattr(mod, "a")`` with a literal, a string
    constant or a loop over a list of them, calls of functions that do ``getattr(mod, param)``
    (``_get_custom_mod_func("Scheduling")``), and reads in lambdas handed a module by a function
    (``_get_device_attr(lambda m: m.current_device())``). It repeats until none of these grow.
    """

    def __init__(self, root=TORCH_DIR):
        self.root = root
        self.holder_attrs, self.wrappers, self.generator_getters = set(), set(), set()
        self.callback_takers, self.name_takers = {}, {}
        self.reads, self.generator_reads, self.dynamic = defaultdict(set), defaultdict(set), {}
        self._trees, self._own, self._lambda_params, self._inner = {}, {}, {}, set()

    def run(self):
        sources = {str(p.relative_to(self.root)): p.read_bytes() for p in self.root.rglob("*.py")}
        for _ in range(20):
            state = repr((sorted(self.holder_attrs), sorted(self.wrappers), sorted(self.generator_getters),
                          sorted(self.callback_takers.items()), sorted(self.name_takers.items())))
            words = (SOURCES | self.holder_attrs | {a[1:] for a in self.holder_attrs if a[:1] == "_" != a[1:2]}
                     | self.wrappers | self.generator_getters | set(self.callback_takers) | set(self.name_takers))
            # A file can only matter if it names one of these; parsing all of torch takes long.
            needles = [w.encode() for w in words]
            for path, text in sources.items():
                if path not in self._trees and (any(_names(text, w) for w in needles)
                                                or _may_get_device_module(text)):
                    try:
                        self._trees[path] = ast.parse(text)
                    except SyntaxError:  # a file for a newer Python
                        self._trees[path] = None
            self.reads.clear(), self.generator_reads.clear(), self.dynamic.clear()
            for path, tree in self._trees.items():
                if tree is not None:
                    self._scope(tree, _Scope(), path, None)
            if state == repr((sorted(self.holder_attrs), sorted(self.wrappers), sorted(self.generator_getters),
                              sorted(self.callback_takers.items()), sorted(self.name_takers.items()))):
                return self
        raise AssertionError("the scan did not settle")

    # -- what an expression is
    def is_module(self, e, s):
        if isinstance(e, ast.Name):
            return e.id in s.modules
        if isinstance(e, ast.Attribute):
            return e.attr in self.holder_attrs
        if isinstance(e, ast.NamedExpr):
            return self.is_module(e.value, s)
        if isinstance(e, ast.IfExp):
            return self.is_module(e.body, s) or self.is_module(e.orelse, s)
        if not isinstance(e, ast.Call):
            return False
        f = e.func
        if _callee(f) in SOURCES or (isinstance(f, ast.Name) and f.id in self.wrappers):
            return True
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.wrappers:
            return True  # _FSDPDeviceHandle.from_device(...)
        if (isinstance(f, ast.Name) and f.id == "getattr" and len(e.args) >= 2 and isinstance(e.args[0], ast.Name)
                and e.args[0].id == "torch" and not isinstance(e.args[1], ast.Constant)):
            text = ast.unparse(e.args[1])
            if isinstance(e.args[1], ast.Name) and e.args[1].id in s.loops:  # for x in GPU_TYPES
                text += " " + ast.unparse(s.loops[e.args[1].id])
            return bool(DEVICE_TEXT.search(text))
        return False

    def is_generator(self, e, s):
        if isinstance(e, ast.Name):
            return e.id in s.generators
        if isinstance(e, ast.Subscript):
            v = e.value
            return isinstance(v, ast.Attribute) and v.attr == "default_generators" and self.is_module(v.value, s)
        if isinstance(e, ast.Call):
            f = e.func
            return ((isinstance(f, ast.Attribute) and f.attr == "_get_generator" and self.is_module(f.value, s))
                    or _callee(f) in self.generator_getters)
        return False

    def _strings(self, e, s):
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            return {e.value}
        return s.strings.get(e.id) if isinstance(e, ast.Name) else None

    def _sequence(self, e, s):
        if isinstance(e, (ast.List, ast.Tuple, ast.Set)) and all(
                isinstance(x, ast.Constant) and isinstance(x.value, str) for x in e.elts):
            return {x.value for x in e.elts}
        return s.sequences.get(e.id) if isinstance(e, ast.Name) else None

    # -- a scope: bind names until nothing changes, then collect reads, then nested scopes
    def _scope(self, node, s, path, cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            s.function, s.params = getattr(node, "name", None), [p.arg for p in a.posonlyargs + a.args]
            for p in a.posonlyargs + a.args + a.kwonlyargs:
                annotation = ast.unparse(p.annotation) if p.annotation is not None else ""
                if (p.arg in self.holder_attrs or (p.arg[:1] != "_" and "_" + p.arg in self.holder_attrs)
                        or any(w in annotation for w in self.wrappers)):
                    s.modules.add(p.arg)
            s.modules |= self._lambda_params.get(id(node), set())
        if id(node) not in self._own:
            self._own[id(node)] = _partition(node)
        binders, reads, functions = self._own[id(node)]
        changed = True
        while changed:
            changed = False
            for n in binders:
                changed |= self._bind(n, s)
        for n in reads:
            if isinstance(n, ast.Call):
                self._call(n, s, path, cls)
            elif isinstance(n, ast.Attribute):
                self._attribute(n, s, path)
            elif n.value is not None and s.function and self.is_generator(n.value, s):
                self.generator_getters.add(s.function)
        for n, in_class in functions:
            self._scope(n, _Scope(s), path, in_class)

    def _bind(self, n, s):
        changed = False
        if isinstance(n, (ast.For, ast.comprehension)) and isinstance(n.target, ast.Name):
            s.loops[n.target.id] = n.iter
            seq = self._sequence(n.iter, s)
            if seq and not seq <= s.strings.get(n.target.id, set()):
                s.strings.setdefault(n.target.id, set()).update(seq)
                changed = True
        if isinstance(n, ast.Assign):
            targets, value = n.targets, n.value
        elif isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
            targets, value = [n.target], n.value
        else:
            return changed
        for t in targets:
            if isinstance(t, ast.Attribute) and self.is_module(value, s):
                self.holder_attrs.add(t.attr)
            if not isinstance(t, ast.Name):
                continue
            for is_kind, names in ((self.is_module, s.modules), (self.is_generator, s.generators)):
                if t.id not in names and is_kind(value, s):
                    names.add(t.id)
                    changed = True
            if isinstance(value, ast.Constant) and isinstance(value.value, str) \
                    and value.value not in s.strings.get(t.id, ()):
                s.strings.setdefault(t.id, set()).add(value.value)
                changed = True
            seq = self._sequence(value, s)
            if seq and not seq <= s.sequences.get(t.id, set()):
                s.sequences.setdefault(t.id, set()).update(seq)
                changed = True
        return changed

    def _attribute(self, n, s, path):
        if id(n) in self._inner or not isinstance(n.ctx, ast.Load):
            return
        chain, nodes = [n.attr], [n]
        while isinstance(nodes[-1].value, ast.Attribute):
            self._inner.add(id(nodes[-1].value))
            nodes.append(nodes[-1].value)
            chain.append(nodes[-1].attr)
        for k in range(len(nodes) - 1, -1, -1):  # from the innermost module or generator outwards
            name = ".".join(reversed(chain[:k + 1]))
            if self.is_module(nodes[k].value, s):
                self.reads[name].add(path)
                return
            if self.is_generator(nodes[k].value, s):
                self.generator_reads[name].add(path)
                return

    def _call(self, n, s, path, cls):
        f = n.func
        if isinstance(f, ast.Name) and f.id in ("getattr", "hasattr") and len(n.args) >= 2:
            target, key = n.args[:2]
            module, generator = self.is_module(target, s), self.is_generator(target, s)
            if module or generator:
                names = self._strings(key, s)
                if names is not None:
                    for name in names:
                        (self.reads if module else self.generator_reads)[name].add(path)
                elif isinstance(key, ast.Name) and key.id in s.params and s.function == "__getattr__" and cls:
                    self.wrappers.add(cls)  # forwards every attribute to the module
                elif isinstance(key, ast.Name) and key.id in s.params and s.function:
                    self.name_takers[s.function] = (s.params.index(key.id), key.id)
                else:
                    self.dynamic[f"{path}: {ast.unparse(n)}"] = n.lineno
        if isinstance(f, ast.Name) and f.id in s.params and s.function:
            for i, arg in enumerate(n.args):
                if self.is_module(arg, s):  # get_member(getattr(torch, device_type))
                    self.callback_takers[s.function] = (s.params.index(f.id), i)
        callee = _callee(f)
        if callee in self.name_takers:
            pos, param = self.name_takers[callee]
            arg = n.args[pos] if pos < len(n.args) else next((k.value for k in n.keywords if k.arg == param), None)
            names = None if arg is None else self._strings(arg, s)
            if arg is not None and names is None:
                self.dynamic[f"{path}: {ast.unparse(n)}"] = n.lineno
            for name in names or ():
                self.reads[name].add(path)
        if callee in self.callback_takers:
            pos, i = self.callback_takers[callee]
            for arg in n.args[pos:pos + 1]:
                if isinstance(arg, ast.Lambda) and i < len(arg.args.args):
                    self._lambda_params[id(arg)] = {arg.args.args[i].arg}


def _dotted(name):
    """``a.b`` stays dotted only where ``torch.cuda.a`` is a module (``_utils._get_device_index``)."""
    first, _, rest = name.partition(".")
    return name if rest and isinstance(getattr(torch.cuda, first, None), types.ModuleType) else first


@functools.cache
def _scan():
    scan = DeviceModuleScan().run()
    reads = defaultdict(set)
    for name, paths in scan.reads.items():
        reads[_dotted(name)] |= paths
    return dict(reads), dict(scan.generator_reads), scan.dynamic


def _lookup(module, dotted):
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _has(module, dotted):
    try:
        _lookup(module, dotted)
        return True
    except AttributeError:
        return False


# ---- the table matches the installed torch ----------------------------------------------------

def test_scan_finds_the_names_it_must():
    reads, generator_reads, _ = _scan()
    assert MUST_FIND <= set(reads), f"the scan of {TORCH_DIR} is broken: missing {sorted(MUST_FIND - set(reads))}"
    assert "graphsafe_set_state" in generator_reads


_SAMPLE = """
import torch
from torch._utils import _get_device_module

def reads(device_type):
    mod = torch.get_device_module(device_type)
    mod.alpha()
    getattr(torch, device_type).beta.sub
    if hasattr(_get_device_module(device_type), "gamma"):
        pass
    for name in ("delta", "epsilon"):
        getattr(mod, name, None)
    mod.default_generators[0].kappa()
    getattr(mod, compute())
    torch.cuda.not_generic()

class Handle:
    def __init__(self, device):
        self.__mod = getattr(torch, device.type)

    def __getattr__(self, name):
        return getattr(self.__mod, name)

class User:
    def __init__(self, device):
        self._device_handle = Handle.from_device(device)

    def run(self):
        self._device_handle.zeta()

def helper(device_handle):
    return device_handle.eta

def pick(get_member):
    return get_member(getattr(torch, torch._C._get_privateuse1_backend_name()))

def theta():
    return pick(lambda m: m.theta())

def custom(func_name):
    return getattr(getattr(torch, backend_name()), func_name)

custom("iota")
"""


def test_scan_follows_each_way_to_a_device_module(tmp_path):
    (tmp_path / "sample.py").write_text(_SAMPLE)
    (tmp_path / "unrelated.py").write_text("import torch\nx = getattr(torch, 'float32').itemsize\n")
    scan = DeviceModuleScan(tmp_path).run()
    assert set(scan.reads) == {"alpha", "beta.sub", "gamma", "delta", "epsilon", "default_generators", "zeta",
                               "eta", "theta", "iota"}
    assert set(scan.generator_reads) == {"kappa"}
    assert list(scan.dynamic) == ["sample.py: getattr(mod, compute())"]
    assert scan.wrappers == {"Handle"}


def test_every_name_read_is_reviewed():
    reads, _, _ = _scan()
    new = {name: sorted(paths) for name, paths in reads.items() if name not in EXPECTED}
    assert not new, (f"torch {torch.__version__} reads names from device modules that EXPECTED lacks: {new}. "
                     "Give torch.neuron each with torch.cuda's meaning, then add it to EXPECTED and docs/runtime.md.")


def test_table_has_no_stale_names():
    reads, _, _ = _scan()
    stale = set(EXPECTED) - set(reads)
    assert not stale, f"torch {torch.__version__} no longer reads {sorted(stale)}: remove them from EXPECTED"


def test_dynamic_reads_are_reviewed():
    _, _, dynamic = _scan()
    assert set(dynamic) == set(DYNAMIC), {"new": sorted(set(dynamic) - set(DYNAMIC)),
                                          "gone": sorted(set(DYNAMIC) - set(dynamic))}


def test_generator_reads_are_reviewed():
    _, generator_reads, _ = _scan()
    assert set(generator_reads) == set(GENERATOR_EXPECTED), {
        "new": {k: sorted(v) for k, v in generator_reads.items() if k not in GENERATOR_EXPECTED},
        "gone": sorted(set(GENERATOR_EXPECTED) - set(generator_reads))}


def test_exception_lists_name_table_entries():
    for table in (NOT_IN_CUDA, LEFT_OUT, PENDING):
        assert set(table) <= set(EXPECTED)
    assert not set(NOT_IN_CUDA) & set(LEFT_OUT)


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=PENDING[n])) if n in PENDING else n
    for n in sorted(EXPECTED)])
def test_neuron_has_what_cuda_has(name):
    if name in NOT_IN_CUDA:
        expected, reason = NOT_IN_CUDA[name]
        assert not _has(torch.cuda, name), f"torch.cuda.{name} exists now: move it out of NOT_IN_CUDA"
        assert _has(torch.neuron, name) == expected, reason
    elif name in LEFT_OUT:
        assert _has(torch.cuda, name) and not _has(torch.neuron, name), LEFT_OUT[name]
    else:
        assert _has(torch.cuda, name), f"torch.cuda.{name} is gone: list it in NOT_IN_CUDA with a reason"
        assert _has(torch.neuron, name), f"torch.neuron.{name} is missing (read by {EXPECTED[name]})"
        if not name.startswith("__"):
            assert callable(_lookup(torch.cuda, name)) == callable(_lookup(torch.neuron, name))


# ---- with torch.cuda's meaning -----------------------------------------------------------------

def test_initialized_once_used():
    # As torch.cuda's: true once the device is used (tests/test_fork.py: not at import, not in a bad fork).
    torch.ones(1, device="neuron")
    assert torch.neuron._initialized is True
    assert torch.neuron.is_initialized()
    assert torch.neuron._is_in_bad_fork() is False


def _dropout_sum(x):
    return torch.nn.functional.dropout(x * 2, 0.5, training=True).sum()


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_recomputes_with_the_forward_rng_state(use_reentrant):
    # Checkpointing stashes a device's RNG state only when its module's _initialized is true.
    x = torch.ones(256, device="neuron", requires_grad=True)
    torch.manual_seed(0)
    _dropout_sum(x).backward()
    expected, x.grad = x.grad.cpu(), None
    torch.manual_seed(0)
    checkpoint(_dropout_sum, x, use_reentrant=use_reentrant).backward()
    torch.testing.assert_close(x.grad.cpu(), expected, rtol=0, atol=0)


def test_fork_rng_restores_the_neuron_generator():
    torch.manual_seed(3)
    expected = torch.rand(8, device="neuron").cpu()
    torch.manual_seed(3)
    with torch.random.fork_rng(devices=range(torch.neuron.device_count()), device_type="neuron"):
        torch.rand(8, device="neuron")
    torch.testing.assert_close(torch.rand(8, device="neuron").cpu(), expected, rtol=0, atol=0)


def test_manual_seed_reaches_neuron_through_the_privateuse1_path():
    torch.manual_seed(5)
    a = torch.rand(4, device="neuron:1").cpu()
    torch.manual_seed(5)
    torch.testing.assert_close(torch.rand(4, device="neuron:1").cpu(), a, rtol=0, atol=0)


def test_device_queries_agree_with_torch_accelerator():
    assert torch.accelerator.device_count() == torch.neuron.device_count()
    assert torch.accelerator.is_available() is torch.neuron.is_available() is True
    assert torch.neuron._utils._get_device_index("neuron:1", True) == 1
    assert torch.neuron._utils._get_device_index(torch.device("neuron"), True) == torch.neuron.current_device()


def test_dynamo_finds_the_module_as_torch_neuron():
    assert torch.neuron.__name__.rsplit(".", maxsplit=1)[-1] == "neuron"
    assert getattr(torch, torch.neuron.__name__.rsplit(".", maxsplit=1)[-1]) is torch.neuron


def test_sleep_occupies_the_current_stream():
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    torch.neuron._sleep(20_000_000)  # 20 ms at the nominal 1 GHz
    end.record()
    end.synchronize()
    assert 15 <= start.elapsed_time(end) < 2000
    before = time.perf_counter()
    torch.neuron._sleep(0)
    assert time.perf_counter() - before < 0.1


def test_autocast_accepts_the_supported_dtypes():
    assert set(torch.neuron.get_amp_supported_dtype()) == {torch.float16, torch.bfloat16}
    for dtype in torch.neuron.get_amp_supported_dtype():
        with torch.autocast("neuron", dtype=dtype):
            a = torch.ones(2, 2, device="neuron")
            assert (a @ a).dtype == dtype


def _draw(generator=None):
    return torch.rand(5, device="neuron", generator=generator).cpu()


def test_generator_state_as_graph_safe_rng_reads_it():
    # As _prims/rng_prims.py runs an op on another state, and aot_autograd copies one with clone_state.
    g = torch.neuron.default_generators[0]
    g.manual_seed(11)
    expected_11 = _draw()
    g.manual_seed(11)
    other = g.clone_state()
    torch.testing.assert_close(_draw(other), expected_11, rtol=0, atol=0)  # a copy: g did not move
    torch.testing.assert_close(_draw(), expected_11, rtol=0, atol=0)
    g.manual_seed(12)
    expected_12 = _draw()
    g.manual_seed(11)
    other = g.clone_state()
    g.manual_seed(12)
    current = g.graphsafe_get_state()
    g.graphsafe_set_state(other)
    torch.testing.assert_close(_draw(), expected_11, rtol=0, atol=0)
    g.graphsafe_set_state(current)
    torch.testing.assert_close(_draw(), expected_12, rtol=0, atol=0)
