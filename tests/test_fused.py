"""Fused eager (``torch.neuron.set_eager_mode("fused")``): ops recorded into groups, cut where the host
needs the device, run op by op or as one compiled graph; results as in op mode.

Compiling a group costs seconds, so most tests compile at most one or two small groups; the property
test compiles every group it sees (``compile_after=1``) on tiny shapes.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchneuron
from suite_modes import assert_suite_passes_with
from torchneuron import _C



@pytest.fixture(autouse=True)
def op_mode_around():
    """Each test starts in op mode with fresh statistics, and leaves op mode and the defaults behind."""
    torch.neuron.set_eager_mode("op")
    # Small groups compile here, the second time they are seen (not once they pay); nothing bypassed.
    defaults = _C._fused_config(min_ops=2, bypass_ops=0, payoff=False)
    torchneuron.compile.fused_report(reset=True)
    yield
    torch.neuron.set_eager_mode("op")
    _C._fused_config(**defaults)
    _C._set_fused_policy(torchneuron._fused_expect, torchneuron._fused_learned)
    torchneuron.compile.fused_report(reset=True)


def in_both_modes(program, *args):
    """program(*args) in op mode and in fused mode (its result moved to the CPU inside each)."""
    op = program(*args)
    with torch.neuron.eager_mode("fused"):
        fused = program(*args)
    return op, fused


# ---- the mode ---------------------------------------------------------------------------------------

def test_the_mode_is_set_and_scoped_and_bad_names_are_refused():
    assert torch.neuron.get_eager_mode() == "op"
    with pytest.raises(RuntimeError, match="boom"):
        with torch.neuron.eager_mode("fused"):
            assert torch.neuron.get_eager_mode() == "fused"
            raise RuntimeError("boom")
    assert torch.neuron.get_eager_mode() == "op"
    with pytest.raises(ValueError, match="eager mode must be one of 'op', 'fused'"):
        torch.neuron.set_eager_mode("lazy")


def test_the_environment_sets_the_mode():
    code = "import torch, torchneuron; print(torch.neuron.get_eager_mode())"
    for value, expected in (("fused", "fused"), ("op", "op"), ("", "op")):
        out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TORCHNEURON_EAGER=value),
                             capture_output=True, text=True, check=True).stdout.split()[-1]
        assert out == expected, (value, out)
    bad = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TORCHNEURON_EAGER="lazy"),
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "TORCHNEURON_EAGER must be one of op, fused" in bad.stderr


# ---- recording and cuts -----------------------------------------------------------------------------

def test_ops_are_recorded_and_run_where_the_host_reads():
    x = torch.randn(8, 8, device="neuron")
    with torch.neuron.eager_mode("fused"):
        y = (x + 1).relu() * 2
        z = y.sum()
        report = torchneuron.compile.fused_report()
        assert report.recorded_ops == 4 and report.groups == []  # nothing ran yet
        value = z.item()
    torch.testing.assert_close(value, ((x.cpu() + 1).relu() * 2).sum().item())
    report = torchneuron.compile.fused_report()
    assert [g.ops for g in report.groups] == [4]
    assert sum(report.cuts.values()) == 1


@pytest.mark.parametrize("read", ["item", "cpu", "tolist", "print", "synchronize", "random", "event"])
def test_every_kind_of_host_need_cuts_the_group(read, capsys):
    x = torch.randn(4, device="neuron")
    with torch.neuron.eager_mode("fused"):
        y = x.exp() + 1
        if read == "item":
            y[0].item()
        elif read == "cpu":
            y.cpu()
        elif read == "tolist":
            y.tolist()
        elif read == "print":
            print(y)
        elif read == "synchronize":
            torch.neuron.synchronize()
        elif read == "random":
            torch.rand(3, device="neuron")
        elif read == "event":
            torch.neuron.Event().record()
        report = torchneuron.compile.fused_report()
    # The first group is the two ops (printing records its own formatting ops after them).
    assert report.groups and report.groups[0].first_ops[:2] == ["exp", "add"], report
    assert report.groups[0].ops == 2 or read == "print", report
    torch.testing.assert_close(y.cpu(), x.cpu().exp() + 1)


def test_cut_points_depend_only_on_the_order_of_ops():
    def program():
        x = torch.arange(12.0, device="neuron").reshape(3, 4)
        for i in range(3):
            x = (x * 0.5 + i).sin()
            if i == 1:
                x.sum().item()
        x = x @ x.t()
        return x.cpu()

    runs = []
    for _ in range(2):
        torchneuron.compile.fused_report(reset=True)
        with torch.neuron.eager_mode("fused"):
            program()
        report = torchneuron.compile.fused_report()
        runs.append([(g.ops, g.seen, g.first_cut) for g in report.groups])
    assert runs[0] == runs[1] and len(runs[0]) == 2, runs


def test_deterministic_algorithms_record_nothing():
    x = torch.randn(4, device="neuron")
    torch.use_deterministic_algorithms(True)
    try:
        with torch.neuron.eager_mode("fused"):
            y = x * 2 + 1
            assert torchneuron.compile.fused_report().recorded_ops == 0
    finally:
        torch.use_deterministic_algorithms(False)
    torch.testing.assert_close(y.cpu(), x.cpu() * 2 + 1)


def test_the_policy_is_set_by_name_and_a_bad_change_changes_nothing():
    before = _C._fused_config()
    assert {"compile_after", "payoff", "min_ops", "max_ops", "cold_seconds", "gain", "timed_runs"} <= set(before)
    with pytest.raises(TypeError, match="unexpected keyword argument 'min_op'"):
        _C._fused_config(max_ops=99, min_op=3)
    with pytest.raises(ValueError, match="min_ops must be positive"):
        _C._fused_config(max_ops=99, min_ops=-1)
    assert _C._fused_config() == before  # max_ops, given beside the bad one, was not set either
    assert _C._fused_config(max_ops=99)["max_ops"] == before["max_ops"]  # the figures as they were
    assert _C._fused_config(**before)["max_ops"] == 99


def test_the_policy_is_one_object_with_its_figures_learning_rule_and_cut_rules():
    policy = _C._fused_policy()
    figures = policy.figures()
    assert figures == _C._fused_config() and policy["min_ops"] == figures["min_ops"]
    with policy.changed(gain=0.3, cold_seconds=2.0):  # the same figures fused eager runs on
        assert _C._fused_config()["gain"] == 0.3 and policy["cold_seconds"] == 2.0
        assert policy.expect(100) == pytest.approx((2.0 + figures["cold_seconds_per_op"] * 100, 0.3))
    assert policy.figures() == figures
    with pytest.raises(ValueError, match="min_ops must be positive"):
        with policy.changed(min_ops=0):
            pass
    assert policy.figures() == figures
    # The learning rule: a cold compile at the machine's measured rate, a warm one at the group's own time.
    cold, gain = figures["cold_seconds"], figures["gain"]
    assert policy.expect(100, 0.01) == pytest.approx((cold + 1.0, gain))
    assert policy.expect(100, 0.01, {"ops": 100}) == pytest.approx((figures["warm_seconds_per_op"] * 100, gain))
    assert policy.expect(100, None, {"ops": 100, "warm_seconds": 4.0, "gain": -0.2}) == pytest.approx((4.0, -0.2))
    n = figures["rate_ops"] * 2
    rate, group = policy.learn(n, cold + 3.0, 2.0, 1.5)  # compiled cold: the machine's rate is measured
    assert rate == pytest.approx(3.0 / n) and group == {"ops": n, "gain": pytest.approx(0.25)}
    again, warm = policy.learn(n, 0.5, 2.0, 1.0, rate, group)  # from the cache: the group's own time
    assert again == pytest.approx(rate) and warm == {"ops": n, "warm_seconds": 0.5, "gain": pytest.approx(0.5)}
    assert group == {"ops": n, "gain": pytest.approx(0.25)}  # the history given is not changed in place
    assert policy.learn(figures["rate_ops"] - 1, 10.0, 0.0, 0.0) == (None, {"ops": figures["rate_ops"] - 1})
    cuts = {rule["key"]: rule for rule in policy.cuts}
    assert set(cuts) == {"collective", "random", "data_dependent", "host_read", "host_copy"}
    assert cuts["random"]["tags"] == ["nondeterministic_seeded"] and cuts["random"]["runs_alone"]
    assert not cuts["host_read"]["runs_alone"] and "_to_copy" in cuts["host_copy"]["ops"]


def test_a_size_bound_cuts_long_groups():
    _C._fused_config(max_ops=10)
    x = torch.zeros(4, device="neuron")
    with torch.neuron.eager_mode("fused"):
        for _ in range(25):
            x = x + 1
        result = x.cpu()
    assert torch.equal(result, torch.full((4,), 25.0))
    report = torchneuron.compile.fused_report()
    assert report.cuts.get("size bound") == 2, report


# ---- compiled groups --------------------------------------------------------------------------------

def test_a_repeated_group_is_compiled_and_gives_the_same_results():
    _C._fused_config(compile_after=2, min_ops=2)
    w = torch.randn(16, 16, device="neuron")
    x = torch.randn(8, 16, device="neuron")

    def step(x):
        h = F.gelu(x @ w)
        return F.layer_norm(h + x, (16,))

    expected = step(x.cpu().to("neuron")).cpu()
    with torch.neuron.eager_mode("fused"):
        outs = [step(x).cpu() for _ in range(4)]
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    (group,) = torchneuron.compile.fused_report().groups
    assert group.compiled and group.seen == 4 and group.fused_runs == 3, group


def test_a_group_is_compiled_once_its_op_by_op_runs_pay_for_compiling_it():
    asked, told = [], []

    def expect(key, ops):  # a compile of 5 ms that saves half of each op-by-op run
        asked.append((key, ops))
        return 0.005, 0.5

    _C._set_fused_policy(expect, lambda *measured: told.append(measured))
    _C._fused_config(compile_after=2, min_ops=2, payoff=True)
    w = torch.randn(192, 192, device="neuron")
    x = torch.randn(192, 192, device="neuron")

    def step(x):
        for _ in range(4):
            x = F.gelu(x @ w) / 16
        return x

    expected = step(x)
    with torch.neuron.eager_mode("fused"):
        outs = [step(x).cpu() for _ in range(60)]
        (group,) = torchneuron.compile.fused_report().groups
        assert group.compiled and 0 < group.fused_runs, group
        ran_op_by_op = group.op_seconds + group.credited_seconds  # skipped occurrences are credited
        # The rule, with what it measured: the first op-by-op run is left out of the time, so at least two
        # ran before the compile (how many more depends on the host's speed).
        assert group.op_runs >= 2 and ran_op_by_op * 0.5 >= 0.005, group
        assert group.op_runs + group.skipped_runs + group.fused_runs == 60 and group.fused_runs > 0, group
    for out in outs:
        torch.testing.assert_close(out, expected.cpu(), rtol=1e-4, atol=1e-5)
    assert len(asked) == 1 and asked[0][1] == group.ops, asked  # asked once, the second time it was seen
    (key, ops, compile_seconds, op_seconds, fused_seconds), = told  # told once, after its timed compiled runs
    assert (key, ops) == asked[0] and compile_seconds > 0 and op_seconds > 0 and fused_seconds > 0, told


def test_a_group_that_would_not_pay_is_not_compiled_and_the_report_says_why():
    _C._set_fused_policy(lambda key, ops: (3600.0, 0.1), lambda *measured: None)
    _C._fused_config(compile_after=2, min_ops=2, payoff=True, skip_ahead=0)
    w = torch.randn(16, 16, device="neuron")
    with torch.neuron.eager_mode("fused"):
        for _ in range(5):
            (F.gelu(w @ w) + 1).sum().item()
    (group,) = torchneuron.compile.fused_report().groups
    assert not group.compiled and group.seen == 5 and group.op_runs == 5, group
    assert group.expected_compile_seconds == 3600.0 and "about 3600.0 s" in group.waiting, group
    assert "not compiled yet: pays for compiling" in str(torchneuron.compile.fused_report())


def test_while_a_group_waits_to_pay_most_of_its_occurrences_run_unrecorded():
    _C._set_fused_policy(lambda key, ops: (3600.0, 0.1), lambda *measured: None)
    _C._fused_config(compile_after=2, min_ops=2, payoff=True, skip_ahead=8)
    w = torch.randn(16, 16, device="neuron")
    b = torch.randn(16, device="neuron")

    def step(i):
        x = (w * (1 + i / 100)).to("neuron")  # a copy to the device: a boundary that cuts nothing
        return (F.gelu(x @ w) + b).sum().item()

    expected = [step(i) for i in range(30)]
    with torch.neuron.eager_mode("fused"):
        got = [step(i) for i in range(30)]
    torch.testing.assert_close(got, expected)
    report = torchneuron.compile.fused_report()
    (group,) = report.groups  # recording resumed where a group begins: the same group each time
    # Seen at steps 1 and 2, then 8 skipped, seen, 8 skipped, seen, 8 skipped, seen (step 30).
    assert group.seen == 5 and group.skipped_runs == 3 * 8 and group.op_runs == 5, group
    assert group.credited_seconds > 0 and "24 of them skipped unrecorded" in group.waiting, group
    assert report.bypassed_ops > 0 and report.recorded_ops == 5 * group.ops, report


def test_a_pay_off_rule_that_fails_warns_and_its_defaults_decide():
    def broken(key, ops):
        raise OSError("no cache here")

    _C._set_fused_policy(broken, lambda *measured: None)
    _C._fused_config(compile_after=2, min_ops=2, payoff=True)
    w = torch.randn(16, 16, device="neuron")
    with pytest.warns(RuntimeWarning, match="fused eager: the pay-off rule failed: OSError: no cache here"):
        with torch.neuron.eager_mode("fused"):
            for _ in range(3):
                got = (F.gelu(w @ w) + 1).sum().item()
    torch.testing.assert_close(got, (F.gelu(w @ w) + 1).sum().item())
    (group,) = torchneuron.compile.fused_report().groups
    policy = _C._fused_config()  # the policy's own figures, with no measurement to go by
    assert not group.compiled and group.expected_gain == policy["gain"], group
    expected = policy["cold_seconds"] + policy["cold_seconds_per_op"] * group.ops
    assert group.expected_compile_seconds == pytest.approx(expected), group


def test_what_a_compiled_group_measured_is_kept_for_the_next_process(tmp_path):
    """A process that compiled a group keeps its compile time and gain beside the compile cache; the
    next process, the same program, expects that group's graph to come from the cache."""
    code = """if True:
        import json, torch, torchneuron
        from torchneuron import _C
        import torch.nn.functional as F
        torchneuron._C._fused_config(min_ops=2, compile_after=3)  # two op-by-op runs: a gain to measure
        asked = []
        policy = torchneuron._fused_expect
        _C._set_fused_policy(lambda key, ops: asked.append(policy(key, ops)) or asked[-1], torchneuron._fused_learned)
        w = torch.ones(32, 32, device="neuron") / 32
        torch.neuron.set_eager_mode("fused")
        for _ in range(9):
            x = w
            for _ in range(40):  # enough ops for the machine's compile time per op to be learned
                x = F.gelu(x) * 1.01
            x.sum().item()
        print("ASKED", json.dumps(asked))
        print("REPORT", [(g.ops, g.compiled) for g in torchneuron.compile.fused_report().groups])
    """
    env = dict(os.environ, TORCHNEURON_CACHE_DIR=str(tmp_path), TORCHNEURON_FUSED_COMPILE="early")
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    history = json.loads((tmp_path / "torchneuron-fused-groups.json").read_text())
    (entry,) = history["groups"].values()
    assert entry["ops"] > 80 and "gain" in entry and history["cold_seconds_per_op"] >= 0, history
    env["TORCHNEURON_FUSED_COMPILE"] = "payoff"
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    asked = json.loads(second.stdout.split("ASKED", 1)[1].splitlines()[0])
    assert asked == [[pytest.approx(entry.get("warm_seconds", 0.006 * entry["ops"])), pytest.approx(entry["gain"])]], (
        asked, entry)
    bad = subprocess.run([sys.executable, "-c", "import torchneuron"], capture_output=True, text=True,
                         env=dict(env, TORCHNEURON_FUSED_COMPILE="sometimes"))
    assert bad.returncode != 0 and "TORCHNEURON_FUSED_COMPILE must be one of payoff, early" in bad.stderr


