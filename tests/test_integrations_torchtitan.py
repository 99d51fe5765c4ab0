"""torchtitan 0.3 trains its debug Llama 3 on neuron: one process, and two processes with FSDP2.

torchtitan finds the device by itself (``torch._utils._get_available_device_type()`` answers
"neuron"); its attention is FlexAttention, compiled. Three things outside torchneuron need a
line each on PyTorch 2.13 (docs/ecosystem.md): the launcher below does them.
"""

import json
import os
import random
import re
import subprocess
import sys
import textwrap

import pytest

for _module in ("torchtitan", "datasets", "tyro", "tensorboard", "torchdata", "spmd_types", "einops", "tokenizers"):
    pytest.importorskip(_module)

# torchtitan.train with the three changes a PyTorch 2.13 user makes (see docs/ecosystem.md).
LAUNCHER = textwrap.dedent('''
    import runpy
    import sys
    import types

    import torch.distributed

    # 1. torchtitan imports its MinimalAsyncEP Triton kernels unconditionally (distributed/minimal_async_ep/api.py:30).
    kernels = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")
    for name in ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
                 "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                 "reduce_topk_slots_kernel", "topk_scores_grad_kernel"):
        setattr(kernels, name, None)
    sys.modules[kernels.__name__] = kernels

    # 2. torch.distributed.set_timeout is newer than PyTorch 2.13, which has it as _set_pg_timeout.
    if not hasattr(torch.distributed, "set_timeout"):
        torch.distributed.set_timeout = torch.distributed.distributed_c10d._set_pg_timeout

    sys.argv[0] = "torchtitan.train"
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
''')

WORDS = ("the model trains on a device with memory and kernels attention layer token step loss falls quickly "
         "when data flows through small network of many heads").split()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A launcher, a small text dataset in C4's format and a byte-level BPE tokenizer (torchtitan's own test
    assets are not in its wheel)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("torchtitan")
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120))) + "." for _ in range(200)]
    (root / "c4_test").mkdir()
    (root / "c4_test" / "data.json").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    special = ["<|begin_of_text|>", "<|end_of_text|>", "<unk>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=special,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (root / "tokenizer").mkdir()
    tokenizer.save(str(root / "tokenizer" / "tokenizer.json"))
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": special[0], "eos_token": special[1], "add_bos_token": True, "add_eos_token": True}))
    (root / "launch_torchtitan.py").write_text(LAUNCHER)
    return root


def _free_port() -> int:
    """A port nothing listens on now (a fixed one collides with other runs on the machine)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(workdir, nproc, port, *extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # torchtitan finds torch.neuron through PyTorch's autoload
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={port}",
           "launch_torchtitan.py", "--module", "llama3", "--config", "llama3_debugmodel",
           "--hf_assets_path", "tokenizer", "--dataloader.dataset_path", "c4_test", "--training.steps", "3",
           "--training.seq_len", "256", "--training.local_batch_size", "2", "--dump_folder", f"out{nproc}", *extra]
    run = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    log = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)
    assert run.returncode == 0, log[-4000:]
    assert "Training completed" in log
    losses = [float(x) for x in re.findall(r"step:\s+\d+\s+loss:\s+([0-9.]+)", log)]
    assert len(losses) == 3 * nproc, log[-4000:]
    return losses[::nproc], log


def test_debug_llama_trains_on_one_process(workdir):
    losses, log = _train(workdir, 1, _free_port())
    assert "neuron backend: rank 0 of 1 on neuron:0" in log
    assert losses[2] < losses[0]


def test_debug_llama_trains_with_fsdp2_on_two_processes(workdir):
    # torchtitan's default spmd_backend ("spmd_types") needs a newer FSDP2 (docs/ecosystem.md).
    losses, log = _train(workdir, 2, _free_port(), "--parallelism.spmd_backend", "partial_dtensor")
    assert "rank 1 of 2 on neuron:1" in log and "dp_shard=2" in log
    assert losses[2] < losses[0]
