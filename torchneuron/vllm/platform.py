"""vLLM's platform for neuron: a vLLM ``Platform`` for the neuron device, its memory and its worker.

The emulated NeuronCore runs vLLM's CPU kernels on device memory (see
:mod:`torchneuron.vllm.kernels`), so the platform derives from vLLM's CPU
platform for what is about those kernels: ``is_cpu()`` (vLLM picks its CPU
kernels, attention backend and sampler by it), the attention backend, the
kernel library, the supported dtypes. Everything about the device is its own:
its name, type and dispatch key, its memory, its random generator, its process
group, its configuration (:meth:`NeuronPlatform.check_and_update_config`, which
does not run the CPU platform's: that one asserts the device is the CPU and
writes the process environment) and the worker that puts the model on
``neuron:N``. No hook here writes the environment.
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
        """vLLM's settings for the neuron device, each for a reason of its own.

        The CPU platform's own check is not called: it ends by asserting that the
        device is the CPU and then writes the process environment (the worker start
        method, ``LD_PRELOAD``...). What the emulated NeuronCore shares with the CPU
        (its kernels, hence its attention backend and block size) is set here.
        """
        from vllm import envs
        from vllm.config import CompilationMode

        cache, scheduler = vllm_config.cache_config, vllm_config.scheduler_config
        parallel, compilation = vllm_config.parallel_config, vllm_config.compilation_config
        model = vllm_config.model_config
        if model is not None and model.use_mla:
            raise NotImplementedError("vLLM on neuron: multi-head latent attention (MLA) models are not supported")
        if vllm_config.speculative_config is not None:
            raise NotImplementedError("vLLM on neuron: speculative decoding is not supported")
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER
        # vLLM binds a worker's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND) when it starts the worker's process.
        if envs.VLLM_ENABLE_V1_MULTIPROCESSING and parallel.distributed_executor_backend == "uni":
            parallel.distributed_executor_backend = "mp"
        _check_thread_binding(parallel.world_size)
        # vLLM's CPU attention backend (get_attn_backend_cls) prefers blocks of a multiple of 32 tokens.
        if not cache.user_specified_block_size:
            cache.block_size = 128
        # No CUDA graphs; the runner's copies and its events follow one stream (no async scheduling, no
        # dual-batch overlap).
        scheduler.async_scheduling = False
        parallel.enable_dbo = False
        compilation.cudagraph_capture_sizes = []
        if vllm_config.lora_config is not None:
            compilation.mode = CompilationMode.NONE
        elif compilation.mode == CompilationMode.VLLM_COMPILE:
            # vLLM's piecewise compilation splits graphs around attention for CUDA graphs; neuron compiles the
            # whole graph once with Inductor (torchneuron.compile.inductor), in the worker's own process
            # (compile_threads=1: the worker is a daemon process and may not start a compile pool).
            compilation.mode = CompilationMode.DYNAMO_TRACE_ONCE
            compilation.backend = "inductor"
            compilation.inductor_compile_config.update({"dce": True, "size_asserts": False, "nan_asserts": False,
                                                        "epilogue_fusion": True, "cpp.dynamic_threads": True,
                                                        "compile_threads": 1})
            compilation.ir_enable_torch_wrap = False
        vllm_config.profiler_config.torch_profiler_dump_cuda_time_total = False
        logger.info("vLLM on neuron: worker %s, tensor parallel %d", parallel.worker_cls,
                    parallel.tensor_parallel_size)


def _device_properties(device_id: int) -> dict:
    from torchneuron import _C

    return _C._device_properties(int(device_id))


def _check_thread_binding(world_size: int) -> None:
    """Stop early when vLLM could not bind the workers' threads, saying which setting to give.

    vLLM binds each local rank's OpenMP threads to a NUMA node of its own
    (``VLLM_CPU_OMP_THREADS_BIND=auto``) and refuses more ranks than nodes; the
    emulated devices share the host's cores, so on such a host the ranks need
    explicit slices of them, given before the engine starts (vLLM reads the
    variable when it starts the workers), e.g. ``VLLM_CPU_OMP_THREADS_BIND=0|1``.
    """
    from vllm import envs
    from vllm.utils.cpu_resource_utils import get_visible_memory_node

    if world_size <= 1 or envs.VLLM_CPU_OMP_THREADS_BIND != "auto" or \
            os.environ.get("VLLM_CPU_SIM_MULTI_NUMA", "0") != "0":
        return
    nodes = len(get_visible_memory_node())
    if nodes >= world_size:
        return
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // world_size)
    slices = "|".join(",".join(map(str, cores[i * share:(i + 1) * share])) for i in range(world_size))
    raise ValueError(f"tensor parallel size {world_size} on a host with {nodes} NUMA node(s): vLLM binds each "
                     f"rank's threads to a node of its own. Give each rank its cores before starting the engine, "
                     f"e.g. VLLM_CPU_OMP_THREADS_BIND='{slices}' ({len(cores)} cores here), or "
                     f"VLLM_CPU_OMP_THREADS_BIND=nobind")
