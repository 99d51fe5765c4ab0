"""Smoke test of an installed torchneuron, in the form of PyTorch's release smoke test
(.ci/pytorch/smoke_test/smoke_test.py in pytorch/pytorch): each check prints what it tests and raises
on a wrong answer.

    python scripts/smoke_test.py                 # autoload (import torch loads torchneuron), then without it
    python scripts/smoke_test.py --autoload on   # one of the two

Checks: the import (by torch's autoload, or explicitly with TORCH_DEVICE_BACKEND_AUTOLOAD=0), the
versions, the device, a matmul, autograd, torch.compile, a one-process init_process_group("neuron")
with an all_reduce, and a save/load round trip; results against the CPU's. scripts/release.sh runs it
against the wheel installed in a new environment.
"""

import argparse
import os
import subprocess
import sys
import tempfile


def check_import(autoload: bool):
    import torch

    print(f"Testing the import (autoload {'on' if autoload else 'off'})")
    if autoload:
        if not hasattr(torch, "neuron"):
            raise RuntimeError("import torch did not load torchneuron: is its torch.backends entry point installed?")
    else:
        if hasattr(torch, "neuron"):
            raise RuntimeError("TORCH_DEVICE_BACKEND_AUTOLOAD=0, yet import torch loaded torchneuron")
        import torchneuron  # noqa: F401
    import torchneuron.version as version

    base = torch.__version__.split("+")[0]
    if base != version.torch:
        raise RuntimeError(f"torchneuron {version.__version__} is built for torch {version.torch}, found {base}")
    print(f"torchneuron {version.__version__}, torch {torch.__version__}, runtime interface {version.runtime_api}")


def check_device():
    import torch

    print("Testing the device")
    if torch.accelerator.current_accelerator().type != "neuron":
        raise RuntimeError(f"the current accelerator is {torch.accelerator.current_accelerator()}, not neuron")
    count = torch.neuron.device_count()
    if count < 1:
        raise RuntimeError("no neuron device")
    for i in range(count):
        print(f"Device {i}: {torch.neuron.get_device_name(i)}, "
              f"{torch.neuron.get_device_properties(i).total_memory / 2**30:.1f} GiB")


def check_matmul_and_autograd():
    import torch

    print("Testing a matmul and autograd against the CPU")
    torch.manual_seed(0)
    a, b = torch.randn(64, 32, dtype=torch.float64), torch.randn(32, 16, dtype=torch.float64)
    torch.testing.assert_close((a.to("neuron") @ b.to("neuron")).cpu(), a @ b)
    w = torch.randn(32, 16, requires_grad=True)
    wn = w.detach().to("neuron").requires_grad_()
    x = torch.randn(8, 32)
    (x @ w).tanh().sum().backward()
    (x.to("neuron") @ wn).tanh().sum().backward()
    torch.testing.assert_close(wn.grad.cpu(), w.grad)


def check_compile():
    import torch

    print("Testing torch.compile")

    def f(x):
        return torch.sin(x) + torch.cos(x)

    for dtype in (torch.float16, torch.float32, torch.float64):
        x = torch.rand(3, 3, dtype=dtype, device="neuron")
        torch.testing.assert_close(torch.compile(f)(x), f(x))
    torch._dynamo.reset()


def check_process_group():
    import torch
    import torch.distributed as dist

    print('Testing a one-process init_process_group("neuron")')
    with tempfile.TemporaryDirectory() as directory:
        dist.init_process_group("neuron", init_method=f"file://{directory}/store", rank=0, world_size=1)
        try:
            t = torch.arange(4.0, device="neuron")
            dist.all_reduce(t)
            torch.testing.assert_close(t.cpu(), torch.arange(4.0))
        finally:
            dist.destroy_process_group()


def check_save_load():
    import torch

    print("Testing a save/load round trip")
    state = {"w": torch.randn(5, 3, device="neuron"), "step": 7}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "state.pt")
        torch.save(state, path)
        on_device = torch.load(path)
        on_cpu = torch.load(path, map_location="cpu")
    if on_device["w"].device.type != "neuron" or on_cpu["w"].device.type != "cpu":
        raise RuntimeError("torch.load put the tensors on the wrong device")
    torch.testing.assert_close(on_device["w"].cpu(), state["w"].cpu())
    torch.testing.assert_close(on_cpu["w"], state["w"].cpu())


def run(autoload: bool):
    check_import(autoload)
    check_device()
    check_matmul_and_autograd()
    check_compile()
    check_process_group()
    check_save_load()
    print(f"smoke test passed (autoload {'on' if autoload else 'off'})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--autoload", choices=["on", "off", "both"], default="both")
    args = parser.parse_args()
    if args.autoload != "both":
        # torch reads the variable at import; a mismatch means the caller's environment says otherwise
        if (os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "0") != (args.autoload == "on"):
            raise SystemExit("run with --autoload both, or set TORCH_DEVICE_BACKEND_AUTOLOAD to match")
        run(args.autoload == "on")
        return
    for mode, value in (("on", "1"), ("off", "0")):
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": value}
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--autoload", mode], env=env)
        if proc.returncode != 0:
            raise SystemExit(f"smoke test failed with autoload {mode}")


if __name__ == "__main__":
    main()
