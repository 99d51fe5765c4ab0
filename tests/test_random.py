"""Random number generators of neuron devices: seeding, reproducibility, independence, state.

A neuron generator is a seed and an offset into a Philox 4x32-10 stream, like CUDA's: element i
of a random op draws position offset + i, and the op moves the offset on by its element count
rounded up to 4. The tests check the numbers against a reference implementation of Philox here.
"""

import numpy as np
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


# ---- a reference Philox 4x32-10 (Salmon et al., SC'11) ------------------------------------
MUL_A, MUL_B, WEYL_A, WEYL_B = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
LOW32 = np.uint64(0xFFFFFFFF)


def philox_words(seed, positions, subsequence=0):
    """Word `position % 4` of block `position // 4` of (seed, subsequence), for each position."""
    positions = np.asarray(positions, dtype=np.uint64)
    c = philox_blocks(seed, positions // np.uint64(4), subsequence)
    return c[(positions % np.uint64(4)).astype(np.int64), np.arange(len(positions))]


def philox_blocks(seed, blocks, subsequence=0):
    """The four words (rows) of each block (columns) of (seed, subsequence)."""
    blocks = np.asarray(blocks, dtype=np.uint64)
    c = [blocks & LOW32, blocks >> np.uint64(32),
         np.full_like(blocks, subsequence & 0xFFFFFFFF), np.full_like(blocks, subsequence >> 32)]
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for _ in range(10):
        p0 = np.uint64(MUL_A) * c[0]
        p1 = np.uint64(MUL_B) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & LOW32,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & LOW32]
        k0, k1 = (k0 + WEYL_A) & 0xFFFFFFFF, (k1 + WEYL_B) & 0xFFFFFFFF
    return np.stack(c)


def reference_uniform(seed, offset, n):
    """torch.rand(n) on neuron for a generator at (seed, offset): the top 24 bits of each word."""
    w = philox_words(seed, offset + np.arange(n, dtype=np.uint64))
    return torch.from_numpy(((w >> np.uint64(8)).astype(np.float64) * 2.0 ** -24).astype(np.float32))


def reference_normal(seed, offset, n):
    """torch.randn(n) on neuron for n a multiple of 16: Box-Muller over blocks of 16."""
    u = reference_uniform(seed, offset, n).double().reshape(-1, 16)
    r = torch.sqrt(-2 * torch.log(1 - u[:, :8]))
    t = 2 * torch.pi * u[:, 8:]
    return torch.cat([r * torch.cos(t), r * torch.sin(t)], 1).reshape(-1).float()


def generator_at(seed, offset, device="neuron"):
    g = torch.Generator(device=device).manual_seed(seed)
    state = g.get_state()
    state[8:] = torch.tensor([offset], dtype=torch.int64).view(torch.uint8)
    g.set_state(state)
    return g


def offset_of(g):
    return int(g.get_state()[8:].view(torch.int64))


