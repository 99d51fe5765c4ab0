"""Lazy initialisation and fork poisoning of the neuron devices, as CUDA's.

Importing torch creates no device state; the first use initialises the devices. A process forked
after that cannot use them and raises CUDA's error (with "neuron") from Python and C++ paths alike;
a process forked before it uses the device normally; DataLoader workers forked after it work as long
as they leave the device alone. Each case runs in a fresh interpreter (this test process has
initialised the devices long ago) and forks there.
"""

import json
import textwrap

BAD_FORK = ("Cannot re-initialize neuron in forked subprocess. To use neuron with multiprocessing, "
            "you must use the 'spawn' start method")

# Runs `child()` (a function defined by the script) in a forked child; prints its JSON result.
_FORK_HELPERS = textwrap.dedent("""
    import json, os, sys
    import torch

    def in_child(child):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                result = child()
            except BaseException as e:
                result = {"uncaught": f"{type(e).__name__}: {e}"}
            os.write(write, json.dumps(result).encode())
            os.close(write)
            os._exit(0)
        os.close(write)
        data = b""
        while chunk := os.read(read, 65536):
            data += chunk
        os.close(read)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        return json.loads(data)

    def raises(fn):
        try:
            fn()
        except RuntimeError as e:
            return str(e)
        return None
""")