def test_a_learning_rate_that_changes_every_step_does_not_recompile():
    _C._fused_config(compile_after=2, min_ops=2)
    p = torch.ones(32, device="neuron")
    g = torch.full((32,), 0.5, device="neuron")
    ref = p.cpu().clone()
    with torch.neuron.eager_mode("fused"):
        for step in range(1, 7):
            lr = 0.1 / step
            p.mul_(1 - lr * 0.01).add_(g, alpha=-lr)
            p.addcdiv_(g, g + 1, value=-lr)
            p.sum().item()
    for step in range(1, 7):
        lr = 0.1 / step
        ref.mul_(1 - lr * 0.01).add_(g.cpu(), alpha=-lr)
        ref.addcdiv_(g.cpu(), g.cpu() + 1, value=-lr)
    torch.testing.assert_close(p.cpu(), ref)
    groups = [g for g in torchneuron.compile.fused_report().groups if g.ops > 2]
    assert len(groups) == 1 and groups[0].compiled and groups[0].fused_runs >= 4, groups


def test_training_in_fused_mode_matches_op_mode():
    from torchneuron.models import gpt

    _C._fused_config(compile_after=2, min_ops=2)
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=17, block_size=8, n_layer=1, n_head=2, n_embd=16, dropout=0.0))
    tokens = torch.randint(0, 17, (4, 9))
    x, y = tokens[:, :-1].to("neuron"), tokens[:, 1:].to("neuron")

    def train(mode):
        m = copy.deepcopy(model).to("neuron")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=False)
        losses = []
        with torch.neuron.eager_mode(mode):
            for _ in range(5):
                loss = m(x, y)[1]
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())
        return losses, [p.detach().cpu() for p in m.parameters()]

    op_losses, op_params = train("op")
    fused_losses, fused_params = train("fused")
    torch.testing.assert_close(fused_losses, op_losses, rtol=1e-4, atol=1e-5)
    for a, b in zip(fused_params, op_params):  # compiled arithmetic: as close as torch.compile's
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    report = torchneuron.compile.fused_report()
    assert any(g.compiled and g.fused_runs >= 2 for g in report.groups), report


