"""A slice of the model suite (benchmarks/model_suite.py) through its own entry point.

Three tiny transformers models eager and one compiled, each in its own process as the full suite
runs them: one training step on neuron against the CPU from the same weights and inputs, outputs,
loss and every gradient compared. The checks the suite's verdicts rest on are tested on their own
too: a wrong gradient fails the comparison, and the expected-failure list is strict.
"""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:  # benchmarks/ is a directory of the checkout, not an installed package
    sys.path.append(ROOT)

from benchmarks import model_suite  # noqa: E402

EAGER_MODELS = ("gpt2", "bert", "vit")
COMPILED_MODEL = "distilbert"


def _run(tmp_path, *argv):
    out = tmp_path / "suite.json"
    status = model_suite.main([*argv, "--quick", "--budget", "900", "--json", str(out)])
    data = json.loads(out.read_text())
    assert out.with_suffix(".csv").exists()
    return status, data


def _parameters_with_grads(name):
    model = model_suite.build_model(model_suite.SPECS[name])
    return sum(1 for p in model.parameters() if p.requires_grad)


def test_eager_slice(tmp_path):
    status, data = _run(tmp_path, "--eager-only", "--models", ",".join(EAGER_MODELS))
    assert status == 0, data["summary"]
    rows = {r["model"]: r for r in data["results"]}
    assert set(rows) == set(EAGER_MODELS)
    for name, row in rows.items():
        assert row["verdict"] == "pass", (name, row.get("reason"))
        eager = row["eager"]
        assert eager["ok"] is True and eager["mismatch"] is None
        # the loss, at least one output and the gradient of every parameter were compared
        assert eager["compared"] >= 2 + _parameters_with_grads(name)
        assert eager["ratio"] > 0 and eager["cpu_ms"] > 0 and eager["neuron_ms"] > 0
        assert "compiled" not in row
    assert data["summary"]["eager_pass"] == len(EAGER_MODELS)


def test_compiled_slice(tmp_path):
    status, data = _run(tmp_path, "--models", COMPILED_MODEL)
    assert status == 0, data["summary"]
    (row,) = data["results"]
    assert row["verdict"] == "pass", row.get("reason")
    compiled = row["compiled"]
    assert compiled["ok"] is True and compiled["vs_eager_cpu"] is True
    assert compiled["compared"] >= 2 + _parameters_with_grads(COMPILED_MODEL)
    assert compiled["cpu_compile_s"] > 0 and compiled["neuron_compile_s"] > 0
    assert compiled["compile_ratio"] == pytest.approx(compiled["neuron_compile_s"] / compiled["cpu_compile_s"])
    assert data["summary"]["compiled_pass"] == 1


def _step(seed=0):
    g = torch.Generator().manual_seed(seed)
    return model_suite.StepResult(outputs=[torch.randn(2, 3, generator=g)], loss=torch.tensor(1.5),
                                  grads={"w": torch.randn(4, generator=g), "b": None})


def test_compare_catches_a_wrong_gradient():
    want = _step()
    same = model_suite._compare(_step(), want, model_suite.EAGER_TOL)
    assert same["ok"] and same["bitwise"] and same["max_abs_diff"] == 0.0
    wrong = _step()
    wrong.grads["w"][1] += 1e-2
    result = model_suite._compare(wrong, want, model_suite.EAGER_TOL)
    assert result["ok"] is False and not result["bitwise"]
    assert result["mismatch"].startswith("grad w")
    close = _step()
    close.grads["w"][1] += 1e-6  # within tolerance, yet not bit-identical
    result = model_suite._compare(close, want, model_suite.EAGER_TOL)
    assert result["ok"] is True and result["bitwise"] is False
    missing = _step()
    missing.grads["w"] = None
    assert model_suite._compare(missing, want, model_suite.EAGER_TOL)["ok"] is False