def test_philox_known_answers():
    # Random123's known-answer vectors for philox4x32-10.
    assert philox_words(0, range(4)).tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox_blocks(0xFFFFFFFFFFFFFFFF, [0xFFFFFFFFFFFFFFFF], subsequence=0xFFFFFFFFFFFFFFFF)[:, 0].tolist() == [
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    x = torch.rand(4, device="neuron", generator=torch.Generator(device="neuron").manual_seed(0)).cpu()
    assert (x.double() * 2 ** 24).long().tolist() == [0x6627E8, 0xE169C5, 0xBC57AC, 0x9B00DB]


@pytest.mark.parametrize("seed,offset,n", [(0, 0, 5), (1234, 8, 4096 + 33), (2 ** 40 + 7, 4 * 10 ** 9, 100),
                                          (5, 2 ** 34, 70000)])
def test_rand_draws_offset_plus_index_and_advances_by_count(seed, offset, n):
    g = generator_at(seed, offset)
    x = torch.rand(n, device="neuron", generator=g).cpu()
    torch.testing.assert_close(x, reference_uniform(seed, offset, n), rtol=0, atol=0)
    assert offset_of(g) == offset + (n + 3) // 4 * 4
    assert g.initial_seed() == seed


def test_state_is_cuda_layout_seed_then_offset():
    g = torch.Generator(device="neuron").manual_seed(99)
    torch.rand(10, device="neuron", generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    assert int(state[:8].view(torch.int64)) == 99 and offset_of(g) == 12
    assert g.get_offset() == 12
    g.set_offset(40)
    assert offset_of(g) == 40
    with pytest.raises(RuntimeError, match="multiple of 4"):
        g.set_offset(6)
    g.manual_seed(3)                    # seeding starts the stream over, as on CUDA
    assert offset_of(g) == 0


@pytest.mark.parametrize("make", [
    lambda g: torch.empty(4000, device="neuron").bernoulli_(0.3, generator=g),
    lambda g: torch.bernoulli(torch.full((4000,), 0.3, device="neuron"), generator=g),
], ids=["bernoulli_(p)", "bernoulli(tensor)"])
def test_bernoulli_is_uniform_below_p(make):
    x = make(generator_at(7, 16)).cpu()
    torch.testing.assert_close(x, (reference_uniform(7, 16, 4000) < 0.3).float(), rtol=0, atol=0)


def test_dropout_mask_is_uniform_below_keep_probability():
    torch.neuron.manual_seed(11)
    out, mask = torch.native_dropout(torch.ones(1000, device="neuron"), 0.25, True)
    keep = reference_uniform(11, 0, 1000) < 0.75
    torch.testing.assert_close(mask.cpu(), keep, rtol=0, atol=0)
    torch.testing.assert_close(out.cpu(), keep.float() / 0.75)


def test_randn_is_box_muller_over_philox():
    x = torch.randn(4096 + 32, device="neuron", generator=generator_at(3, 4)).cpu()
    torch.testing.assert_close(x, reference_normal(3, 4, 4096 + 32), rtol=1e-5, atol=1e-5)
    tail = torch.randn(4096 + 37, device="neuron", generator=generator_at(3, 4)).cpu()
    torch.testing.assert_close(tail[:4096 + 32], x, rtol=0, atol=0)   # a partial last block changes nothing before it
    assert tail[-5:].isfinite().all()


def test_randint_and_randperm_from_words():
    w = philox_words(21, np.arange(50, dtype=np.uint64))
    x = torch.randint(-5, 5, (50,), device="neuron", generator=generator_at(21, 0)).cpu()
    assert x.tolist() == [int(v % 10) - 5 for v in w]
    perm = torch.randperm(30, device="neuron", generator=generator_at(21, 0)).cpu()
    expected = list(range(30))
    for i in range(29):
        z = i + int(w[i] % (30 - i))
        expected[i], expected[z] = expected[z], expected[i]
    assert perm.tolist() == expected


def test_a_tensor_drawn_in_shards_equals_it_drawn_whole():
    # DTensor draws shard k of n at offset + k * numel / n (rounded up to 4): the shards of a
    # one-draw-per-element op then form the whole tensor.
    whole = torch.rand(64, device="neuron", generator=generator_at(5, 0)).cpu()
    shards = [torch.rand(16, device="neuron", generator=generator_at(5, 16 * k)).cpu() for k in range(4)]
    torch.testing.assert_close(torch.cat(shards), whole, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.complex64])
def test_other_dtypes_have_the_right_moments(dtype):
    torch.neuron.manual_seed(0)
    n = 200_000
    u = torch.empty(n, device="neuron", dtype=dtype).uniform_(-1, 1).cpu()
    z = torch.randn(n, device="neuron", dtype=dtype).cpu()
    if dtype.is_complex:
        u, z = torch.view_as_real(u), torch.view_as_real(z) * 2 ** 0.5
    assert u.dtype.is_floating_point and float(u.min()) >= -1 and float(u.max()) <= 1
    assert abs(float(u.double().mean())) < 0.01 and abs(float(z.double().mean())) < 0.01
    assert abs(float(z.double().std()) - 1) < 0.01


def test_distributions_match_their_laws():
    torch.neuron.manual_seed(1)
    n = 200_000
    e = torch.empty(n, device="neuron").exponential_(2.0).cpu().double()
    assert abs(float(e.mean()) - 0.5) < 0.01 and float(e.min()) >= 0
    geo = torch.empty(n, device="neuron").geometric_(0.25).cpu().double()
    assert abs(float(geo.mean()) - 4.0) < 0.05 and float(geo.min()) >= 1
    ln = torch.empty(n, device="neuron").log_normal_(0.0, 0.5).cpu().double()
    assert abs(float(ln.log().mean())) < 0.01 and abs(float(ln.log().std()) - 0.5) < 0.01
    c = torch.empty(n, device="neuron").cauchy_(1.0, 2.0).cpu().double()
    assert abs(float(c.median()) - 1.0) < 0.05
    r = torch.empty(n, device="neuron", dtype=torch.int64).random_(0, 7).cpu()
    assert r.min() == 0 and r.max() == 6 and abs(float(r.double().mean()) - 3) < 0.02
    full = torch.empty(1000, device="neuron", dtype=torch.int64).random_(-2 ** 63, None).cpu()
    assert (full < 0).any() and (full > 0).any()


@pytest.mark.parametrize("call,match", [
    (lambda: torch.empty(3, device="neuron").uniform_(2, 1), "from=2 > to=1"),
    (lambda: torch.empty(3, device="neuron").normal_(0, -1), "std >= 0"),
    (lambda: torch.empty(3, device="neuron").bernoulli_(1.5), r"p to be in \[0, 1\]"),
    (lambda: torch.empty(3, device="neuron").bernoulli_(torch.tensor([0.5, 2.0, 0.1], device="neuron")), "p to be in"),
    (lambda: torch.empty(3, device="neuron").exponential_(-1.0), "lambda > 0"),
    (lambda: torch.empty(3, device="neuron").geometric_(1.5), r"p to be in \(0, 1\)"),
    (lambda: torch.empty(3, device="neuron").log_normal_(0, 0), "std > 0"),
    (lambda: torch.empty(3, device="neuron", dtype=torch.int64).normal_(), "not implemented for 'Long'"),
    (lambda: torch.empty(3, device="neuron", dtype=torch.int64).exponential_(), "must be a floating point"),
    (lambda: torch.empty(3, device="neuron", dtype=torch.int64).cauchy_(), "must be a floating point"),
    (lambda: torch.empty(3, device="neuron", dtype=torch.uint8).random_(0, 300), "to - 1"),
    (lambda: torch.empty(3, device="neuron", dtype=torch.int64).random_(5, 5), "less than 'to'"),
    (lambda: torch.randperm(-1, device="neuron"), "negative"),
])
def test_bad_arguments_raise_and_keep_the_stream(call, match, device_works):
    torch.neuron.manual_seed(2)
    state = torch.neuron.get_rng_state()
    with pytest.raises((RuntimeError, NotImplementedError), match=match):
        call()
    torch.testing.assert_close(torch.neuron.get_rng_state(), state)
    device_works()


def test_cpu_rng_state_is_refused_with_its_reason():
    with pytest.raises(RuntimeError, match="16 bytes.*Mersenne Twister"):
        torch.neuron.set_rng_state(torch.get_rng_state())


def test_ops_without_a_philox_kernel_draw_from_the_offset_too():
    # multinomial and the tensor forms of normal run the CPU's kernel with a generator keyed from
    # the neuron stream at its offset: reproducible, and each call moves the offset on.
    g = torch.Generator(device="neuron").manual_seed(8)
    probs = torch.ones(20, device="neuron")
    a = torch.multinomial(probs, 10, generator=g).cpu()
    after = offset_of(g)
    b = torch.multinomial(probs, 10, generator=g).cpu()
    assert after == 4 and offset_of(g) == 8 and not torch.equal(a, b)
    torch.testing.assert_close(torch.multinomial(probs, 10, generator=generator_at(8, 0)).cpu(), a, rtol=0, atol=0)
    m = torch.normal(torch.zeros(50, device="neuron"), torch.ones(50, device="neuron"), generator=generator_at(8, 0))
    m2 = torch.normal(torch.zeros(50, device="neuron"), torch.ones(50, device="neuron"), generator=generator_at(8, 4))
    assert not torch.equal(m.cpu(), m2.cpu())


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
    a = torch.rand(6, device="neuron:1").cpu()
    torch.testing.assert_close(a, reference_uniform(55, 0, 6), rtol=0, atol=0)


def test_dropout_on_device_one_uses_its_generator(two_devices):
    torch.neuron.manual_seed_all(0)
    torch.neuron.default_generators[1].manual_seed(55)
    a = F.dropout(torch.ones(64, device="neuron:1"), 0.5).cpu()
    b = F.dropout(torch.ones(64, device="neuron:0"), 0.5).cpu()
    torch.testing.assert_close(a, (reference_uniform(55, 0, 64) < 0.5).float() * 2, rtol=0, atol=0)
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
    a = torch.randn(16, device="neuron", generator=g).cpu()
    g.manual_seed(21)
    b = torch.randn(16, device="neuron", generator=g).cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, reference_normal(21, 0, 16), rtol=1e-5, atol=1e-5)
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
    torch.testing.assert_close(x.cpu(), reference_uniform(4, 0, 10), rtol=0, atol=0)
    g.manual_seed(4)
    torch.testing.assert_close(torch.empty(10, device="neuron").uniform_(generator=g).cpu(), x.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(torch.multinomial(torch.ones(10, device="neuron"), 3, generator=g).cpu(), p.cpu())
    torch.testing.assert_close(torch.randperm(10, device="neuron", generator=g).cpu(), perm.cpu())
    assert sorted(perm.cpu().tolist()) == list(range(10))


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
    g = torch.Generator(device="neuron").manual_seed(seed)
    return [torch.rand(1, width, device="neuron", generator=g).cpu() for _ in range(n)]


# ---- PyTorch's own code that saves and restores the device's random state --------------------

class _DropoutNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.3), torch.nn.GELU(),
                                         torch.nn.Linear(32, 32), torch.nn.Dropout(0.3))
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x, checkpoint=None):
        from torch.utils.checkpoint import checkpoint as ckpt
        h = self.block(x) if checkpoint is None else ckpt(self.block, x, use_reentrant=checkpoint == "reentrant")
        return self.head(h)


