"""Streams and events of neuron devices, and work from several Python threads."""

import threading
import time

import pytest
import torch


def test_default_and_current_stream(two_devices):
    s = torch.neuron.current_stream()
    assert isinstance(s, torch.Stream) and isinstance(s, torch.neuron.Stream)
    assert s.device == torch.device("neuron:0")
    assert s == torch.neuron.default_stream() == torch.neuron.default_stream(0)
    assert s.stream_id == 0
    assert torch.neuron.current_stream(1).device == torch.device("neuron:1")
    assert torch.neuron.default_stream("neuron:1") == torch.neuron.current_stream(1)
    assert torch.neuron.default_stream(1) != torch.neuron.default_stream(0)
    assert torch.accelerator.current_stream() == s
    assert not isinstance(torch.Stream(device="cpu"), torch.neuron.Stream)


def test_new_streams_are_distinct():
    a, b = torch.neuron.Stream(), torch.neuron.Stream()
    assert isinstance(a, torch.neuron.Stream)
    assert a != b and a != torch.neuron.default_stream()
    assert a.device == torch.device("neuron:0")
    assert a == a and hash(a) == hash(a)
    assert a.query() is True
    a.synchronize()
    assert torch.neuron.Stream(priority=-1).device.type == "neuron"


def test_torch_stream_with_device_string():
    s = torch.Stream()
    assert s.device == torch.device("neuron:0")
    assert torch.Stream(device="neuron:1").device == torch.device("neuron:1")


def test_torch_stream_with_device_without_index():
    torch.neuron.set_device(1)
    s = torch.Stream(device="neuron")
    assert s.device == torch.device("neuron:1")


def test_stream_context_manager(two_devices):
    s = torch.neuron.Stream()
    default = torch.neuron.current_stream()
    with torch.neuron.stream(s) as ctx:
        assert isinstance(ctx, torch.neuron.StreamContext)
        assert torch.neuron.current_stream() == s
        assert torch.accelerator.current_stream() == s
        x = torch.arange(10.0, device="neuron") * 3
        inner = torch.neuron.Stream()
        with torch.neuron.stream(inner):
            assert torch.neuron.current_stream() == inner
        assert torch.neuron.current_stream() == s
    assert torch.neuron.current_stream() == default
    s.synchronize()
    torch.testing.assert_close(x.cpu(), torch.arange(10.0) * 3)
    with torch.neuron.stream(None):
        assert torch.neuron.current_stream() == default


def test_stream_context_manager_restores_on_exception():
    s = torch.neuron.Stream()
    with pytest.raises(ZeroDivisionError):
        with torch.neuron.stream(s):
            1 / 0
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_torch_stream_as_context_manager():
    s = torch.neuron.Stream()
    with s:
        assert torch.neuron.current_stream() == s
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_set_stream():
    s = torch.neuron.Stream()
    torch.neuron.set_stream(s)
    assert torch.neuron.current_stream() == s
    torch.neuron.set_stream(None)  # no change
    assert torch.neuron.current_stream() == s
    torch.neuron.set_stream(torch.neuron.default_stream())
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_streams_on_device_one(two_devices):
    s1 = torch.neuron.Stream(1)
    assert s1.device == torch.device("neuron:1")
    assert torch.neuron.Stream("neuron:1").device_index == 1
    with torch.neuron.stream(s1):
        assert torch.neuron.current_device() == 1
        assert torch.neuron.current_stream() == s1
        assert torch.neuron.current_stream(0) == torch.neuron.default_stream(0)
        x = torch.ones(4, device="neuron") + 1
        assert x.device == torch.device("neuron:1")
    assert torch.neuron.current_device() == 0
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)
    s1.synchronize()
    torch.testing.assert_close(x.cpu(), torch.full((4,), 2.0))
    with torch.neuron.device(1):
        assert torch.neuron.Stream().device_index == 1


def test_current_stream_is_per_thread():
    s = torch.neuron.Stream()
    seen = []
    with torch.neuron.stream(s):
        th = threading.Thread(target=lambda: seen.append(torch.neuron.current_stream()))
        th.start()
        th.join()
        assert torch.neuron.current_stream() == s
    assert seen == [torch.neuron.default_stream()]


# ---- events ----------------------------------------------------------------------------------

def test_event_record_query_synchronize():
    e = torch.neuron.Event()
    assert isinstance(e, torch.Event) and isinstance(e, torch.neuron.Event)
    assert e.query() is True  # an unrecorded event counts as complete, as on CUDA
    x = torch.randn(128, 128, device="neuron")
    y = x @ x
    e.record()
    assert e.device == torch.device("neuron:0")
    e.synchronize()
    assert e.query() is True
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())


def test_event_wait_and_stream_wait():
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    with torch.neuron.stream(s1):
        a = torch.full((100,), 2.0, device="neuron")
        b = a * a
        e = torch.neuron.Event()
        e.record(s1)
    s2.wait_event(e)
    e.wait(s2)
    with torch.neuron.stream(s2):
        c = b + 1
    s2.wait_stream(s1)
    ev = s2.record_event()
    assert isinstance(ev, torch.Event)
    ev.synchronize()
    torch.testing.assert_close(c.cpu(), torch.full((100,), 5.0))
    torch.neuron.current_stream().wait_stream(s2)
    torch.neuron.synchronize()