def test_expected_failures_are_strict(monkeypatch):
    passing = {"model": "bert", "family": "encoder", "eager": {"ok": True}, "compiled": {"ok": True}}
    monkeypatch.setattr(model_suite, "EXPECTED_FAILURES", {"bert": "fails on the CPU"})
    row = dict(passing)
    model_suite.classify(row, eager_only=False)
    assert row["verdict"] == "XPASS"
    row = {"model": "bert", "family": "encoder", "cpu_error": "eager: RuntimeError: no kernel"}
    model_suite.classify(row, eager_only=False)
    assert row["verdict"] == "xfail"
    monkeypatch.setattr(model_suite, "EXPECTED_FAILURES", {})
    row = {"model": "bert", "family": "encoder", "cpu_error": "eager: RuntimeError: no kernel"}
    model_suite.classify(row, eager_only=False)
    assert row["verdict"] == "CPU-FAIL"  # an unlisted CPU failure is reported, not hidden
    row = {"model": "bert", "family": "encoder", "eager": {"ok": False, "mismatch": "grad w: differ"}}
    model_suite.classify(row, eager_only=True)
    assert row["verdict"] == "FAIL"
    summary = model_suite.summarize([row], eager_only=True)
    assert summary["unexpected"] == ["bert"]


def test_a_timeout_in_the_cpus_own_compile_is_the_cpus_failure(monkeypatch):
    def timed_out(compiling):
        return {"model": "funnel", "family": "encoder", "eager": {"ok": True}, "process": "timeout",
                "compiled": {"first": "cpu", "compiling": compiling}}

    monkeypatch.setattr(model_suite, "EXPECTED_FAILURES", {"funnel:compiled": "slow on the CPU"})
    row = timed_out("cpu")
    model_suite.classify(row, eager_only=False)
    assert row["verdict"] == "xfail" and "past the budget" in row["reason"]
    row = timed_out("neuron")  # neuron's compile ran out of time: not excused by the CPU's listing
    model_suite.classify(row, eager_only=False)
    assert row["verdict"] == "XPASS"
    monkeypatch.setattr(model_suite, "EXPECTED_FAILURES", {})
    row = timed_out("cpu")
    model_suite.classify(row, eager_only=False)
    assert row["verdict"] == "CPU-FAIL"
    row = timed_out("neuron")
    model_suite.classify(row, eager_only=False)
    assert row["verdict"] == "timeout"


def test_a_later_eager_run_replaces_only_the_eager_result(tmp_path):
    """--from-json: an eager-only run merged after a full one keeps each model's compiled result,
    and a timeout while the CPU compiled (an expected failure) stays one."""
    def row(model, ratio, compiled=True, **extra):
        r = {"model": model, "family": "decoder", "parameters": 10, "loss": 1.0,
             "eager": {"ok": True, "bitwise": True, "max_abs_diff": 0.0, "mismatch": None, "compared": 3,
                       "ratio": ratio, "cpu_ms": 1.0, "neuron_ms": ratio, "inner": 1}, **extra}
        if compiled:
            r["compiled"] = {"first": "cpu", "cpu_compile_s": 10.0, "neuron_compile_s": 11.0, "ok": True,
                             "bitwise": True, "max_abs_diff": 0.0, "mismatch": None, "compared": 3,
                             "compile_ratio": 1.1, "vs_eager_cpu": True, "ratio": 1.02, "cpu_ms": 0.5,
                             "neuron_ms": 0.51, "inner": 1}
        return r

    def payload(eager_only, rows):
        settings = {"argv": ["benchmarks/model_suite.py"] + (["--eager-only"] if eager_only else []),
                    "eager_only": eager_only, "busy_cpus_before_run": 0.0}
        return {"suite": "x", "created": "now", "settings": settings, "environment": {}, "summary": {}, "results": rows}

    funnel_timeout = row("funnel", 1.2, process="timeout")
    funnel_timeout["compiled"] = {"compiling": "cpu", "first": "cpu"}
    full = tmp_path / "full.json"
    full.write_text(json.dumps(payload(False, [row("llama", 1.10), funnel_timeout])))
    eager = tmp_path / "eager.json"
    eager.write_text(json.dumps(payload(True, [row("llama", 1.04, compiled=False), row("funnel", 1.05, compiled=False)])))
    md = tmp_path / "suite.md"
    assert model_suite.main(["--from-json", str(full), "--from-json", str(eager), "--markdown", str(md)]) == 0
    lines = {ln.split(" | ")[0].strip("| "): ln for ln in md.read_text().splitlines() if ln.startswith("| ")}
    assert "| 1.04 | pass | 1.02 |" in lines["llama"], lines["llama"]  # the new eager ratio, the old compiled one
    assert "1.05" in lines["funnel"] and "xfail" in md.read_text()  # still the CPU's own compile timeout