# ---- semantics --------------------------------------------------------------------------------------

def test_random_ops_draw_the_same_numbers_as_op_mode():
    def program():
        torch.neuron.manual_seed(7)
        x = torch.ones(64, device="neuron")
        y = F.dropout(x * 2, p=0.5) + torch.rand(64, device="neuron")
        return torch.randn(3, device="neuron").cpu(), y.cpu(), torch.neuron.get_rng_state()

    (a, b, s), (c, d, t) = in_both_modes(program)
    assert torch.equal(a, c) and torch.equal(b, d) and torch.equal(s, t)


def test_autograd_hooks_no_grad_and_autocast_as_in_op_mode():
    torch.manual_seed(0)
    w0 = torch.randn(8, 8)
    x0 = torch.randn(4, 8)

    def program():
        w = w0.to("neuron").requires_grad_()
        seen = []
        w.register_hook(lambda g: seen.append(g.sum().item()) or g * 2)
        with torch.autocast("neuron", dtype=torch.bfloat16):
            y = (x0.to("neuron") @ w).float().tanh()
        with torch.no_grad():
            z = y * 3
        y.sum().backward()
        return w.grad.cpu(), z.cpu(), seen

    (g1, z1, s1), (g2, z2, s2) = in_both_modes(program)
    torch.testing.assert_close(g2, g1)
    torch.testing.assert_close(z2, z1)
    torch.testing.assert_close(s2, s1)


