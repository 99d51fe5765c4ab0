"""Random number generators of neuron devices: seeding, reproducibility, independence, state."""

import pytest
import torch
import torch.nn.functional as F

# Each sampler takes a device and returns a tensor drawn from that device's default generator.
SAMPLERS = {
    "rand": lambda d: torch.rand(2, 17, device=d),
    "randn": lambda d: torch.randn(33, device=d),
    "randint": lambda d: torch.randint(-50, 50, (40,), device=d),
    "randperm": lambda d: torch.randperm(30, device=d),
    "rand_like": lambda d: torch.rand_like(torch.empty(5, 3, device=d)),
    "normal_": lambda d: torch.empty(25, device=d).normal_(2.0, 3.0),
    "uniform_": lambda d: torch.empty(25, device=d, dtype=torch.float64).uniform_(-1, 1),
    "normal(tensor,tensor)": lambda d: torch.normal(torch.zeros(9, device=d), torch.arange(1.0, 10.0, device=d)),
    "bernoulli": lambda d: torch.bernoulli(torch.linspace(0, 1, 32, device=d)),
    "bernoulli_": lambda d: torch.empty(32, device=d).bernoulli_(0.3),
    "exponential_": lambda d: torch.empty(12, device=d).exponential_(),
    "multinomial": lambda d: torch.multinomial(torch.arange(1.0, 11.0, device=d), 6),
    "dropout": lambda d: F.dropout(torch.ones(64, device=d), 0.5, training=True),
    "nn.Dropout": lambda d: torch.nn.Dropout(0.25).train()(torch.ones(64, device=d)),
    "sdpa(dropout_p)": lambda d: F.scaled_dot_product_attention(
        *(torch.linspace(-1, 1, 32, device=d).reshape(1, 2, 4, 4),) * 3, dropout_p=0.5),
    "dropout2d": lambda d: F.dropout2d(torch.ones(2, 8, 3, 3, device=d), 0.5, training=True),
    "alpha_dropout": lambda d: F.alpha_dropout(torch.ones(32, device=d), 0.5, training=True),
    "rrelu": lambda d: F.rrelu(-torch.ones(16, device=d), training=True),
    "init.kaiming_uniform_": lambda d: torch.nn.init.kaiming_uniform_(torch.empty(4, 5, device=d)),
}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_manual_seed_makes_neuron_draws_reproducible(name):
    torch.manual_seed(1234)
    a = SAMPLERS[name]("neuron")
    torch.manual_seed(1234)
    b = SAMPLERS[name]("neuron")
    assert a.device.type == "neuron"
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    c = SAMPLERS[name]("neuron")  # the stream moved on
    assert not torch.equal(b.cpu(), c.cpu())


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_neuron_and_cpu_seeded_alike_draw_the_same_numbers(name):
    torch.manual_seed(77)
    cpu = SAMPLERS[name]("cpu")
    torch.manual_seed(77)
    dev = SAMPLERS[name]("neuron")
    torch.testing.assert_close(dev.cpu(), cpu, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_neuron_stream_is_independent_of_cpu_stream(name):
    torch.manual_seed(0)
    torch.neuron.manual_seed(99)
    a = SAMPLERS[name]("neuron").cpu()
    torch.manual_seed(0)
    torch.neuron.manual_seed(99)
    torch.rand(1000)               # drawing on the CPU ...
    torch.randn(7, generator=None)
    b = SAMPLERS[name]("neuron").cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)   # ... does not change the next neuron draw


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_neuron_draws_do_not_consume_cpu_stream(name):
    torch.manual_seed(5)
    expected = torch.rand(8)
    torch.manual_seed(5)
    SAMPLERS[name]("neuron")
    torch.testing.assert_close(torch.rand(8), expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_device_seed_alone_makes_draws_reproducible(name):
    torch.manual_seed(1)
    torch.neuron.manual_seed(2024)
    a = SAMPLERS[name]("neuron").cpu()
    torch.manual_seed(2)           # a different CPU seed must not matter
    torch.neuron.manual_seed(2024)
    b = SAMPLERS[name]("neuron").cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_consecutive_draws_differ():
    torch.manual_seed(0)
    a, b = torch.rand(100, device="neuron"), torch.rand(100, device="neuron")
    assert not torch.equal(a.cpu(), b.cpu())


def test_get_set_rng_state_round_trip():
    torch.neuron.manual_seed(11)
    torch.randn(10, device="neuron")
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.dim() == 1
    a = torch.randn(50, device="neuron").cpu()
    torch.randn(1000, device="neuron")
    torch.neuron.set_rng_state(state)
    b = torch.randn(50, device="neuron").cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    # get_rng_state returns a copy, not a live view.
    torch.testing.assert_close(torch.neuron.get_rng_state(), torch.neuron.get_rng_state())
    assert not torch.equal(state, torch.neuron.get_rng_state())


def test_set_rng_state_accepts_a_state_on_the_device():
    torch.neuron.manual_seed(3)
    state = torch.neuron.get_rng_state()
    a = torch.rand(20, device="neuron").cpu()
    torch.neuron.set_rng_state(state.to("neuron"))
    torch.testing.assert_close(torch.rand(20, device="neuron").cpu(), a, rtol=0, atol=0)


def test_rng_state_all_and_manual_seed_all(two_devices):
    torch.neuron.manual_seed_all(8)
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    a0 = torch.rand(5, device="neuron:0").cpu()
    a1 = torch.rand(5, device="neuron:1").cpu()
    torch.testing.assert_close(a0, a1, rtol=0, atol=0)  # both seeded with 8
    torch.neuron.set_rng_state_all(states)
    torch.testing.assert_close(torch.rand(5, device="neuron:0").cpu(), a0, rtol=0, atol=0)
    torch.testing.assert_close(torch.rand(5, device="neuron:1").cpu(), a1, rtol=0, atol=0)


def test_manual_seed_seeds_current_device_only(two_devices):
    torch.neuron.manual_seed_all(1)
    with torch.neuron.device(1):
        torch.neuron.manual_seed(42)
        assert torch.neuron.initial_seed() == 42
    assert torch.neuron.initial_seed() == 1
    assert torch.neuron.default_generators[1].initial_seed() == 42


def test_per_device_generators_are_independent(two_devices):
    torch.neuron.manual_seed_all(123)
    torch.rand(1000, device="neuron:0")   # drawing on device 0 ...
    b1 = torch.rand(10, device="neuron:1").cpu()
    torch.neuron.manual_seed_all(123)
    a1 = torch.rand(10, device="neuron:1").cpu()
    torch.testing.assert_close(a1, b1, rtol=0, atol=0)  # ... leaves device 1's stream alone
    gens = torch.neuron.default_generators
    assert gens[0] is not gens[1]
    assert gens[0].device == torch.device("neuron:0") and gens[1].device == torch.device("neuron:1")
    torch.neuron.set_rng_state(torch.neuron.get_rng_state(1), 0)
    torch.testing.assert_close(torch.neuron.get_rng_state(0), torch.neuron.get_rng_state(1))


def test_random_ops_on_device_one_use_its_generator(two_devices):
    torch.neuron.manual_seed_all(0)
    torch.neuron.default_generators[1].manual_seed(55)
    a = torch.randn(6, device="neuron:1").cpu()
    torch.manual_seed(55)
    torch.testing.assert_close(a, torch.randn(6), rtol=0, atol=0)


def test_dropout_on_device_one_uses_its_generator(two_devices):
    torch.neuron.manual_seed_all(0)
    torch.neuron.default_generators[1].manual_seed(55)
    a = F.dropout(torch.ones(64, device="neuron:1"), 0.5).cpu()
    b = F.dropout(torch.ones(64, device="neuron:0"), 0.5).cpu()
    torch.manual_seed(55)
    torch.testing.assert_close(a, F.dropout(torch.ones(64), 0.5), rtol=0, atol=0)
    assert not torch.equal(a, b)


def test_native_dropout_train_and_eval():
    x = torch.randn(40)
    torch.manual_seed(3)
    out, mask = torch.native_dropout(x.to("neuron"), 0.3, True)
    assert out.device.type == "neuron" and mask.dtype == torch.bool
    torch.testing.assert_close(out.cpu(), x * mask.cpu() / 0.7)
    out, mask = torch.native_dropout(x.to("neuron"), 0.3, False)
    torch.testing.assert_close(out.cpu(), x)
    assert bool(mask.all())
    empty_out, empty_mask = torch.native_dropout(torch.empty(0, device="neuron"), 0.5, True)
    assert empty_out.shape == empty_mask.shape == (0,)
    # eval-mode modules draw nothing
    torch.neuron.manual_seed(4)
    state = torch.neuron.get_rng_state()
    torch.testing.assert_close(torch.nn.Dropout(0.5).eval()(x.to("neuron")).cpu(), x)
    torch.testing.assert_close(torch.neuron.get_rng_state(), state)


def test_seed_and_initial_seed():
    torch.neuron.manual_seed(314)
    assert torch.neuron.initial_seed() == 314
    torch.neuron.seed()
    s = torch.neuron.initial_seed()
    assert s != 314
    torch.neuron.seed_all()
    assert torch.neuron.default_generators[0].initial_seed() == torch.neuron.default_generators[1].initial_seed()
    torch.manual_seed(7)
    assert torch.neuron.initial_seed() == 7  # torch.manual_seed seeds the device too


def test_torch_generator_on_neuron(two_devices):
    g = torch.Generator(device="neuron")
    assert g.device == torch.device("neuron:0")
    assert torch.Generator(device="neuron:1").device == torch.device("neuron:1")
    g.manual_seed(21)
    a = torch.randn(8, device="neuron", generator=g).cpu()
    g.manual_seed(21)
    b = torch.randn(8, device="neuron", generator=g).cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, torch.randn(8, generator=torch.Generator().manual_seed(21)), rtol=0, atol=0)
    # A private generator leaves the default one alone.
    torch.neuron.manual_seed(9)
    expected = torch.rand(4, device="neuron").cpu()
    torch.neuron.manual_seed(9)
    torch.rand(100, device="neuron", generator=g)
    torch.testing.assert_close(torch.rand(4, device="neuron").cpu(), expected, rtol=0, atol=0)
    # State round trip on a private generator; clone_state.
    st = g.get_state()
    c = torch.rand(3, device="neuron", generator=g).cpu()
    g.set_state(st)
    torch.testing.assert_close(torch.rand(3, device="neuron", generator=g).cpu(), c, rtol=0, atol=0)
    g2 = g.clone_state()
    assert g2.device.type == "neuron"
    torch.testing.assert_close(torch.rand(3, device="neuron", generator=g2).cpu(),
                               torch.rand(3, device="neuron", generator=g).cpu(), rtol=0, atol=0)


