"""Collectives on neuron tensors: the c10d operators' kernels for the neuron device.

Every road into a communication backend goes through the c10d operators
(``c10d::allreduce_``, ``c10d::_allgather_base_``, ...): ``torch.distributed``'s
functions, ``ProcessGroup`` methods called from C++ (DDP's reducer,
``_broadcast_coalesced``), functional collectives (DTensor) and FSDP2. The
dispatcher picks their kernel by the tensors' device, and for neuron tensors
(PrivateUse1) the kernels here run the collective with the gloo backend the
process group holds for the neuron device, on ``_C._cpu_view`` of each tensor:
a CPU tensor over the same memory. Gloo reads and writes device memory
directly; nothing is staged through host copies.

PyTorch's own PrivateUse1 kernels pass neuron tensors to the backend unchanged;
these replace them (a registration for our own dispatch key, done once, see
:func:`register_kernels`). If the backend registered for the neuron device is
not gloo, the tensors are passed through unchanged as before.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ProcessGroup,
    ProcessGroupGloo,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Work,
    _ProcessGroupWrapper,
)

from .. import _C
from .work import NeuronWork, run_to_end

__all__ = ["register_kernels", "KERNELS"]

_NEURON = torch.device("neuron")
_PREMUL_SUM = int(ReduceOp.RedOpType.PREMUL_SUM)
_REDUCE_OPS = {int(v): ReduceOp(v) for v in ReduceOp.RedOpType.__members__.values() if int(v) != _PREMUL_SUM}
_cpu_view = _C._cpu_view
_sync = _C._synchronize


class _Call:
    """One collective call: the group's neuron backend, and how tensors and work cross to it."""

    __slots__ = ("pg", "backend", "gloo", "what")

    def __init__(self, pg_obj: Any, what: str):
        self.pg = ProcessGroup.unbox(pg_obj) if isinstance(pg_obj, torch.ScriptObject) else pg_obj
        self.backend = self.pg._get_backend(_NEURON)
        # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps the backend in a checker that forwards to gloo.
        self.gloo = isinstance(self.backend, ProcessGroupGloo) or (
            isinstance(self.backend, _ProcessGroupWrapper) and isinstance(self.backend.wrapped_pg, ProcessGroupGloo))
        self.what = what

    def host(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors as gloo takes them: a CPU view of each neuron tensor (CPU tensors as they are)."""
        if not self.gloo:
            return list(tensors)
        out = []
        synced = -1
        for t in tensors:
            index = t.get_device()  # -1 on the CPU; cheaper than t.device
            if index < 0:
                out.append(t)
                continue
            if index != synced:  # work queued on the device must have written the memory first
                _sync(index)
                synced = index
            out.append(_cpu_view(t))
        return out

    def host_lists(self, lists: Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor]]:
        return [self.host(ts) for ts in lists]

    def done(self, works: Work | Sequence[Work], outputs: Sequence[torch.Tensor], async_op: bool = True,
             source: bool = False) -> Any:
        """The boxed work handle to return for gloo's ``works``, whose results are the neuron ``outputs``.

        With ``async_op=False`` the caller waits right away, so the collective is finished here, where
        its error can be raised; otherwise an in-flight :class:`NeuronWork` is returned.
        """
        works = [works] if isinstance(works, Work) else list(works)
        if not self.gloo:  # another backend took the neuron tensors as they are
            for w in works[:-1]:
                w.wait()
            return Work.boxed(works[-1])
        if not async_op:
            # The caller only waits on it: gloo's own (finished) work will do, and costs nothing.
            run_to_end(works, self.what, self.pg)
            return Work.boxed(works[-1])
        return Work.boxed(NeuronWork(works, outputs, self.what, self.pg.rank(), self.pg.size(),
                                     works[0] if source else None))


def _options(opts: Any, async_op: bool, timeout: int) -> Any:
    opts.asyncOp = async_op
    if timeout >= 0:
        opts.timeout = timedelta(milliseconds=timeout)
    return opts


def _reduce_op(op_obj: Any) -> ReduceOp:
    op = op_obj.op() if isinstance(op_obj, torch.ScriptObject) else int(op_obj.op)
    if op == _PREMUL_SUM:
        # c10d hands a backend the PREMUL_SUM factor only in C++; gloo has no PREMUL_SUM either.
        raise ValueError("ReduceOp.PREMUL_SUM is not supported by the neuron backend (nor by gloo): "
                         "multiply the tensor by the factor and use ReduceOp.SUM")
    return _REDUCE_OPS[op]


def _flat(lists: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    return [t for ts in lists for t in ts]


# ---- the kernels: schemas as in torch/csrc/distributed/c10d/Ops.cpp ---------------------------------

def broadcast_(tensors, process_group, root_rank, root_tensor, async_op=True, timeout=-1):
    c = _Call(process_group, "broadcast")
    opts = _options(BroadcastOptions(), async_op, timeout)
    opts.rootRank, opts.rootTensor = root_rank, root_tensor
    return tensors, c.done(c.backend.broadcast(c.host(tensors), opts), tensors, async_op)


def allreduce_(tensors, process_group, reduce_op, sparse_indices=None, async_op=True, timeout=-1):
    c = _Call(process_group, "all_reduce")
    opts = _options(AllreduceOptions(), async_op, timeout)
    opts.reduceOp = _reduce_op(reduce_op)
    return tensors, c.done(c.backend.allreduce(c.host(tensors), opts), tensors, async_op)


def allreduce_coalesced_(tensors, process_group, reduce_op, async_op=True, timeout=-1):
    c = _Call(process_group, "all_reduce_coalesced")
    opts = _options(AllreduceCoalescedOptions(), async_op, timeout)
    opts.reduceOp = _reduce_op(reduce_op)
    return c.done(c.backend.allreduce_coalesced(c.host(tensors), opts), tensors, async_op)


def allgather_(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    c = _Call(process_group, "all_gather")
    opts = _options(AllgatherOptions(), async_op, timeout)
    work = c.backend.allgather(c.host_lists(output_tensors), c.host(input_tensors), opts)
    return output_tensors, c.done(work, _flat(output_tensors), async_op)


def _allgather_base_(output_tensor, input_tensor, process_group, async_op=True, timeout=-1):
    c = _Call(process_group, "all_gather_into_tensor")
    opts = _options(AllgatherOptions(), async_op, timeout)
    out, inp = c.host([output_tensor, input_tensor])
    return output_tensor, c.done(c.backend._allgather_base(out, inp, opts), [output_tensor], async_op)


def allgather_coalesced_(output_lists, input_list, process_group, async_op=True):
    c = _Call(process_group, "all_gather_coalesced")
    opts = _options(AllgatherOptions(), async_op, -1)
    work = c.backend.allgather_coalesced(c.host_lists(output_lists), c.host(input_list), opts)
    return c.done(work, _flat(output_lists), async_op)


def allgather_into_tensor_coalesced_(outputs, inputs, process_group, async_op=True):
    # The Python binding of a backend has no allgather_into_tensor_coalesced: one gloo work per pair.
    c = _Call(process_group, "all_gather_into_tensor_coalesced")
    opts = _options(AllgatherOptions(), async_op, -1)
    works = [c.backend._allgather_base(o, i, opts) for o, i in zip(c.host(outputs), c.host(inputs))]
    return c.done(works, outputs, async_op)


def reduce_scatter_(output_tensors, input_tensors, process_group, reduce_op, async_op=True, timeout=-1):
    c = _Call(process_group, "reduce_scatter")
    opts = _options(ReduceScatterOptions(), async_op, timeout)
    opts.reduceOp = _reduce_op(reduce_op)
    work = c.backend.reduce_scatter(c.host(output_tensors), c.host_lists(input_tensors), opts)
    return output_tensors, c.done(work, output_tensors, async_op)


def _reduce_scatter_base_(output_tensor, input_tensor, process_group, reduce_op, async_op=True, timeout=-1):
    c = _Call(process_group, "reduce_scatter_tensor")
    opts = _options(ReduceScatterOptions(), async_op, timeout)
    opts.reduceOp = _reduce_op(reduce_op)
    out, inp = c.host([output_tensor, input_tensor])
    return output_tensor, c.done(c.backend._reduce_scatter_base(out, inp, opts), [output_tensor], async_op)


def reduce_scatter_tensor_coalesced_(outputs, inputs, process_group, reduce_op, async_op=True, timeout=-1):
    c = _Call(process_group, "reduce_scatter_tensor_coalesced")
    opts = _options(ReduceScatterOptions(), async_op, timeout)
    opts.reduceOp = _reduce_op(reduce_op)
    works = [c.backend._reduce_scatter_base(o, i, opts) for o, i in zip(c.host(outputs), c.host(inputs))]
    return c.done(works, outputs, async_op)


def reduce_(tensors, process_group, reduce_op, root_rank, root_tensor, async_op=True, timeout=-1):
    c = _Call(process_group, "reduce")
    opts = _options(ReduceOptions(), async_op, timeout)
    opts.reduceOp = _reduce_op(reduce_op)
    opts.rootRank, opts.rootTensor = root_rank, root_tensor
    return c.done(c.backend.reduce(c.host(tensors), opts), tensors, async_op)


def gather_(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    c = _Call(process_group, "gather")
    opts = _options(GatherOptions(), async_op, timeout)
    opts.rootRank = root_rank
    work = c.backend.gather(c.host_lists(output_tensors), c.host(input_tensors), opts)
    return c.done(work, _flat(output_tensors), async_op)


def scatter_(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    c = _Call(process_group, "scatter")
    opts = _options(ScatterOptions(), async_op, timeout)
    opts.rootRank = root_rank
    work = c.backend.scatter(c.host(output_tensors), c.host_lists(input_tensors), opts)
    return output_tensors, c.done(work, output_tensors, async_op)


def alltoall_(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    c = _Call(process_group, "all_to_all")
    opts = _options(AllToAllOptions(), async_op, timeout)
    work = c.backend.alltoall(c.host(output_tensors), c.host(input_tensors), opts)
    return output_tensors, c.done(work, output_tensors, async_op)


def alltoall_base_(output, input, process_group, output_split_sizes, input_split_sizes, async_op=True,
                   timeout=-1):
    c = _Call(process_group, "all_to_all_single")
    opts = _options(AllToAllOptions(), async_op, timeout)
    out, inp = c.host([output, input])
    work = c.backend.alltoall_base(out, inp, list(output_split_sizes), list(input_split_sizes), opts)
    return c.done(work, [output], async_op)


def barrier(tensor, process_group, device_ids, async_op=True, timeout=-1):
    c = _Call(process_group, "barrier")
    opts = _options(BarrierOptions(), async_op, timeout)
    opts.device_ids = list(device_ids)
    return c.done(c.backend.barrier(opts), [], async_op)


def send(tensors, process_group, dst, tag):
    c = _Call(process_group, "send")
    return c.done(c.backend.send(c.host(tensors), dst, tag), tensors)


def recv_(tensors, process_group, src, tag):
    c = _Call(process_group, "recv")
    return c.done(c.backend.recv(c.host(tensors), src, tag), tensors)


def recv_any_source_(tensors, process_group, tag):
    # recv(src=None) asks the work for the sender's rank: NeuronWork asks gloo's work.
    c = _Call(process_group, "recv")
    return c.done(c.backend.recv_anysource(c.host(tensors), tag), tensors, source=True)


KERNELS: dict[str, Callable[..., Any]] = {
    "broadcast_": broadcast_,
    "allreduce_": allreduce_,
    "allreduce_coalesced_": allreduce_coalesced_,
    "allgather_": allgather_,
    "_allgather_base_": _allgather_base_,
    "allgather_coalesced_": allgather_coalesced_,
    "allgather_into_tensor_coalesced_": allgather_into_tensor_coalesced_,
    "reduce_scatter_": reduce_scatter_,
    "_reduce_scatter_base_": _reduce_scatter_base_,
    "reduce_scatter_tensor_coalesced_": reduce_scatter_tensor_coalesced_,
    "reduce_": reduce_,
    "gather_": gather_,
    "scatter_": scatter_,
    "alltoall_": alltoall_,
    "alltoall_base_": alltoall_base_,
    "barrier": barrier,
    "send": send,
    "recv_": recv_,
    "recv_any_source_": recv_any_source_,
}
"""c10d operator name -> its neuron kernel."""

_library: Optional[torch.library.Library] = None


def register_kernels() -> None:
    """Register the neuron kernels of the c10d operators (once per process)."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        # PyTorch registers a generic PrivateUse1 kernel for each; replacing it is the point.
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
        for name, kernel in KERNELS.items():
            library.impl(name, kernel, "PrivateUse1")
    _library = library