def test_side_streams_and_events_as_in_op_mode():
    def program():
        x = torch.randn(64, 64, device="neuron", generator=torch.Generator("neuron").manual_seed(3))
        side = torch.neuron.Stream()
        side.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(side):
            y = x @ x
            done = torch.neuron.Event()
            done.record()
        torch.neuron.current_stream().wait_event(done)
        return (y + x).cpu()

    a, b = in_both_modes(program)
    torch.testing.assert_close(b, a)


def test_a_shape_error_is_raised_at_the_op():
    x = torch.randn(3, 4, device="neuron")
    with torch.neuron.eager_mode("fused"):
        y = x + 1
        with pytest.raises(RuntimeError, match="must match the size"):
            x + torch.randn(5, device="neuron")
        torch.testing.assert_close(y.cpu(), x.cpu() + 1)


def _look_up(idx, table):
    return F.embedding(idx, table) * 2  # the group begins here


def test_a_kernel_error_found_only_when_the_group_runs_names_the_op_and_where_its_group_began():
    table = torch.randn(10, 3, device="neuron")
    idx = torch.tensor([1, 12], device="neuron")
    line = _look_up.__code__.co_firstlineno + 1
    with torch.neuron.eager_mode("fused"):
        rows = _look_up(idx, table)
        with pytest.raises(IndexError, match="fused eager: the error comes from (embedding|index_select), recorded "
                                             rf"earlier in the group that began at .*test_fused.py:{line} in _look_up"):
            rows.cpu()
        # The device stays usable.
        torch.testing.assert_close((table * 2).cpu(), table.cpu() * 2)


