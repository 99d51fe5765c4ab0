"""torch.save / torch.load of neuron tensors, modules and optimizers."""

import io
import textwrap
import zipfile

import pytest
import torch


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int8, torch.bool, torch.complex64], ids=str)
def test_tensor_round_trip(dtype):
    x = (torch.randn(5, 3) * 10).to(dtype)
    d = x.to("neuron")
    loaded = _round_trip(d)
    assert loaded.device == torch.device("neuron:0") and loaded.dtype == dtype
    assert torch.equal(loaded.cpu(), x)


def test_tensor_on_device_one_keeps_its_device(two_devices):
    x = torch.arange(10.0, device="neuron:1")
    loaded = _round_trip(x)
    assert loaded.device == torch.device("neuron:1")
    assert torch.equal(loaded.cpu(), torch.arange(10.0))


def test_views_stay_shared_after_load():
    base = torch.arange(24.0, device="neuron").reshape(4, 6)
    obj = {"base": base, "row": base[1], "col": base[:, 2], "t": base.t(), "slice": base.view(-1)[5:17]}
    loaded = _round_trip(obj)
    ptr = loaded["base"].untyped_storage().data_ptr()
    for k, v in loaded.items():
        assert v.device.type == "neuron"
        assert v.untyped_storage().data_ptr() == ptr, k
        assert torch.equal(v.cpu(), obj[k].cpu()), k
        assert v.stride() == obj[k].stride() and v.storage_offset() == obj[k].storage_offset()
    loaded["base"][1, 2] = -1.0
    assert loaded["row"][2].item() == -1.0
    assert loaded["col"][1].item() == -1.0
    assert loaded["t"][2, 1].item() == -1.0


def test_non_contiguous_and_empty_and_scalar_tensors():
    obj = [torch.randn(4, 5, device="neuron").t(), torch.empty(0, 3, device="neuron"),
           torch.tensor(7, device="neuron"), torch.randn(6, device="neuron")[::2]]
    loaded = _round_trip(obj)
    for a, b in zip(loaded, obj):
        assert a.shape == b.shape and a.device == b.device
        assert torch.equal(a.cpu(), b.cpu())


def test_module_state_dict_round_trip():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.Flatten(),
                            torch.nn.Linear(27, 4)).to("neuron")
    x = torch.randn(2, 2, 5, 5, device="neuron")
    m(x)
    sd = m.state_dict()
    loaded = _round_trip(sd)
    assert list(loaded) == list(sd)
    for k in sd:
        assert loaded[k].device == sd[k].device, k
        assert torch.equal(loaded[k].cpu(), sd[k].cpu()), k
    torch.manual_seed(1)
    m2 = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.Flatten(),
                             torch.nn.Linear(27, 4)).to("neuron")
    m2.load_state_dict(loaded)
    m.eval(), m2.eval()
    torch.testing.assert_close(m2(x).cpu(), m(x).cpu())


def test_whole_module_round_trip():
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2).to("neuron")
    loaded = _round_trip(m, weights_only=False)
    assert loaded.weight.device.type == "neuron"
    x = torch.randn(4, 3, device="neuron")
    torch.testing.assert_close(loaded(x).cpu(), m(x).cpu())


def _train(model, opt, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g).to(next(model.parameters()).device)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def test_adamw_optimizer_round_trip_continues_identically():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    _train(model, opt, 3)
    ckpt = _round_trip({"model": model.state_dict(), "opt": opt.state_dict()})
    state = ckpt["opt"]["state"]
    assert len(state) == 4
    for s in state.values():
        assert s["exp_avg"].device.type == "neuron" and s["exp_avg_sq"].device.type == "neuron"
        assert s["step"].item() == 3

    torch.manual_seed(5)
    model2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to("neuron")
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1.0)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.param_groups[0]["lr"] == 1e-2
    _train(model, opt, 2, seed=9)
    _train(model2, opt2, 2, seed=9)
    for p, q in zip(model.parameters(), model2.parameters()):
        torch.testing.assert_close(q.cpu(), p.cpu(), rtol=0, atol=0)


def test_whole_optimizer_object_round_trip():
    model = torch.nn.Linear(4, 1).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _train(model, opt, 2)
    loaded_model, loaded_opt = _round_trip((model, opt), weights_only=False)
    assert isinstance(loaded_opt, torch.optim.AdamW)
    for s in loaded_opt.state.values():
        assert s["exp_avg"].device.type == "neuron"


MAP_LOCATIONS = {
    "cpu": ("cpu", torch.device("cpu")),
    "neuron": ("neuron", torch.device("neuron:0")),
    "neuron:1": ("neuron:1", torch.device("neuron:1")),
    "torch.device": (torch.device("neuron:1"), torch.device("neuron:1")),
    "dict": ({"neuron:0": "neuron:1"}, torch.device("neuron:1")),
    "function-to-cpu": (lambda storage, loc: storage, torch.device("cpu")),
    "function-to-neuron1": (lambda storage, loc: storage.neuron(1), torch.device("neuron:1")),
}