def test_generator_works_with_in_place_and_sampling_ops():
    g = torch.Generator(device="neuron").manual_seed(4)
    x = torch.empty(10, device="neuron").uniform_(generator=g)
    p = torch.multinomial(torch.ones(10, device="neuron"), 3, generator=g)
    perm = torch.randperm(10, device="neuron", generator=g)
    gc = torch.Generator().manual_seed(4)
    torch.testing.assert_close(x.cpu(), torch.empty(10).uniform_(generator=gc), rtol=0, atol=0)
    torch.testing.assert_close(p.cpu(), torch.multinomial(torch.ones(10), 3, generator=gc))
    torch.testing.assert_close(perm.cpu(), torch.randperm(10, generator=gc))


@pytest.mark.parametrize("op", [
    lambda g: torch.rand(3, device="neuron", generator=g),
    lambda g: torch.randn(3, device="neuron", generator=g),
    lambda g: torch.empty(3, device="neuron").normal_(generator=g),
    lambda g: torch.randperm(5, device="neuron", generator=g),
    lambda g: torch.bernoulli(torch.full((4,), 0.5, device="neuron"), generator=g),
], ids=["rand", "randn", "normal_", "randperm", "bernoulli"])
def test_cpu_generator_for_neuron_op_raises(op, device_works):
    with pytest.raises(RuntimeError, match="Expected a 'neuron' device type for generator but found 'cpu'"):
        op(torch.Generator())
    device_works()