def test_out_arguments_views_and_in_place_ops_on_views():
    _C._fused_config(compile_after=1, min_ops=1)  # compile every group: the graph's view and mutation handling is what runs

    def program():
        base = torch.arange(24.0, device="neuron").reshape(4, 6)
        out = torch.empty(4, 6, device="neuron")
        for _ in range(2):
            v = base[:, 1:4]
            v.mul_(2)
            base.t()[2].add_(1)
            torch.add(base, 1, out=out)
            s = out.view(6, 4).sum(0)
            base.sum().item()
        return base.cpu(), out.cpu(), s.cpu()

    for a, b in zip(*in_both_modes(program)):
        torch.testing.assert_close(b, a)
    assert any(g.compiled for g in torchneuron.compile.fused_report().groups)


# A random program: ops on a few tensors, some views, in-place updates, and reads.
_UNARY = ["exp", "sin", "neg", "relu", "sigmoid", "abs"]
_BINARY = ["add", "mul", "sub", "maximum"]


@st.composite
def programs(draw):
    steps = []
    for _ in range(draw(st.integers(3, 12))):
        kind = draw(st.sampled_from(["unary", "binary", "inplace", "view_inplace", "read", "reduce"]))
        steps.append((kind, draw(st.integers(0, 2)), draw(st.integers(0, 2)),
                      draw(st.sampled_from(_UNARY)), draw(st.sampled_from(_BINARY))))
    return steps