@pytest.mark.parametrize("name", list(MAP_LOCATIONS))
def test_map_location(name, two_devices):
    base = torch.arange(12.0, device="neuron:0").reshape(3, 4)
    obj = {"base": base, "view": base[1:, 1:], "ints": torch.arange(3, device="neuron:0")}
    map_location, expected = MAP_LOCATIONS[name]
    loaded = _round_trip(obj, map_location=map_location)
    for k, v in loaded.items():
        assert v.device == expected, (k, v.device)
        assert torch.equal(v.cpu(), obj[k].cpu()), k
    assert loaded["view"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()


def test_cpu_checkpoint_loads_onto_neuron():
    obj = {"w": torch.randn(3, 3), "v": torch.arange(4)}
    loaded = _round_trip(obj, map_location="neuron:1")
    assert all(v.device == torch.device("neuron:1") for v in loaded.values())
    assert torch.equal(loaded["w"].cpu(), obj["w"])


def test_mmap_load(tmp_path):
    path = tmp_path / "ckpt.pt"
    x = torch.randn(100, device="neuron")
    torch.save({"x": x}, path)
    loaded = torch.load(path, mmap=True, map_location="cpu")
    assert torch.equal(loaded["x"], x.cpu())
    loaded = torch.load(path, mmap=True)
    assert loaded["x"].device.type == "neuron" and torch.equal(loaded["x"].cpu(), x.cpu())


def test_checkpoint_loads_without_torchneuron(tmp_path, run_python):
    path = tmp_path / "ckpt.pt"
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to("neuron")
    x = torch.arange(6.0, device="neuron").reshape(2, 3)
    torch.save({"model": model.state_dict(), "x": x, "row": x[1]}, path)
    expected_w = model.weight.detach().cpu()
    code = textwrap.dedent(f'''
        import sys, torch
        assert "torchneuron" not in sys.modules and not hasattr(torch, "neuron")
        ck = torch.load({str(path)!r}, map_location="cpu")
        assert all(t.device.type == "cpu" for t in ck["model"].values())
        assert ck["row"].untyped_storage().data_ptr() == ck["x"].untyped_storage().data_ptr()
        print(ck["x"].tolist(), ck["row"].tolist())
        print(ck["model"]["weight"].flatten().tolist())
        try:
            torch.load({str(path)!r})           # no map_location: the neuron device is unknown here
        except Exception as e:
            print("no-map-location:", type(e).__name__)
        else:
            print("no-map-location: loaded")
    ''')
    r = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] [3.0, 4.0, 5.0]"
    torch.testing.assert_close(torch.tensor(eval(lines[1])), expected_w.flatten())
    assert lines[2].startswith("no-map-location:") and lines[2] != "no-map-location: loaded"


# ---- damaged files --------------------------------------------------------------------------------

@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "good.pt"
    torch.save({"x": torch.randn(1000, device="neuron"), "y": torch.arange(10, device="neuron:1")}, path)
    return path


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.99])
def test_truncated_file_raises(checkpoint, tmp_path, keep, device_works):
    data = checkpoint.read_bytes()
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(Exception) as info:
        torch.load(bad)
    assert not isinstance(info.value, (SystemExit, KeyboardInterrupt))
    device_works()
    device_works("neuron:1")


def _member_offset(data, name_suffix):
    """Offset of a zip member's bytes in the archive."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(name_suffix))
    header = info.header_offset
    name_len = int.from_bytes(data[header + 26:header + 28], "little")
    extra_len = int.from_bytes(data[header + 28:header + 30], "little")
    return header + 30 + name_len + extra_len, info.file_size


@pytest.mark.parametrize("where", ["pickle-start", "pickle-middle", "pickle-end", "zip-directory",
                                   "local-header", "byteorder-record"])
def test_corrupted_bytes_raise(checkpoint, tmp_path, where, device_works):
    data = bytearray(checkpoint.read_bytes())
    pkl, pkl_size = _member_offset(bytes(data), "data.pkl")
    start = {
        "pickle-start": pkl,
        "pickle-middle": pkl + pkl_size // 2,
        "pickle-end": pkl + pkl_size - 4,
        "zip-directory": data.rfind(b"PK\x01\x02") + 10,
        "local-header": 0,
        "byteorder-record": _member_offset(bytes(data), "byteorder")[0],
    }[where]
    for i in range(start, start + 4):
        data[i] ^= 0xA5
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(bytes(data))
    with pytest.raises(Exception):
        torch.load(bad)
    device_works()
    device_works("neuron:1")


def test_garbage_file_raises(tmp_path, device_works):
    bad = tmp_path / "garbage.pt"
    bad.write_bytes(bytes(range(256)) * 10)
    with pytest.raises(Exception):
        torch.load(bad)
    device_works()
