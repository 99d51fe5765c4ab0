"""vLLM's worker on ``neuron:LOCAL_RANK``: the device, its process group and the KV cache's size.

:class:`NeuronWorker` is vLLM's GPU worker (``vllm.v1.worker.gpu_worker.Worker``)
with the CPU worker's choices where the emulated NeuronCore runs vLLM's CPU
kernels, and these differences:

* the device is ``neuron:local_rank`` (``torch.neuron.set_device``), and tensor
  parallel ranks talk through the ``neuron`` process group;
* the memory the worker may use is the device's capacity
  (``TORCHNEURON_DEVICE_MEMORY``) times ``gpu_memory_utilization``, and the KV
  cache gets what the weights and the profiling run left of it (measured with
  ``torch.neuron.memory_allocated``), not a share of host RAM;
* a model or cache that does not fit stops the engine with vLLM's ``ValueError``
  saying what to change, before anything is allocated past the capacity.

It does not derive from vLLM's CPU worker: importing that module replaces
``torch.Event``, ``torch.cuda.Stream``, ``torch.accelerator.synchronize`` and
``Tensor.pin_memory`` by no-ops for the whole process
(``vllm/v1/worker/cpu/shm.py``), which is right for the CPU and wrong for a
device with real events and streams. Nothing here writes the environment:
vLLM's CPU ops that read ``VLLM_DIST_IDENT`` (its shared-memory communicator)
are not used, the ``neuron`` process group carries the collectives.
"""

from __future__ import annotations

import logging

import torch
from vllm.config import CompilationMode
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

from .._units import format_bytes
from . import patches
from .model_runner import NeuronModelRunner

__all__ = ["NeuronWorker"]

logger = logging.getLogger("torchneuron")


class NeuronWorker(Worker):
    """A vLLM worker whose model, KV cache and inputs live on ``neuron:local_rank``."""

    def __init__(self, vllm_config, local_rank: int, rank: int, distributed_init_method: str,
                 is_driver_worker: bool = False) -> None:
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker=is_driver_worker)
        self.parallel_config.disable_custom_all_reduce = True
        count = torch.neuron.device_count()
        if local_rank >= count:
            raise ValueError(f"vLLM worker {rank} needs neuron:{local_rank}, but there are {count} neuron "
                             f"device(s) (TORCHNEURON_NUM_DEVICES); lower tensor_parallel_size")
        self.capacity = torch.neuron.get_device_properties(local_rank).total_memory
        utilization = self.cache_config.gpu_memory_utilization
        self.requested_memory = int(self.capacity * utilization)

    def init_device(self) -> None:
        self.device = torch.device("neuron", self.local_rank)
        torch.neuron.set_device(self.device)
        from vllm.platforms import current_platform

        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        patches.apply()
        self._patched = True
        self.model_runner = NeuronModelRunner(self.vllm_config, self.device)

    def load_model(self, *args, **kwargs) -> None:
        try:
            super().load_model(*args, **kwargs)
        except torch.OutOfMemoryError as e:
            index = self.device.index
            raise ValueError(
                f"The model's weights do not fit in neuron:{index} ({format_bytes(self.capacity)}, "
                f"TORCHNEURON_DEVICE_MEMORY): {e}. Raise TORCHNEURON_DEVICE_MEMORY, use a smaller model or dtype, "
                f"or tensor_parallel_size > 1 (gpu_memory_utilization={self.cache_config.gpu_memory_utilization} "
                f"then leaves room for the KV cache).") from e

    def _should_warm_up_model(self) -> bool:
        """A warm-up run compiles the model; in eager mode it only measures memory, which the KV cache
        needs unless its size is given (as vLLM's CPU worker decides)."""
        return not (self.compilation_config.mode == CompilationMode.NONE
                    and self.cache_config.kv_cache_memory_bytes is not None)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        """The model was compiled by :meth:`determine_available_memory`'s warm-up run (a model without a KV
        cache is compiled here); no CUDA graphs are captured. The seed is set again after the warm-up."""
        if not self.model_runner.kv_caches and self._should_warm_up_model():
            self.model_runner.warming_up_model()
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(language_model=self.compilation_config.compilation_time,
                                encoder=self.compilation_config.encoder_compilation_time)

    def sleep(self, level: int = 1) -> None:
        raise NotImplementedError("vLLM's sleep mode is not supported on neuron")

    def wake_up(self, tags=None) -> None:
        raise NotImplementedError("vLLM's sleep mode is not supported on neuron")

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: the device's share for vLLM less what the model and a profiling run hold."""
        if self._should_warm_up_model():
            self.model_runner.warming_up_model()
        index = self.device.index
        used = torch.neuron.max_memory_allocated(index)
        free, _ = torch.neuron.mem_get_info(index)
        utilization = self.cache_config.gpu_memory_utilization
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            if explicit > free:
                raise ValueError(
                    f"neuron:{index} has {format_bytes(free)} free of {format_bytes(self.capacity)}, less than "
                    f"the {format_bytes(explicit)} asked for the KV cache (kv_cache_memory_bytes). Lower "
                    f"kv_cache_memory_bytes, or raise TORCHNEURON_DEVICE_MEMORY.")
            logger.info("neuron:%d: KV cache %s (set explicitly)", index, format_bytes(explicit))
            return explicit
        available = self.requested_memory - used
        if available <= 0:
            raise ValueError(
                f"The model needs {format_bytes(used)} on neuron:{index}, more than the "
                f"{format_bytes(self.requested_memory)} that gpu_memory_utilization={utilization} allows of its "
                f"{format_bytes(self.capacity)}, leaving nothing for the KV cache. Raise "
                f"gpu_memory_utilization or TORCHNEURON_DEVICE_MEMORY, or use a smaller model or "
                f"tensor_parallel_size > 1.")
        logger.info("neuron:%d: KV cache %s (%s x %.2f, less %s for the model and activations)",
                    index, format_bytes(available), format_bytes(self.capacity), utilization, format_bytes(used))
        return available

    def device_memory(self) -> dict:
        """The worker's device, its capacity, what is allocated there, its tensor-parallel group's backend and
        the device of the event the runner waits on for sampled tokens.

        For ``LLM.collective_rpc("device_memory")``.
        """
        from vllm.distributed.parallel_state import get_tp_group

        backend = torch.distributed.get_backend(get_tp_group().device_group)
        return {"tp_backend": str(backend), "device": str(self.device), "capacity": self.capacity,
                "allocated": torch.neuron.memory_allocated(self.device),
                "event_device": str(getattr(self.model_runner.transfer_event, "device", None)),
                "kv_cache_bytes": sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                                       for t in _tensors(self.model_runner.kv_caches)}.values())}

    def shutdown(self) -> None:
        try:
            recorder = getattr(getattr(self, "model_runner", None), "schedule_recorder", None)
            if recorder is not None:
                recorder.close()
            super().shutdown()
        finally:
            if getattr(self, "_patched", False):
                self._patched = False
                patches.undo()


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
