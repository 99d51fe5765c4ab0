"""``torchneuron migrate``: CUDA-specific code rewritten into device-agnostic code, comments kept."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from torchneuron.migrate.rewrite import main, rewrite_source

SCRIPTS = Path(__file__).resolve().parent / "data" / "cuda_scripts"


def rewrite(code: str):
    return rewrite_source(textwrap.dedent(code), "x.py")


def body(result) -> str:
    """The rewritten code without the inserted device definition and blank lines."""
    return "\n".join(line for line in result.rewritten.splitlines() if line.strip()
                     and "torchneuron migrate" not in line and "current_accelerator(check_available" not in line)


@pytest.mark.parametrize("before, after", [
    ("x = t.cuda()", "x = t.to(device)"),
    ("x = t.cuda(non_blocking=True)  # keep me", "x = t.to(device, non_blocking=True)  # keep me"),
    ("x = t.cuda(rank)", "x = t.to(torch.device(device.type, rank))"),
    ("x = t.cuda('cuda:1')", "x = t.to(f'{device.type}:1')"),
    ("y = torch.zeros(3, device='cuda')", "y = torch.zeros(3, device=device)"),
    ("y = t.to('cuda:0')", "y = t.to(f'{device.type}:0')"),
    ("d = torch.device('cuda')", "d = device"),
    ("d = torch.device('cuda', 1)", "d = torch.device(device.type, 1)"),
    ('d = torch.device(f"cuda:{rank}")', 'd = torch.device(f"{device.type}:{rank}")'),
    ('d = torch.device("cuda:{}".format(rank))', 'd = torch.device((device.type + ":{}").format(rank))'),
    ('d = torch.device("cuda" if torch.cuda.is_available() else "cpu")',
     'd = torch.device(device.type if torch.accelerator.is_available() else "cpu")'),
    ("ok = t.is_cuda", "ok = t.device.type == device.type"),
    ("if not t.is_cuda:\n    pass", "if not t.device.type == device.type:\n    pass"),
    ("n = torch.cuda.device_count()", "n = torch.accelerator.device_count()"),
    ("torch.cuda.manual_seed(0)", "torch.manual_seed(0)"),
    ("torch.cuda.manual_seed_all(0)", "torch.manual_seed(0)"),
    ("torch.cuda.synchronize()", "if torch.accelerator.is_available():\n    torch.accelerator.synchronize()"),
    ("torch.cuda.set_device(rank)",
     "if torch.accelerator.is_available():\n    torch.accelerator.set_device_index(rank)"),
    ("m = torch.cuda.max_memory_allocated() / 2**20",
     "m = (torch.accelerator.max_memory_allocated() if torch.accelerator.is_available() else 0) / 2**20"),
    ("with torch.cuda.amp.autocast():\n    pass",
     "with torch.autocast(device.type, dtype=torch.float16):\n    pass"),
    ("with torch.cuda.amp.autocast(enabled=amp, dtype=torch.bfloat16):\n    pass",
     "with torch.autocast(device.type, enabled=amp, dtype=torch.bfloat16):\n    pass"),
    ("with torch.autocast('cuda', dtype=torch.float16):\n    pass",
     "with torch.autocast(device.type, dtype=torch.float16):\n    pass"),
    ("with torch.autocast(device_type='cuda'):\n    pass", "with torch.autocast(device_type=device.type):\n    pass"),
    ("s = torch.cuda.amp.GradScaler(enabled=amp)", "s = torch.amp.GradScaler(device.type, enabled=amp)"),
    ("s = torch.amp.GradScaler()", "s = torch.amp.GradScaler(device.type)"),
    ("s = torch.load(p, map_location='cuda')", "s = torch.load(p, map_location=device)"),
    ("s = torch.load(p, map_location={'cuda:0': 'cpu'})", "s = torch.load(p, map_location={'cuda:0': 'cpu'})"),
    ("dist.init_process_group('nccl')", "dist.init_process_group(dist.get_default_backend_for_device(device))"),
    ("dist.init_process_group(backend='nccl', rank=r)",
     "dist.init_process_group(backend=dist.get_default_backend_for_device(device), rank=r)"),
    ("except torch.cuda.OutOfMemoryError:\n    pass", None),
])
def test_rewrites(before, after):
    prefix = "import torch\nimport torch.distributed as dist\n"
    if before.startswith("except"):
        before = "try:\n    f()\n" + before
        result = rewrite(prefix + before)
        assert "except torch.OutOfMemoryError:" in result.rewritten
        return
    result = rewrite(prefix + before + "\n")
    assert body(result) == "\n".join(line for line in (prefix + after).splitlines() if line.strip()), \
        result.rewritten
    assert not result.findings


def test_device_variable_and_imports():
    result = rewrite('''\
        """Doc."""
        from __future__ import annotations

        import torch  # the framework
        from torch.cuda.amp import autocast, GradScaler

        scaler = GradScaler()


        def step(model, x):
            with autocast():
                return model(x.cuda())
    ''')
    lines = result.rewritten.splitlines()
    assert lines[:5] == ['"""Doc."""', "from __future__ import annotations", "", "import torch  # the framework", ""]
    assert lines[5].startswith("# The accelerator")
    assert lines[6] == 'device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")'
    assert "from torch.cuda.amp" not in result.rewritten
    assert "scaler = torch.amp.GradScaler(device.type)" in result.rewritten
    assert "with torch.autocast(device.type, dtype=torch.float16):" in result.rewritten
    assert "return model(x.to(device))" in result.rewritten
    compile(result.rewritten, "x.py", "exec")


def test_name_clash_and_alias():
    result = rewrite("""\
        import torch as th

        def main(device):
            return th.ones(2).cuda(), th.cuda.is_available()
    """)
    assert "accel_device = th.accelerator.current_accelerator(check_available=True)" in result.rewritten
    assert "return th.ones(2).to(accel_device), th.accelerator.is_available()" in result.rewritten


def test_quotes_inside_fstrings_stay_valid():
    result = rewrite("""\
        import torch
        print(f"on {torch.cuda.get_device_name(0)}")
        print(f'on {torch.cuda.get_device_name(0)}')
    """)
    compile(result.rewritten, "x.py", "exec")


def test_untouched_code_is_left_byte_for_byte():
    code = "import torch\n\n# nothing CUDA here\nx = torch.ones(2)  # comment\nif x.device.type == 'cpu':\n    pass\n"
    result = rewrite_source(code)
    assert result.rewritten == code and not result.changed and result.diff() == ""


def test_lists_what_it_cannot_rewrite():
    result = rewrite_source((SCRIPTS / "unportable.py").read_text(), "unportable.py")
    found = {(f.line, f.what) for f in result.findings}
    whats = {w for _, w in found}
    assert {"cupy", "Triton kernel", "custom C++/CUDA extension", "comparison with 'cuda'", "NVTX range",
            "CUDA graph", "CUDA event", "CUDA_VISIBLE_DEVICES", "torch.cuda.get_device_properties"} <= whats
    assert (26, "comparison with 'cuda'") in found and (14, "Triton kernel") in found
    assert 'if device.type == "cuda":' in result.rewritten  # left alone
    assert all(f.code for f in result.findings)


def test_cli_shows_diff_then_writes(tmp_path, capsys):
    src = tmp_path / "train.py"
    src.write_text("import torch\nx = torch.ones(2).cuda()  # move it\ntorch.cuda.nvtx.range_push('a')\n")
    out = io.StringIO()
    assert main([str(tmp_path)], write=False, out=out) == 0
    text = out.getvalue()
    assert "-x = torch.ones(2).cuda()  # move it" in text and "+x = torch.ones(2).to(device)  # move it" in text
    assert f"{src}:3: NVTX range" in text
    assert "cuda()" in src.read_text()  # not written without --write
    assert main([str(src)], write=True, out=io.StringIO()) == 0
    assert "torch.ones(2).to(device)  # move it" in src.read_text()
