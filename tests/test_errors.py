"""Bad input raises a clear Python exception (never a crash), and the device keeps working after it."""

import gc

import pytest
import torch
import torchneuron
import torch.nn.functional as F

# PyTorch warns about some of these inputs (deprecated quantization, beta sparse CSR, resized out=).
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SAME_DEVICE = "Expected all tensors to be on the same device"
INVALID = r"Invalid device neuron:{}: there are 2 neuron devices \(valid indices are 0 to 1\)"


@pytest.fixture(autouse=True, scope="module")
def _collect_what_the_errors_left():
    """The raised errors' tracebacks hold the failed ops' tensors in reference cycles: collect them
    once the module is done, so that later tests' memory statistics do not see them freed."""
    yield
    gc.collect()


def d0(*shape):
    return torch.arange(float(torch.Size(shape).numel() or 1)).reshape(shape).to("neuron:0")


def d1(*shape):
    return d0(*shape).to("neuron:1")


def cpu(*shape):
    return torch.ones(shape)



# (id, callable, expected exception type(s), regex the message must match, marks)
CASES = [
    # ---- device strings and indices ----
    ("device-string-neuron:7", lambda: torch.ones(2, device="neuron:7"), RuntimeError, INVALID.format(7), ()),
    ("device-string-neuron:-2", lambda: torch.device("neuron:-2"), RuntimeError, "Invalid device string: 'neuron:-2'", ()),
    ("device-index-negative", lambda: torch.device("neuron", -2), RuntimeError, "Device index must not be negative", ()),
    ("device-string-garbage", lambda: torch.device("neuron:x"), RuntimeError, "Invalid device string", ()),
    ("torch.device(neuron,7)", lambda: torch.empty(2, device=torch.device("neuron", 7)), RuntimeError, INVALID.format(7), ()),
    ("to-neuron:3", lambda: d0(3).to("neuron:3"), RuntimeError, INVALID.format(3), ()),
    ("cpu-to-neuron:2", lambda: cpu(3).to("neuron:2"), RuntimeError, INVALID.format(2), ()),
    ("tensor.neuron(5)", lambda: cpu(3).neuron(5), RuntimeError, INVALID.format(5), ()),
    ("set_device(9)", lambda: torch.neuron.set_device(9), RuntimeError, INVALID.format(9), ()),
    ("set_device(-2)", lambda: torch.neuron.set_device(-2), RuntimeError, INVALID.format(-2), ()),
    ("set_device(cuda:0)", lambda: torch.neuron.set_device("cuda:0"), ValueError, "Expected a neuron device", ()),
    ("set_device(1.0)", lambda: torch.neuron.set_device(1.0), TypeError, "device index", ()),
    ("device(5)-context", lambda: torch.neuron.device(5).__enter__(), RuntimeError, INVALID.format(5), ()),
    ("accelerator.set_device_index(8)", lambda: torch.accelerator.set_device_index(8), RuntimeError, INVALID.format(8), ()),
    ("get_device_properties(5)", lambda: torch.neuron.get_device_properties(5), RuntimeError, INVALID.format(5), ()),
    ("get_device_name(neuron:4)", lambda: torch.neuron.get_device_name("neuron:4"), RuntimeError, INVALID.format(4), ()),
    ("memory_allocated(4)", lambda: torch.neuron.memory_allocated(4), RuntimeError, INVALID.format(4), ()),
    ("mem_get_info(4)", lambda: torch.neuron.mem_get_info(4), RuntimeError, INVALID.format(4), ()),
    ("synchronize(4)", lambda: torch.neuron.synchronize(4), RuntimeError, INVALID.format(4), ()),
    ("Stream(4)", lambda: torch.neuron.Stream(4), RuntimeError, INVALID.format(4), ()),
    ("Generator(neuron:5)", lambda: torch.Generator(device="neuron:5"), RuntimeError, INVALID.format(5), ()),
    ("get_rng_state(3)", lambda: torch.neuron.get_rng_state(3), RuntimeError, INVALID.format(3), ()),
    # ---- tensors on two devices in one op ----
    ("neuron+cpu", lambda: d0(3) + cpu(3), RuntimeError, SAME_DEVICE + ".*neuron:0 and cpu", ()),
    ("cpu+neuron", lambda: cpu(3) + d0(3), RuntimeError, SAME_DEVICE + ".*neuron:0 and cpu", ()),
    ("cpu+neuron-0dim", lambda: cpu(3) + d0(), RuntimeError, SAME_DEVICE, ()),
    ("neuron:0+neuron:1", lambda: d0(3) + d1(3), RuntimeError, SAME_DEVICE + ".*neuron:0 and neuron:1", ()),
    ("neuron:0+neuron:1-0dim", lambda: d0(3) + d1(), RuntimeError, SAME_DEVICE + ".*neuron:0 and neuron:1", ()),
    ("mm-neuron-cpu", lambda: torch.mm(d0(2, 2), cpu(2, 2)), RuntimeError, SAME_DEVICE + ".*'mat2'", ()),
    ("linear-cpu-weight", lambda: F.linear(d0(1, 5), cpu(2, 5)), RuntimeError, SAME_DEVICE, ()),
    ("cat-neuron-cpu", lambda: torch.cat([d0(2), cpu(2)]), RuntimeError, SAME_DEVICE + ".*neuron:0 and cpu", ()),
    ("cat-neuron0-neuron1", lambda: torch.cat([d0(2), d1(2)]), RuntimeError, SAME_DEVICE + ".*neuron:0 and neuron:1", ()),
    ("stack-neuron1-neuron0", lambda: torch.stack([d1(2), d0(2)]), RuntimeError, SAME_DEVICE + ".*neuron:1 and neuron:0", ()),
    ("where-mixed", lambda: torch.where(d0(3) > 1, d0(3), d1(3)), RuntimeError, SAME_DEVICE, ()),
    ("index-put-values-other-device", lambda: d0(3).index_put_((torch.tensor([0]),), d1(1)), RuntimeError, SAME_DEVICE, ()),
    ("index-with-other-device-index", lambda: d0(3)[torch.tensor([0], device="neuron:1")], RuntimeError, SAME_DEVICE, ()),
    ("out=cpu-tensor", lambda: torch.add(d0(3), 1, out=cpu(3)), RuntimeError, SAME_DEVICE + ".*'out'", ()),
    ("out=neuron:1-tensor", lambda: torch.add(d0(3), 1, out=d1(3)), RuntimeError, SAME_DEVICE + ".*'out'", ()),
    ("out=neuron-for-cpu-inputs", lambda: torch.add(cpu(3), 1, out=d0(3)), RuntimeError, SAME_DEVICE, ()),
    ("out=cpu-0dim-tensor", lambda: torch.add(d0(3), 1, out=torch.empty(())), RuntimeError, SAME_DEVICE, ()),
    ("cpu-generator", lambda: torch.rand(3, device="neuron", generator=torch.Generator()), RuntimeError,
     "Expected a 'neuron' device type for generator but found 'cpu'", ()),
    # ---- unsupported layouts and tensor kinds ----
    ("sparse-op-without-cpu-kernel", lambda: torch.cumsum(d0(2, 2).to_sparse(), 0), NotImplementedError,
     "aten::cumsum.*torch.sparse_coo.*neuron", ()),
    ("sparse-neuron+sparse-cpu", lambda: d0(2, 2).to_sparse() + torch.eye(2).to_sparse(), RuntimeError,
     SAME_DEVICE + ".*neuron:0 and cpu", ()),
    ("to_mkldnn", lambda: d0(2, 2).to_mkldnn(), NotImplementedError, "neuron", ()),
    ("quantize_per_channel-axis", lambda: torch.quantize_per_channel(
        d0(2, 3), torch.ones(3, dtype=torch.double, device="neuron"), torch.zeros(3, dtype=torch.long, device="neuron"),
        5, torch.quint8), RuntimeError, "Channel axis out of range", ()),
    ("pin_memory-of-neuron-tensor", lambda: d0(3).pin_memory(), RuntimeError, "only dense CPU tensors can be pinned", ()),
    ("empty(pin_memory=True)-on-neuron", lambda: torch.empty(3, device="neuron", pin_memory=True), RuntimeError,
     "(?i)only dense CPU tensors can be pinned", ()),
    ("numpy", lambda: d0(3).numpy(), TypeError, "can't convert neuron:0 device type tensor to numpy", ()),
    # ---- random number generator state ----
    ("set_rng_state-short", lambda: torch.neuron.set_rng_state(torch.zeros(5, dtype=torch.uint8)), RuntimeError,
     "size", ()),
    ("set_rng_state-invalid-mt19937", lambda: torch.neuron.set_rng_state(torch.full((5056,), 255, dtype=torch.uint8)),
     RuntimeError, "state", ()),
    ("set_rng_state-float", lambda: torch.neuron.set_rng_state(torch.zeros(5056)), TypeError, "ByteTensor", ()),
    ("set_rng_state-list", lambda: torch.neuron.set_rng_state([0] * 5056), TypeError, "ByteTensor", ()),
    # ---- bad shapes, indices and values (the CPU kernels' own checks) ----
    ("negative-dimension", lambda: torch.empty(-1, device="neuron"), RuntimeError, "negative dimension", ()),
    ("view-bad-shape", lambda: d0(5).view(3, 2), RuntimeError, "invalid for input of size 5", ()),
    ("index-out-of-range", lambda: d0(5)[10], IndexError, "out of bounds", ()),
    ("advanced-index-out-of-range", lambda: d0(5)[torch.tensor([10], device="neuron")], IndexError, "out of bounds", ()),
    ("gather-out-of-range", lambda: d0(5).gather(0, torch.tensor([10], device="neuron")), RuntimeError, "out of bounds", ()),
    ("scatter-out-of-range", lambda: d0(5).scatter(0, torch.tensor([10], device="neuron"), 1.0), RuntimeError, "out of bounds", ()),
    ("index_select-out-of-range", lambda: d0(5).index_select(0, torch.tensor([7], device="neuron")), IndexError, "out of range", ()),
    ("embedding-out-of-range", lambda: F.embedding(torch.tensor([10], device="neuron"), d0(3, 2)), IndexError, "out of range", ()),
    ("cross_entropy-bad-target", lambda: F.cross_entropy(d0(2, 3), torch.tensor([0, 5], device="neuron")), IndexError,
     "out of bounds", ()),
    ("item-of-many", lambda: d0(5).item(), RuntimeError, "cannot be converted to Scalar", ()),
    ("mm-shapes", lambda: torch.mm(d0(5, 1), d0(5, 1)), RuntimeError, "cannot be multiplied", ()),
    ("mm-dtypes", lambda: torch.mm(d0(5, 1).long(), d0(1, 5)), RuntimeError, "same dtype", ()),
    ("int-division-by-zero", lambda: torch.tensor([1], device="neuron") // torch.tensor([0], device="neuron"),
     RuntimeError, "ZeroDivisionError", ()),
    ("multinomial-negative", lambda: torch.multinomial(-torch.ones(3, device="neuron"), 1), RuntimeError, "element < 0", ()),
    ("cholesky-not-pd", lambda: torch.linalg.cholesky(-torch.eye(2, device="neuron")), torch.linalg.LinAlgError,
     "positive-definite", ()),
    ("bool-of-many", lambda: bool(d0(3)), RuntimeError, "ambiguous", ()),
    # ---- memory ----
    ("huge-empty", lambda: torch.empty(1 << 43, device="neuron"), torch.OutOfMemoryError, "neuron:0", ()),
    ("huge-resize_", lambda: torch.empty(0, device="neuron:1").resize_(1 << 43), torch.OutOfMemoryError, "neuron:1", ()),
    ("huge-storage", lambda: torch.UntypedStorage(1 << 45, device="neuron"), torch.OutOfMemoryError, "neuron:0", ()),
]