def _run(steps, device):
    gen = torch.Generator().manual_seed(0)
    ts = [torch.randn(4, 6, generator=gen).to(device) for _ in range(3)]
    reads = []
    for kind, a, b, unary, binary in steps:
        if kind == "unary":
            ts[a] = getattr(torch, unary)(ts[b]).clamp(-3, 3)
        elif kind == "binary":
            ts[a] = getattr(torch, binary)(ts[a], ts[b]).clamp(-3, 3)
        elif kind == "inplace":
            ts[a].mul_(0.5).add_(ts[b])
        elif kind == "view_inplace":
            ts[a][1:3, ::2].copy_(ts[b].t()[:3, 1:3].t())
        elif kind == "read":
            reads.append(ts[a].sum().item())
        else:
            ts[a] = ts[b].sum(0, keepdim=True).expand(4, 6).contiguous()
    return [t.cpu() for t in ts], reads


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_of_views_in_place_ops_and_reads_match_op_mode(steps):
    _C._fused_config(compile_after=2, min_ops=1)  # the first fused run op by op, the second compiled
    expected = _run(steps, "neuron")
    with torch.neuron.eager_mode("fused"):
        got = _run(steps, "neuron")
        got_again = _run(steps, "neuron")  # the same groups again: compiled this time
    assert any(g.compiled for g in torchneuron.compile.fused_report(reset=True).groups) or not steps
    for out in (got, got_again):
        for a, b in zip(out[0], expected[0]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[1], expected[1], rtol=1e-5, atol=1e-5)


