"""vLLM's model runner on a neuron device.

vLLM's CPU model runner is its GPU model runner with every device buffer made
the same tensor as its host buffer. On neuron the two stay apart, as on a GPU:
inputs are prepared in host memory and copied to the device, the model and the
KV cache live in device memory, and results come back with an explicit copy.
When ``TORCHNEURON_VLLM_SCHEDULE`` is set, each engine step's schedule is recorded on the way in
(:mod:`torchneuron.vllm.schedule`).
"""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner, _torch_cuda_wrapper
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from . import schedule

__all__ = ["NeuronModelRunner"]


class NeuronModelRunner(CPUModelRunner):
    """vLLM's CPU model runner with its device buffers on ``device`` (a neuron device)."""

    def __init__(self, vllm_config, device: torch.device) -> None:
        if device.type != "neuron":
            raise ValueError(f"NeuronModelRunner runs on a neuron device, got {device}")
        # The GPU runner's CUDA streams and events have no meaning here (vLLM's CPU runner does the same).
        with _torch_cuda_wrapper():
            GPUModelRunner.__init__(self, vllm_config, device)
        self.use_cuda_graph = False
        self.schedule_recorder = schedule.recorder(vllm_config)

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        if self.schedule_recorder is not None:
            self.schedule_recorder.step(scheduler_output)
        return super().execute_model(scheduler_output, intermediate_tensors)

    def _sync_device(self) -> None:
        torch.neuron.synchronize(self.device)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.cpu().tolist()