def test_set_rng_state_with_garbage_raises_clear_error(device_works):
    torch.neuron.manual_seed(17)
    good = torch.neuron.get_rng_state()
    with pytest.raises(RuntimeError, match="size"):
        torch.neuron.set_rng_state(torch.zeros(5, dtype=torch.uint8))
    with pytest.raises(RuntimeError):
        torch.neuron.set_rng_state(torch.full_like(good, 255))
    with pytest.raises(TypeError, match="ByteTensor"):
        torch.neuron.set_rng_state(torch.zeros(good.numel(), dtype=torch.float32))
    with pytest.raises(TypeError, match="ByteTensor"):
        torch.neuron.set_rng_state(list(good.tolist()))
    # The generator's state is untouched by the failed attempts.
    torch.testing.assert_close(torch.neuron.get_rng_state(), good)
    device_works()


def test_fork_rng_restores_device_state():
    torch.neuron.manual_seed(6)
    expected = torch.rand(5, device="neuron").cpu()
    torch.neuron.manual_seed(6)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        torch.rand(100, device="neuron")
    torch.testing.assert_close(torch.rand(5, device="neuron").cpu(), expected, rtol=0, atol=0)


def test_default_generator_shared_by_threads_hands_out_each_draw_once():
    import threading
    torch.neuron.manual_seed(1)
    rows, lock = [], threading.Lock()

    def draw():
        for _ in range(40):
            r = torch.rand(1, 257, device="neuron").cpu()
            with lock:
                rows.append(r)

    threads = [threading.Thread(target=draw) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    # The same stream drawn sequentially; the order between threads is arbitrary, but no draw may be
    # duplicated or torn between two threads.
    assert sorted(torch.cat(rows).tolist()) == sorted(torch.cat(_sequential_rows(1, 80, 257)).tolist())


def _sequential_rows(seed, n, width):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(1, width, generator=g) for _ in range(n)]