def test_ops_that_cannot_be_recorded_run_at_once_every_time():
    # arange's out= is resized, so it runs at once; the meta cache remembers that per argument
    # layout, and an out= of the right size (another layout) is recorded as usual.
    a, b = torch.randn(6), torch.randn(6)

    def program(device):
        out, results = torch.empty(0, device=device), []
        for n in (5, 5, 7, 5):
            results.append(torch.arange(0, n, device=device).to(torch.float32) * 2)
        for _ in range(3):
            torch.add(a.to(device), b.to(device), out=out)  # resized the first time only
            results.append(out * 1)
        return [r.cpu() for r in results]

    expected = program("cpu")
    with torch.neuron.eager_mode("fused"):
        got = program("neuron")
        got_again = program("neuron")
    for g in (got, got_again):
        for e, r in zip(expected, g, strict=True):
            torch.testing.assert_close(r, e)
    assert torchneuron.compile.fused_report().recorded_ops > 0


def test_groups_fusion_does_not_pay_for_are_left_alone_for_a_while():
    _C._fused_config(min_ops=8, patience=3, bypass_ops=20)
    x0 = torch.randn(16, device="neuron")

    def loop():
        x, reads = x0, []
        for _ in range(30):
            x = (x * 0.9 + 0.1).sin()
            reads.append(x[0].item())  # a cut every 3 ops: groups too small to compile
        return reads

    expected = loop()
    with torch.neuron.eager_mode("fused"):
        got = loop()
    torch.testing.assert_close(got, expected)
    report = torchneuron.compile.fused_report()
    assert report.bypassed_ops > 0 and not any(g.compiled for g in report.groups), report
    assert report.recorded_ops + report.bypassed_ops == 90, report


FUSED_SUITE = ["tests/test_device.py", "tests/test_copies.py", "tests/test_streams.py", "tests/test_memory.py",
               "tests/test_serialization.py", "tests/test_ops.py", "tests/test_errors.py", "tests/test_random.py",
               "tests/test_amp.py", "tests/conformance/test_opinfo.py", "tests/conformance/test_modules.py"]


@pytest.mark.skipif(os.environ.get("TORCHNEURON_EAGER") == "fused", reason="this test starts the fused run itself")
def test_the_device_suite_and_the_conformance_slice_pass_in_fused_eager():
    """The device tests and the conformance quick slice, run again with TORCHNEURON_EAGER=fused."""
    # Groups compiled the second time they are seen (the pay-off rule would leave most of these tests'
    # groups op by op), so that compiled groups run throughout.
    assert_suite_passes_with({"TORCHNEURON_EAGER": "fused", "TORCHNEURON_FUSED_COMPILE": "early"}, FUSED_SUITE)
