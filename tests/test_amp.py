"""Automatic mixed precision on neuron: torch.autocast("neuron") and GradScaler("neuron")."""

import copy

import pytest
import torch
import torch.nn.functional as F

LOW = [torch.bfloat16, torch.float16]


def _x(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to("neuron")


# Ops PyTorch's autocast lists run in the low dtype (lower_precision_fp) ...
LOWER_PRECISION = {
    "matmul": lambda a, b: a @ b,
    "mm": lambda a, b: torch.mm(a, b),
    "bmm": lambda a, b: torch.bmm(a[None], b[None]),
    "linear": lambda a, b: F.linear(a, b),
    "linear_bias": lambda a, b: F.linear(a, b, b[0]),
    "addmm": lambda a, b: torch.addmm(b[0], a, b),
    "baddbmm": lambda a, b: torch.baddbmm(a[None], a[None], b[None]),
    "einsum": lambda a, b: torch.einsum("ij,jk->ik", a, b),
    "conv2d": lambda a, b: F.conv2d(a[None, None], b[None, None, :3, :3]),
    "conv1d": lambda a, b: F.conv1d(a[None], b[:, :, None][:, :3].transpose(0, 1)[:8, :8]),
    "sdpa": lambda a, b: F.scaled_dot_product_attention(a[None], b[None], b[None]),
    "prelu": lambda a, b: F.prelu(a, b[0, :1]),
}
# ... and these in float32 (fp32 / fp32_set_opt_dtype), whatever their input dtype.
FLOAT32 = {
    "softmax": lambda a, b: torch.softmax(a, 1),
    "log_softmax": lambda a, b: F.log_softmax(a, -1),
    "layer_norm": lambda a, b: F.layer_norm(a, (8,)),
    "group_norm": lambda a, b: F.group_norm(a[None], 2),
    "exp": lambda a, b: torch.exp(a),
    "log": lambda a, b: torch.log(a.abs() + 1),
    "pow": lambda a, b: torch.pow(a, 2),
    "sum": lambda a, b: a.sum(),
    "cumsum": lambda a, b: a.cumsum(0),
    "prod": lambda a, b: a.prod(1),
    "mse_loss": lambda a, b: F.mse_loss(a, b),
    "l1_loss": lambda a, b: F.l1_loss(a, b),
    "nll_loss": lambda a, b: F.nll_loss(a, torch.zeros(8, dtype=torch.long, device=a.device)),
    "bce_with_logits": lambda a, b: F.binary_cross_entropy_with_logits(a, torch.sigmoid(b)),
    "cosine_similarity": lambda a, b: F.cosine_similarity(a, b),
    "norm": lambda a, b: torch.linalg.vector_norm(a),
    "cdist": lambda a, b: torch.cdist(a, b),
    "softplus": lambda a, b: F.softplus(a),
    "rsqrt": lambda a, b: torch.rsqrt(a.abs() + 1),
}


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", list(LOWER_PRECISION))
def test_autocast_lower_precision_ops(name, dtype):
    a, b = _x(8, 8, seed=1), _x(8, 8, seed=2)
    with torch.autocast("neuron", dtype=dtype):
        out = LOWER_PRECISION[name](a, b)
    assert out.dtype == dtype and out.device.type == "neuron"
    ref = LOWER_PRECISION[name](a.cpu().to(dtype).float(), b.cpu().to(dtype).float())
    torch.testing.assert_close(out.float().cpu(), ref, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", list(FLOAT32))
@pytest.mark.parametrize("input_dtype", [torch.float32, "low"])
def test_autocast_float32_ops(name, dtype, input_dtype):
    in_dtype = dtype if input_dtype == "low" else torch.float32
    a, b = _x(8, 8, seed=1).to(in_dtype), _x(8, 8, seed=2).to(in_dtype)
    with torch.autocast("neuron", dtype=dtype):
        out = FLOAT32[name](a, b)
    assert out.dtype == torch.float32, out.dtype
    ref = FLOAT32[name](a.cpu().float(), b.cpu().float())
    tol = 1e-4 if in_dtype == torch.float32 else 2e-2  # low inputs: the lambdas' own arithmetic rounds
    torch.testing.assert_close(out.cpu(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_autocast_promote_and_untouched_ops(dtype):
    a = _x(4, 4)
    with torch.autocast("neuron", dtype=dtype):
        assert (a + a).dtype == torch.float32                       # not listed: unchanged
        assert torch.relu(a.to(dtype)).dtype == dtype                # not listed: unchanged
        assert torch.cat([a.to(dtype), a]).dtype == torch.float32    # promote: widest input
        assert torch.stack([a.to(dtype), a]).dtype == torch.float32
        assert (a.to(torch.float64) @ a.to(torch.float64)).dtype == torch.float64  # fp64 is not autocast
        assert (a.long() + 1).dtype == torch.int64
        with torch.autocast("neuron", enabled=False):
            assert (a @ a).dtype == torch.float32
        assert (a @ a).dtype == dtype


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_binary_cross_entropy_is_refused_inside_autocast(dtype, device_works):
    p, t = torch.sigmoid(_x(4, 4)), torch.rand(4, 4).to("neuron")
    with torch.autocast("neuron", dtype=dtype):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, t)
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            torch.nn.BCELoss()(p, t)
        assert F.binary_cross_entropy_with_logits(p, t).dtype == torch.float32  # the safe form works
    ref = F.binary_cross_entropy(p.cpu(), t.cpu())
    torch.testing.assert_close(F.binary_cross_entropy(p, t).cpu(), ref)      # and BCE outside autocast
    device_works()


def test_autocast_state_queries():
    assert torch.amp.is_autocast_available("neuron")
    assert not torch.is_autocast_enabled("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("neuron")
        assert torch.get_autocast_dtype("neuron") == torch.bfloat16
        assert not torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("neuron")


def test_autocast_rejects_unsupported_dtype():
    with pytest.warns(UserWarning, match="neuron"):
        with torch.autocast("neuron", dtype=torch.float64):
            assert not torch.is_autocast_enabled("neuron")


def test_autocast_default_dtype_and_torch_neuron_amp_autocast():
    a = _x(4, 4)
    with torch.autocast("neuron"):
        assert (a @ a).dtype == torch.get_autocast_dtype("neuron")
    with torch.neuron.amp.autocast():                 # default float16, as torch.cuda.amp.autocast
        assert torch.is_autocast_enabled("neuron")
        assert (a @ a).dtype == torch.float16
    with torch.neuron.amp.autocast(dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
    with torch.neuron.amp.autocast(dtype=torch.float16):
        assert (a @ a).dtype == torch.float16
    with torch.neuron.amp.autocast(enabled=False):
        assert (a @ a).dtype == torch.float32
    assert isinstance(torch.neuron.amp.autocast(), torch.amp.autocast)

    @torch.neuron.amp.autocast()
    def decorated(x):
        return x @ x
    assert decorated(a).dtype == torch.float16


def test_autocast_caches_and_backward():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4).to("neuron")
    x = _x(3, 8)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y1 = lin(x)
        y2 = lin(x)
        loss = (y1.float() - y2.float()).pow(2).sum() + y1.float().sum()
    assert y1.dtype == torch.bfloat16
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32 and lin.weight.grad.device.type == "neuron"
    expected = x.cpu().sum(0, keepdim=True).expand(4, 8)
    torch.testing.assert_close(lin.weight.grad.cpu(), expected, atol=0.1, rtol=0.02)


def test_autocast_in_worker_thread_is_thread_local():
    import threading
    a = _x(4, 4)
    seen = []
    with torch.autocast("neuron", dtype=torch.bfloat16):
        th = threading.Thread(target=lambda: seen.append((a @ a).dtype))
        th.start()
        th.join()
    assert seen == [torch.float32]


# ---- GradScaler --------------------------------------------------------------------------------

def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _batches(n):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 2, generator=g)
    for _ in range(n):
        x = torch.randn(16, 6, generator=g)
        yield x, x @ w


def test_grad_scaler_training_steps_float16():
    model = _model().to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("neuron", init_scale=2.0 ** 10, growth_interval=3)
    assert scaler.is_enabled()
    losses = []
    for x, y in _batches(30):
        x, y = x.to("neuron"), y.to("neuron")
        opt.zero_grad()
        with torch.autocast("neuron", dtype=torch.float16):
            out = model(x)
            assert out.dtype == torch.float16
            loss = F.mse_loss(out, y)
        assert loss.dtype == torch.float32
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.5
    assert all(p.device.type == "neuron" and p.dtype == torch.float32 for p in model.parameters())
    # The scale grows every growth_interval finite steps and backs off on float16 overflow.
    scale_value = scaler.get_scale()
    assert scale_value > 2.0 ** 10 and float(scale_value).hex().startswith("0x1.0000000000000p+")
    scale = scaler._scale
    assert scale.device.type == "neuron"


def test_grad_scaler_matches_cpu_grad_scaler():
    results = {}
    for device in ["cpu", "neuron"]:
        model = _model().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler(device, init_scale=256.0)
        for x, y in _batches(5):
            opt.zero_grad()
            loss = F.mse_loss(model(x.to(device)), y.to(device))
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        results[device] = ([p.detach().cpu() for p in model.parameters()], scaler.get_scale())
    for pc, pn in zip(results["cpu"][0], results["neuron"][0]):
        torch.testing.assert_close(pn, pc, atol=1e-5, rtol=1e-4)
    assert results["cpu"][1] == results["neuron"][1]


def test_grad_scaler_skips_step_on_inf_and_backs_off():
    model = _model().to("neuron")
    before = copy.deepcopy([p.detach().cpu() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.neuron.amp.GradScaler(init_scale=1024.0, backoff_factor=0.25)
    x, y = next(_batches(1))
    loss = F.mse_loss(model(x.to("neuron")), y.to("neuron"))
    scaler.scale(loss).backward()
    model[0].weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 256.0
    for p, b in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach().cpu(), b)  # the step was skipped
    # A finite step afterwards goes through.
    opt.zero_grad()
    loss = F.mse_loss(model(x.to("neuron")), y.to("neuron"))
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(model[0].bias.detach().cpu(), before[1])


def test_torch_neuron_amp_grad_scaler_is_a_class():
    s = torch.neuron.amp.GradScaler(init_scale=8.0)
    assert isinstance(s, torch.neuron.amp.GradScaler) and isinstance(s, torch.amp.GradScaler)
    assert s.get_scale() == 8.0 and s._device == "neuron"
    assert not torch.neuron.amp.GradScaler(enabled=False).is_enabled()


def test_grad_scaler_state_dict_round_trip():
    scaler = torch.amp.GradScaler("neuron", init_scale=64.0, growth_factor=3.0)
    model = _model().to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = next(_batches(1))
    scaler.scale(F.mse_loss(model(x.to("neuron")), y.to("neuron"))).backward()
    scaler.step(opt)
    scaler.update()
    sd = scaler.state_dict()
    other = torch.amp.GradScaler("neuron")
    other.load_state_dict(sd)
    assert other.get_scale() == scaler.get_scale() == 64.0
    assert other.get_growth_factor() == 3.0