def _loss_and_grads(device, checkpoint=None, autocast=False):
    torch.manual_seed(0)
    model = _DropoutNet().to(device)
    x = torch.randn(8, 16).to(device).requires_grad_()
    torch.manual_seed(123)
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
        loss = model(x, checkpoint).float().square().mean()
    loss.backward()
    return [loss.detach().cpu(), x.grad.cpu()] + [p.grad.cpu() for p in model.parameters()]


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "autocast"])
@pytest.mark.parametrize("kind", ["reentrant", "non-reentrant"])
def test_checkpointed_dropout_recomputes_the_same_mask(kind, autocast):
    # torch.utils.checkpoint restores the device's random state before recomputing the forward,
    # so the gradients belong to the forward that ran: exactly the plain run's, as on the CPU.
    # Fused eager runs a repeated group as compiled code, whose arithmetic may round differently (bfloat16
    # intermediates stay in float32 there): the mask is still the same (another mask would change the
    # loss and gradients by far more than the tolerance).
    exact = torch.neuron.get_eager_mode() == "op"
    for device in ("cpu", "neuron"):
        torch.testing.assert_close(_loss_and_grads(device, kind, autocast), _loss_and_grads(device, None, autocast),
                                   rtol=0 if exact else (2e-2 if autocast else 1e-4), atol=0 if exact else (1e-3 if autocast else 1e-6),
                                   msg=lambda m: f"{device}: {m}")