def _deferred():
    return torchneuron._C._async_mode() or torch.neuron.get_eager_mode() == "fused"


def run_to_completion(fn):
    """Calls fn; with asynchronous streams or fused eager, also waits for the work it queued or
    recorded (as on CUDA, an error that only the kernel finds is raised at the next synchronization:
    a RuntimeError with asynchronous streams, the kernel's own error type in fused eager)."""
    fn()
    if _deferred():
        torch.neuron.synchronize(0)
        torch.neuron.synchronize(1)


def expected(exc):
    return (exc, RuntimeError) if _deferred() else exc


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0], marks=c[4]) for c in CASES])
def test_bad_input_raises_and_device_keeps_working(case, device_works, two_devices):
    _, fn, exc, pattern, _ = case
    with pytest.raises(expected(exc), match=pattern):
        run_to_completion(fn)
    assert torch.neuron.current_device() == 0
    device_works("neuron:0")
    device_works("neuron:1")
    x = torch.randn(4, device="neuron")
    torch.testing.assert_close((x * 2).cpu(), x.cpu() * 2)


def test_many_errors_in_a_row_leak_no_memory(device_works):
    import gc
    gc.collect()
    start = torch.neuron.memory_allocated()
    for _, fn, exc, _, marks in CASES:
        if marks:
            continue
        try:
            run_to_completion(fn)
        except expected(exc):
            pass
    gc.collect()
    assert torch.neuron.memory_allocated() == start
    device_works()


@pytest.mark.parametrize("op", ["_flash_attention_forward", "_efficient_attention_forward"])
def test_op_without_cpu_kernel_names_neuron_and_the_op(op, device_works):
    q = torch.randn(1, 2, 8, 16, device="neuron")
    args = {"_flash_attention_forward": (q, q, q, None, None, 8, 8, 0.0, False, False),
            "_efficient_attention_forward": (q, q, q, None, None, None, None, None, 0.0, 0)}[op]
    with pytest.raises(NotImplementedError, match=rf"aten::{op} is not implemented for neuron: .* only on meta") as e:
        getattr(torch.ops.aten, op)(*args)
    assert "'CPU' backend" not in str(e.value)
    device_works()
