"""vLLM's model runner on a neuron device.

vLLM's CPU model runner is its GPU model runner with every device buffer made
the same tensor as its host buffer. On neuron the two stay apart, as on a GPU:
inputs are prepared in host memory and copied to the device, the model and the
KV cache live in device memory, and results come back as on a GPU: a
non-blocking copy to host memory and a device event (``torch.Event`` on the
neuron device, the current accelerator) that the host waits on.

The runner is built with the GPU runner's constructor, not the CPU runner's:
the CPU runner replaces ``torch.Event`` and ``torch.cuda.Stream`` by no-ops
while it builds and makes every device buffer its host buffer, none of which
holds on neuron. The GPU runner's CUDA streams exist only for async scheduling
and speculative decoding, which the platform leaves off
(:meth:`~torchneuron.vllm.platform.NeuronPlatform.check_and_update_config`).
When ``TORCHNEURON_VLLM_SCHEDULE`` is set, each engine step's schedule is recorded on the way in
(:mod:`torchneuron.vllm.schedule_recorder`).
"""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from . import schedule_recorder

__all__ = ["NeuronModelRunner"]


class NeuronModelRunner(CPUModelRunner):
    """vLLM's CPU model runner with its device buffers on ``device`` (a neuron device)."""

    def __init__(self, vllm_config, device: torch.device) -> None:
        if device.type != "neuron":
            raise ValueError(f"NeuronModelRunner runs on a neuron device, got {device}")
        if vllm_config.speculative_config is not None:
            raise NotImplementedError("speculative decoding is not supported by vLLM on neuron")
        GPUModelRunner.__init__(self, vllm_config, device)  # its events are neuron events (torch.Event)
        self.use_cuda_graph = False
        self.schedule_recorder = schedule_recorder.recorder(vllm_config)

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        if self.schedule_recorder is not None:
            self.schedule_recorder.step(scheduler_output)
        return super().execute_model(scheduler_output, intermediate_tensors)

    def _sync_device(self) -> None:
        torch.neuron.synchronize(self.device)

    # The GPU runner's: a non-blocking copy to host memory and a neuron event the host waits on
    # (the CPU runner's version calls tolist() on the tensor where it is).
    _to_list = GPUModelRunner._to_list
