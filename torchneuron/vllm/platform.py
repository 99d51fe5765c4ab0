"""vLLM's platform for neuron: vLLM's CPU platform with the neuron device, memory and worker.

The emulated NeuronCore runs vLLM's CPU kernels on device memory (see
:mod:`torchneuron.vllm.kernels`), so the platform keeps the CPU platform's
choices (attention backend, compilation settings, kernels) and changes what is
about the device: its name and dispatch key, its memory, its random generator,
its process group and the worker that puts the model on ``neuron:N``.
"""

from __future__ import annotations

import logging
import os

import torch
from vllm.platforms.cpu import CpuPlatform

from . import kernels

__all__ = ["NeuronPlatform"]

logger = logging.getLogger("torchneuron")

WORKER = "torchneuron.vllm.worker.NeuronWorker"


class NeuronPlatform(CpuPlatform):
    """vLLM's CPU platform, on the neuron device."""

    device_name: str = "neuron"
    device_type: str = "neuron"
    dispatch_key: str = "PrivateUse1"
    dist_backend: str = "neuron"
    ray_device_key: str = "neuron"
    device_control_env_var: str = "NEURON_RT_VISIBLE_CORES"

    # Asked in the engine's first process, which then forks: read from the runtime without initialising the
    # device (as vLLM's CUDA platform asks NVML), so the forked engine core and workers may still use it.
    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return _device_properties(device_id)["name"]

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return _device_properties(device_id)["total_memory"]

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.neuron.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.neuron.manual_seed_all(seed)

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return float(torch.neuron.memory_allocated(device))

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # torch.distributed on the device group (the ``neuron`` process group), not vLLM's CPU shared memory.
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    @classmethod
    def import_kernels(cls) -> None:
        super().import_kernels()
        kernels.register()

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        """The CPU platform's settings, for the neuron device and its worker.

        The CPU platform's check requires ``device_type == "cpu"``; it runs on a
        copy of that one field set to ``"cpu"``, and the neuron device is put back.
        """
        device_config = vllm_config.device_config
        device_type, device = device_config.device_type, device_config.device
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER
        _split_cores_between_ranks(parallel.world_size)
        device_config.device_type = "cpu"
        try:
            super().check_and_update_config(vllm_config)
        finally:
            device_config.device_type = device_type
            device_config.device = device
        logger.info("vLLM on neuron: worker %s, tensor parallel %d", parallel.worker_cls,
                    parallel.tensor_parallel_size)


def _device_properties(device_id: int) -> dict:
    from torchneuron import _C

    return _C._device_properties(int(device_id))


def _split_cores_between_ranks(world_size: int) -> None:
    """Give each local rank its own share of this process's cores, unless ``VLLM_CPU_OMP_THREADS_BIND`` is set.

    vLLM binds each CPU worker's OpenMP threads to a NUMA node of its own and
    refuses more ranks than nodes; the emulated devices share the host's cores,
    so ranks get contiguous slices of them instead (``"0|1"`` on 2 cores).
    """
    if world_size <= 1 or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < world_size:
        raise ValueError(f"tensor parallel size {world_size} needs at least {world_size} cores for its workers' "
                         f"threads, this process may use {len(cores)}; set VLLM_CPU_OMP_THREADS_BIND to share them")
    share = len(cores) // world_size
    slices = [cores[i * share:(i + 1) * share] for i in range(world_size)]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, s)) for s in slices)
    logger.info("vLLM on neuron: worker threads bound to cores %s", os.environ["VLLM_CPU_OMP_THREADS_BIND"])