def test_checkpointing_needs_the_device_modules_initialized_flag(monkeypatch):
    # torch.utils.checkpoint saves a device's random state only if the device module says it is
    # initialized (`_initialized`, as torch.cuda does); without it the recomputation draws anew.
    monkeypatch.delattr(torch.neuron, "_initialized")
    plain, checkpointed = _loss_and_grads("neuron", None), _loss_and_grads("neuron", "non-reentrant")
    torch.testing.assert_close(checkpointed[0], plain[0], rtol=0, atol=0)   # the forward is the same ...
    assert not torch.equal(checkpointed[1], plain[1])                        # ... its gradients are not


def test_rng_state_round_trips_through_torch_save(tmp_path):
    torch.neuron.manual_seed(31)
    torch.rand(10, device="neuron")
    torch.save({"neuron": torch.neuron.get_rng_state_all(), "generator": torch.neuron.default_generators[0]
                .get_state()}, tmp_path / "rng.pt")
    expected = torch.rand(40, device="neuron").cpu()
    torch.neuron.manual_seed(0)
    saved = torch.load(tmp_path / "rng.pt")
    torch.neuron.set_rng_state_all(saved["neuron"])
    torch.testing.assert_close(torch.rand(40, device="neuron").cpu(), expected, rtol=0, atol=0)
    torch.testing.assert_close(saved["generator"], saved["neuron"][0], rtol=0, atol=0)


def test_graphsafe_state_is_the_generators_state():
    g = torch.Generator(device="neuron").manual_seed(5)
    torch.rand(8, device="neuron", generator=g)
    snapshot = g.graphsafe_get_state()
    expected = torch.rand(8, device="neuron", generator=g).cpu()
    g.graphsafe_set_state(snapshot)
    torch.testing.assert_close(torch.rand(8, device="neuron", generator=g).cpu(), expected, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="neuron generator"):
        g.graphsafe_set_state(torch.Generator())


def test_compiled_random_ops_draw_from_the_device_generator():
    import torch._inductor.config as inductor_config

    def f(x):
        return F.dropout(x, 0.5) * 2 + torch.rand_like(x)

    x = torch.ones(64, device="neuron")
    torch._dynamo.reset()
    compiled = torch.compile(f)
    torch.manual_seed(0)
    a = compiled(x).cpu()
    moved = torch.neuron.get_rng_state()
    torch.manual_seed(0)
    torch.testing.assert_close(compiled(x).cpu(), a, rtol=0, atol=0)       # a seeded program repeats
    assert offset_of(torch.neuron.default_generators[0]) > 0 and torch.equal(moved, torch.neuron.get_rng_state())
    torch.manual_seed(0)
    eager = f(x).cpu()
    torch._dynamo.reset()
    with inductor_config.patch(fallback_random=True):  # as on CUDA: compiled draws equal eager's
        torch.manual_seed(0)
        torch.testing.assert_close(torch.compile(f)(x).cpu(), eager, rtol=0, atol=0)
    torch._dynamo.reset()