def test_elapsed_time_with_timing():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    time.sleep(0.05)
    x = torch.randn(64, 64, device="neuron")
    (x @ x).sum()
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float)
    assert 40 <= ms < 5000
    assert end.elapsed_time(start) <= 0


def test_elapsed_time_without_timing_raises(device_works):
    a, b = torch.neuron.Event(), torch.neuron.Event()
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        a.elapsed_time(b)
    t = torch.neuron.Event(enable_timing=True)
    t.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        a.elapsed_time(t)
    device_works()


def test_elapsed_time_of_unrecorded_events_raises():
    a, b = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        a.elapsed_time(b)
    a.record()
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        a.elapsed_time(b)


def test_interprocess_event_is_refused():
    with pytest.raises(ValueError, match="interprocess"):
        torch.neuron.Event(interprocess=True)


def test_event_on_device_one(two_devices):
    s1 = torch.neuron.Stream(1)
    e = torch.neuron.Event(enable_timing=True)
    e.record(s1)  # an event takes the device of the stream it is first recorded on
    assert e.device == torch.device("neuron:1")
    e.synchronize()
    e2 = torch.neuron.Event(enable_timing=True)
    e2.record(s1)
    e2.synchronize()  # as on CUDA, both events must have happened
    assert e.elapsed_time(e2) >= 0
    # Once on device 1, recording on a device-0 stream is an error, as on CUDA.
    with pytest.raises(RuntimeError, match="device"):
        e.record(torch.neuron.current_stream(0))


# ---- threads ---------------------------------------------------------------------------------

def _run_threads(targets):
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001  (reported to the main thread)
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a worker thread hung"
    if errors:
        raise errors[0]


def test_two_threads_drive_two_devices_concurrently(two_devices):
    torch.manual_seed(0)
    inputs = [torch.randn(48, 48) / 48**0.5 for _ in range(2)]  # a contraction: rounding does not grow
    expected = []
    for x in inputs:
        y = x
        for _ in range(20):
            y = torch.tanh(y @ x) + 0.5 * y
        expected.append(y)
    results = [None, None]
    barrier = threading.Barrier(2)

    def worker(i):
        def run():
            torch.neuron.set_device(i)
            s = torch.neuron.Stream()
            barrier.wait()
            with torch.neuron.stream(s):
                x = inputs[i].to("neuron")
                assert x.device == torch.device("neuron", i)
                assert torch.neuron.current_stream() == s
                y = x
                for _ in range(20):
                    y = torch.tanh(y @ x) + 0.5 * y
                    assert torch.neuron.current_device() == i
            s.synchronize()
            results[i] = (y.device, y.cpu())
        return run

    _run_threads([worker(0), worker(1)])
    for i in range(2):
        assert results[i][0] == torch.device("neuron", i)
        torch.testing.assert_close(results[i][1], expected[i], rtol=1e-5, atol=1e-5)
    assert torch.neuron.current_device() == 0


def test_one_device_from_two_threads_with_own_streams():
    results = {}
    streams = {}

    def worker(k):
        def run():
            s = torch.neuron.Stream()
            streams[k] = s
            with torch.neuron.stream(s):
                acc = torch.zeros(1000, device="neuron")
                for j in range(200):
                    acc += torch.full((1000,), float(k), device="neuron")
                    assert torch.neuron.current_stream() == s
                ev = torch.neuron.Event()
                ev.record()
            ev.synchronize()
            results[k] = acc.cpu()
        return run

    _run_threads([worker(1), worker(2)])
    assert streams[1] != streams[2]
    torch.testing.assert_close(results[1], torch.full((1000,), 200.0))
    torch.testing.assert_close(results[2], torch.full((1000,), 400.0))
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_threads_with_autograd_and_random(two_devices):
    out = {}

    def worker(i):
        def run():
            dev = torch.device("neuron", i)
            g = torch.Generator(device=dev).manual_seed(100 + i)
            w = torch.randn(16, 16, device=dev, generator=g, requires_grad=True)
            x = torch.randn(8, 16, device=dev, generator=g)
            (x @ w).pow(2).sum().backward()
            out[i] = (w.detach().cpu(), x.cpu(), w.grad.cpu(), w.grad.device)
        return run

    _run_threads([worker(0), worker(1)])
    for i in range(2):  # the same on this thread alone
        g = torch.Generator(device=f"neuron:{i}").manual_seed(100 + i)
        w = torch.randn(16, 16, device=f"neuron:{i}", generator=g).cpu().requires_grad_()
        x = torch.randn(8, 16, device=f"neuron:{i}", generator=g).cpu()
        (x @ w).pow(2).sum().backward()
        torch.testing.assert_close(out[i][0], w.detach())
        torch.testing.assert_close(out[i][1], x)
        torch.testing.assert_close(out[i][2], w.grad)
        assert out[i][3] == torch.device("neuron", i)