def _run(run_python, body):
    proc = run_python(_FORK_HELPERS + textwrap.dedent(body), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_does_not_initialise(run_python):
    out = _run(run_python, """
        import torchneuron
        state = {"is_initialized": torch.neuron.is_initialized(), "cpp": torchneuron._C._is_initialized(),
                 "lazy_init_ran": torch.neuron._initialized}
        # Queries that must stay usable before initialisation, and do not initialise.
        state["count"] = torch.neuron.device_count()
        state["available"] = torch.neuron.is_available() and torch.accelerator.is_available()
        state["accelerator"] = str(torch.accelerator.current_accelerator())
        state["allocated"] = torch.neuron.memory_allocated()
        torch.manual_seed(0)  # queued for the device, as on CUDA
        torch.accelerator.synchronize(0)  # a no-op before initialisation, as on CUDA
        state["after"] = torch.neuron.is_initialized() or torchneuron._C._is_initialized()
        state["used"] = [torchneuron._C._device_used(i) for i in range(torch.neuron.device_count())]
        print(json.dumps(state))
    """)
    assert out == {"is_initialized": False, "cpp": False, "lazy_init_ran": False, "count": 2, "available": True,
                   "accelerator": "neuron", "allocated": 0, "after": False, "used": [False, False]}


def test_fork_after_init_raises_in_child(run_python):
    out = _run(run_python, """
        import torchneuron
        x = torch.arange(4.0, device="neuron")
        parent = {"is_initialized": torch.neuron.is_initialized(), "bad_fork": torch.neuron._is_in_bad_fork(),
                  "used": [torchneuron._C._device_used(i) for i in range(2)]}

        def child():
            r = {"bad_fork": torch.neuron._is_in_bad_fork(), "is_initialized": torch.neuron.is_initialized()}
            r["factory"] = raises(lambda: torch.ones(2, device="neuron"))          # Python binding path
            r["to"] = raises(lambda: torch.ones(2).to("neuron"))
            r["inherited_op"] = raises(lambda: x + 1)                              # C++: a kernel launch
            r["inherited_cpu"] = raises(lambda: x.cpu())                           # C++: a copy
            r["stream"] = raises(lambda: torch.neuron.Stream())                    # C++: the guard
            r["generator"] = raises(lambda: torch.Generator(device="neuron"))      # C++: the hooks
            r["event"] = raises(lambda: torch.neuron.Event().record())
            r["current_device"] = raises(torch.neuron.current_device)
            r["synchronize"] = raises(torch.neuron.synchronize)
            r["acc_current_stream"] = raises(torch.accelerator.current_stream)
            r["rng_state"] = raises(torch.neuron.get_rng_state)
            r["mem_get_info"] = raises(torch.neuron.mem_get_info)
            r["empty_strided"] = raises(lambda: torchneuron._C._empty_strided((2,), (1,), torch.float32, 0))
            r["manual_seed"] = raises(lambda: torch.manual_seed(1))  # skips the device in a bad fork
            r["allocated"] = torch.neuron.memory_allocated()  # 0: not initialised here, as on CUDA
            r["used"] = [torchneuron._C._device_used(i) for i in range(2)]
            return r

        result = in_child(child)
        parent["after"] = (x * 2).cpu().tolist()  # the parent keeps its device
        print(json.dumps({"parent": parent, "child": result}))
    """)
    assert out["parent"] == {"is_initialized": True, "bad_fork": False, "used": [True, False],
                             "after": [0.0, 2.0, 4.0, 6.0]}
    child = out["child"]
    assert child.pop("bad_fork") is True
    assert child.pop("is_initialized") is False
    assert child.pop("manual_seed") is None
    assert child.pop("allocated") == 0
    assert child.pop("used") == [False, False]
    for what, message in child.items():
        assert message is not None and BAD_FORK in message, (what, message)


def test_fork_before_init_child_uses_device(run_python):
    out = _run(run_python, """
        import torchneuron
        torch.manual_seed(7)  # before the fork and before initialisation: queued in both processes
        assert not torchneuron._C._is_initialized()
        a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        b = torch.linspace(-1, 1, 8).reshape(4, 2)
        expected = ((a @ b).relu() + 1).sum(0)

        def child():
            r = {"bad_fork": torch.neuron._is_in_bad_fork(), "before": torch.neuron.is_initialized()}
            out = ((a.to("neuron") @ b.to("neuron")).relu() + 1).sum(0)
            r["device"] = str(out.device)
            r["close"] = torch.allclose(out.cpu(), expected)
            r["after"] = torch.neuron.is_initialized()
            r["rand"] = torch.rand(3, device="neuron").cpu().tolist()
            return r

        result = in_child(child)
        parent_initialized = torch.neuron.is_initialized()
        torch.neuron.manual_seed_all(7)  # the seed the queue applied in the child
        result["parent_rand"] = torch.rand(3, device="neuron").cpu().tolist()
        result["parent_before"] = parent_initialized
        print(json.dumps(result))
    """)
    assert out["bad_fork"] is False and out["before"] is False and out["after"] is True
    assert out["device"] == "neuron:0" and out["close"] is True
    assert out["parent_before"] is False
    assert out["rand"] == out["parent_rand"]  # torch.manual_seed(7) queued before the fork reached the child's device


def test_seed_queued_before_init_applies(run_python):
    out = _run(run_python, """
        torch.manual_seed(1234)
        first = torch.rand(4, device="neuron").cpu().tolist()
        torch.neuron.manual_seed_all(1234)
        again = torch.rand(4, device="neuron").cpu().tolist()
        print(json.dumps({"first": first, "again": again}))
    """)
    assert out["first"] == out["again"]


def test_multiprocessing_fork_after_init(run_python):
    # The error reaches a multiprocessing child as it reaches a CUDA one.
    out = _run(run_python, """
        import multiprocessing as mp

        def work(q):
            try:
                torch.zeros(1, device="neuron")
                q.put("no error")
            except RuntimeError as e:
                q.put(str(e))

        torch.zeros(1, device="neuron")
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=work, args=(q,))
        p.start()
        message = q.get(timeout=60)
        p.join(60)
        print(json.dumps({"fork": message}))
    """)
    assert BAD_FORK in out["fork"]


def test_dataloader_fork_workers_after_init(run_python):
    out = _run(run_python, """
        from torch.utils.data import DataLoader, TensorDataset

        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(40, 6, generator=g), torch.randn(40, 2, generator=g))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        reference = [model(x).detach() for x, _ in DataLoader(data, batch_size=8)]
        model.to("neuron")  # the device is initialised before the workers fork

        def worker_init(_):
            # A worker is a bad fork for the device (as for CUDA) and must not touch it.
            assert torch.neuron._is_in_bad_fork() and not torch.neuron.is_initialized()

        loader = DataLoader(data, batch_size=8, num_workers=2, multiprocessing_context="fork",
                            worker_init_fn=worker_init, pin_memory=True)
        outputs = [model(x.to("neuron", non_blocking=True)).detach().cpu() for x, _ in loader]
        close = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(outputs, reference))
        print(json.dumps({"batches": len(outputs), "close": close}))
    """)
    assert out == {"batches": 5, "close": True}
