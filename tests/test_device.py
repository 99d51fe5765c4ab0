"""Registration of the neuron device and the ``torch.neuron`` / ``torch.accelerator`` APIs."""

import threading

import pytest
import torch


# ---- registration and autoload --------------------------------------------------------------

def test_autoload_registers_neuron_at_import_torch(run_python):
    # One interpreter checks autoload and TORCHNEURON_NUM_DEVICES (subprocesses are slow).
    r = run_python("import sys, torch\n"
                   "print(torch.accelerator.current_accelerator())\n"
                   "print('torchneuron' in sys.modules, hasattr(torch, 'neuron'))\n"
                   "print(torch._C._get_privateuse1_backend_name())\n"
                   "print(torch.neuron.device_count(), torch.accelerator.device_count())\n"
                   "print(torch.ones(1, device='neuron:2').device)",
                   env={"TORCHNEURON_NUM_DEVICES": "3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["neuron", "True", "True", "neuron", "3", "3", "neuron:2"]


def test_autoload_can_be_disabled(run_python):
    r = run_python("import sys, torch\n"
                   "print(torch.accelerator.current_accelerator())\n"
                   "print('torchneuron' in sys.modules, hasattr(torch, 'neuron'))\n"
                   "try:\n"
                   "    torch.ones(1, device='neuron')\n"
                   "except RuntimeError:\n"
                   "    print('unknown-device')\n"
                   "import torchneuron\n"
                   "print(torch.accelerator.current_accelerator(), torch.ones(2, device='neuron').device)",
                   env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["None", "False", "False", "unknown-device", "neuron", "neuron:0"]


_BACKWARD_THREAD = ("import threading, torch\n"
                    "seen = []\n"
                    "x = torch.ones(3, device='neuron:1', requires_grad=True)\n"
                    "y = x * torch.ones(3, device='neuron:0').to('neuron:1')\n"
                    "y.register_hook(lambda g: seen.append(threading.get_ident()))\n"
                    "y.sum().backward()\n"
                    "print(seen == [threading.get_ident()], x.grad.device, x.grad.sum().item(), flush=True)\n"
                    # With PyTorch's per-device autograd threads, a thread can still be dropping Python
                    # references while the interpreter finalizes, and it aborts taking the GIL (CPython
                    # ends the thread inside PyTorch's noexcept loop): PyTorch's behaviour, not what this
                    # checks, so the script leaves without finalizing.
                    "import os; os._exit(0)")


def test_backward_runs_on_the_calling_thread(run_python):
    """Backward over neuron tensors runs on the thread that calls it (the emulator's kernels use the host's
    cores; an autograd thread per device would give OpenMP a second set of threads); the switch restores
    PyTorch's per-device threads, with the same gradients."""
    assert not torch.autograd.is_multithreading_enabled()
    ours = run_python(_BACKWARD_THREAD)
    pytorchs = run_python(_BACKWARD_THREAD, env={"TORCHNEURON_AUTOGRAD_THREADS": "1"})
    assert ours.returncode == 0 and pytorchs.returncode == 0, ours.stderr + pytorchs.stderr
    assert ours.stdout.split() == ["True", "neuron:1", "3.0"]
    assert pytorchs.stdout.split() == ["False", "neuron:1", "3.0"]


def test_privateuse1_is_named_neuron():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.device("neuron").type == "neuron"
    assert torch.device("neuron:1").index == 1
    assert torch.get_device_module("neuron") is torch.neuron
    assert torch.get_device_module(torch.device("neuron:1")) is torch.neuron


# ---- torch.neuron, name for name like torch.cuda --------------------------------------------

CUDA_NAMES = [
    "is_available", "device_count", "current_device", "set_device", "device", "device_of",
    "get_device_name", "get_device_properties", "get_device_capability", "synchronize",
    "is_initialized", "init", "Stream", "Event", "stream", "current_stream", "default_stream",
    "set_stream", "StreamContext", "manual_seed", "manual_seed_all", "seed", "seed_all",
    "initial_seed", "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
    "default_generators", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "memory_stats", "memory_summary", "reset_peak_memory_stats",
    "reset_max_memory_allocated", "reset_accumulated_memory_stats", "empty_cache",
    "mem_get_info", "host_memory_stats", "is_bf16_supported", "OutOfMemoryError", "amp",
]


@pytest.mark.parametrize("name", CUDA_NAMES)
def test_torch_neuron_mirrors_torch_cuda(name):
    assert hasattr(torch.cuda, name), f"torch.cuda.{name} is not a CUDA name"
    assert hasattr(torch.neuron, name), f"torch.neuron.{name} is missing"
    assert name in torch.neuron.__all__ or name == "default_generators"


def test_is_available_and_device_count():
    assert torch.neuron.is_available() is True
    assert torch.neuron.device_count() == 2
    torch.neuron.init()  # as torch.cuda.init(): initializes the devices (if no use did yet)
    assert torch.neuron.is_initialized()


def test_current_and_set_device(two_devices):
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(1)
    assert torch.neuron.current_device() == 1
    assert torch.empty(3, device="neuron").device == torch.device("neuron:1")
    torch.neuron.set_device("neuron:0")
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(torch.device("neuron", 1))
    assert torch.neuron.current_device() == 1
    assert torch.ones(1, device="neuron").device.index == 1


def test_set_device_rejects_other_device_types():
    with pytest.raises(ValueError, match="neuron"):
        torch.neuron.set_device("cpu")
    with pytest.raises(TypeError):
        torch.neuron.set_device(1.5)
    assert torch.neuron.current_device() == 0


def test_current_device_is_per_thread(two_devices):
    torch.neuron.set_device(1)
    seen = []
    th = threading.Thread(target=lambda: seen.append(torch.neuron.current_device()))
    th.start()
    th.join()
    assert seen == [0]
    assert torch.neuron.current_device() == 1


def test_device_context_manager(two_devices):
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        x = torch.zeros(2, device="neuron")
        with torch.neuron.device("neuron:0"):
            assert torch.neuron.current_device() == 0
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0
    assert x.device == torch.device("neuron:1")
    with torch.neuron.device(None):
        assert torch.neuron.current_device() == 0


def test_device_context_manager_restores_on_exception(two_devices):
    with pytest.raises(KeyError):
        with torch.neuron.device(1):
            raise KeyError
    assert torch.neuron.current_device() == 0


def test_device_of(two_devices):
    x = torch.ones(2, device="neuron:1")
    with torch.neuron.device_of(x):
        assert torch.neuron.current_device() == 1
    with torch.neuron.device_of(torch.ones(2)):
        assert torch.neuron.current_device() == 0
    assert torch.neuron.current_device() == 0


def test_torch_device_as_context_manager(two_devices):
    with torch.device("neuron:1"):
        x = torch.ones(3)
    assert x.device == torch.device("neuron:1")
    assert torch.ones(1).device.type == "cpu"


def test_device_name_and_properties(two_devices):
    name = torch.neuron.get_device_name()
    assert isinstance(name, str) and "NeuronCore" in name
    assert torch.neuron.get_device_name(1) == name
    assert torch.neuron.get_device_name("neuron:1") == name
    p = torch.neuron.get_device_properties(0)
    assert p.name == name
    assert isinstance(p.total_memory, int) and p.total_memory == 16 << 30
    assert p.multi_processor_count >= 1
    assert "total_memory" in repr(p) and name in repr(p)
    assert torch.neuron.get_device_properties(torch.device("neuron:1")).total_memory == p.total_memory
    assert torch.neuron.get_device_capability() == (p.major, p.minor)
    assert torch.neuron.mem_get_info(0)[1] == p.total_memory


def test_synchronize():
    x = torch.randn(64, 64, device="neuron")
    y = x @ x
    torch.neuron.synchronize()
    torch.neuron.synchronize(0)
    torch.neuron.synchronize("neuron:1")
    torch.neuron.synchronize(torch.device("neuron:0"))
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())


def test_amp_dtypes_and_bf16():
    assert torch.neuron.is_bf16_supported()
    assert torch.neuron.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]


# ---- torch.accelerator ------------------------------------------------------------------------

def test_accelerator_api(two_devices):
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.device_count() == torch.neuron.device_count()
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(1)
    assert torch.neuron.current_device() == 1
    torch.accelerator.set_device_index(0)
    with torch.accelerator.device_index(1):
        assert torch.neuron.current_device() == 1
        assert torch.accelerator.current_device_index() == 1
    assert torch.neuron.current_device() == 0
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(1)
    s = torch.accelerator.current_stream()
    assert s.device == torch.device("neuron:0")
    assert s == torch.neuron.current_stream()


def test_accelerator_memory_api():
    before = torch.accelerator.memory_allocated(0)
    x = torch.empty(1 << 20, dtype=torch.uint8, device="neuron")
    assert torch.accelerator.memory_allocated(0) >= before + (1 << 20)
    assert torch.accelerator.memory_allocated(0) == torch.neuron.memory_allocated(0)
    assert torch.accelerator.memory_reserved(0) == torch.neuron.memory_reserved(0)
    del x
    assert torch.accelerator.memory_allocated(0) == before


# ---- .neuron() / .is_neuron -------------------------------------------------------------------

def test_tensor_neuron_method_and_is_neuron(two_devices):
    x = torch.arange(6.0).reshape(2, 3)
    assert not x.is_neuron
    y = x.neuron()
    assert y.is_neuron and y.device == torch.device("neuron:0")
    assert y.neuron() is y  # already there: no copy, like .cuda()
    assert x.neuron(1).device == torch.device("neuron:1")
    assert x.neuron("neuron:1").device == torch.device("neuron:1")
    assert y.neuron(1).device == torch.device("neuron:1")
    torch.testing.assert_close(y.neuron(1).cpu(), x)
    assert y.get_device() == 0 and x.get_device() == -1
    assert y.is_cpu is False and y.is_cuda is False
    assert y.to("neuron").device.type == "neuron"
    assert torch.ones(1, device="neuron:1").neuron(0).device.index == 0


def test_module_neuron_method(two_devices):
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    ref = [p.detach().clone() for p in m.state_dict().values()]
    m.neuron()
    assert all(t.is_neuron for t in m.state_dict().values())
    assert all(t.device.index == 0 for t in m.state_dict().values())
    for a, b in zip(m.state_dict().values(), ref):
        torch.testing.assert_close(a.cpu(), b)
    m.neuron(1)
    assert all(t.device == torch.device("neuron:1") for t in m.state_dict().values())
    m.cpu()
    assert all(t.is_cpu for t in m.state_dict().values())


def test_module_to_neuron_keeps_parameter_objects():
    # Module._apply swaps the data of each Parameter (as for CUDA) only if the neuron tensor has a
    # compatible shallow-copy type; otherwise an optimizer built before .to() would train stale copies.
    m = torch.nn.Linear(2, 2)
    w = m.weight
    opt = torch.optim.SGD(m.parameters(), lr=1.0)   # built before the move, which works on CUDA
    m.to("neuron")
    assert m.weight is w
    before = m.weight.detach().cpu().clone()
    m(torch.ones(1, 2, device="neuron")).sum().backward()
    opt.step()
    assert m.weight.grad is not None
    torch.testing.assert_close(m.weight.detach().cpu(), before - 1.0)  # d(sum)/dw = 1, lr = 1


def test_lazy_module_moved_before_initialization():
    m = torch.nn.LazyLinear(3).to("neuron")
    out = m(torch.ones(2, 5, device="neuron"))
    assert out.shape == (2, 3) and m.weight.shape == (3, 5)


def test_storage_neuron_method(two_devices):
    x = torch.arange(5, dtype=torch.int16)
    s = x.untyped_storage()
    assert not s.is_neuron
    ns = s.neuron()
    assert ns.is_neuron and ns.device == torch.device("neuron:0")
    assert ns.nbytes() == s.nbytes()
    assert bytes(ns.cpu()) == bytes(s)
    assert s.neuron(1).device == torch.device("neuron:1")
    t = torch.empty(0, dtype=torch.int16, device="neuron").set_(ns)
    torch.testing.assert_close(t.cpu(), x)
    assert x.neuron().untyped_storage().is_neuron


def test_typed_storage_neuron_method():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ts = torch.tensor([1.0, 2.0]).storage().neuron()
        assert ts.is_neuron and ts.device.type == "neuron"
        assert ts.tolist() == [1.0, 2.0]


def test_packed_sequence_neuron_method():
    from torch.nn.utils.rnn import pack_padded_sequence
    seq = torch.randn(3, 2, 4)
    packed = pack_padded_sequence(seq, torch.tensor([3, 2]))
    on = packed.neuron()
    assert on.is_neuron and on.data.is_neuron
    torch.testing.assert_close(on.data.cpu(), packed.data)


def test_tensor_repr_names_device():
    x = torch.tensor([1.0, 2.0], device="neuron")
    assert "device='neuron:0'" in repr(x)
    assert "device='neuron:1'" in repr(x.to("neuron:1"))


_WITH_ANOTHER_ACCELERATOR = ("import os, threading, torch\n"
                             "torch.cuda.is_available = lambda: True  # as in a process with a CUDA device\n"
                             "import torchneuron\n"
                             "seen = []\n"
                             "x = torch.ones(3, device='neuron', requires_grad=True)\n"
                             "y = x * 2\n"
                             "y.register_hook(lambda g: seen.append(threading.get_ident()))\n"
                             "y.sum().backward()\n"
                             "z = torch.ones(3, device='neuron', requires_grad=True)\n"
                             "w = z * 3\n"
                             "w.register_hook(lambda g: seen.append(threading.get_ident()))\n"
                             "torch.autograd.grad(w.sum(), z)\n"
                             "print(torch.autograd.is_multithreading_enabled(), seen == [threading.get_ident()] * 2,\n"
                             "      torchneuron.AUTOGRAD_PATCHES.active, flush=True)\n"
                             "os._exit(0)")


def test_autograd_threads_stay_on_for_another_accelerator(run_python):
    """With another accelerator in the process, PyTorch's per-device threads stay on for it (the switch is
    process-wide per thread, for every device type); neuron backward passes still run on the calling thread."""
    r = run_python(_WITH_ANOTHER_ACCELERATOR, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "True"]
