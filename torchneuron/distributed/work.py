"""Work handles of neuron collectives: gloo's work, seen from the device.

Gloo runs a collective on CPU views of the device memory, so its work's future
holds those views. The handles given back here complete with the neuron
tensors instead (DDP's reducer and communication hooks read the future's
value and must get device tensors back, without copies), and turn gloo's
failures, a peer that died or a timeout, into an error that says which
collective failed where and what to look at.

With ``async_op=False`` (the common case) a collective runs to its end inside
the kernel (:func:`run_to_end`, which raises its error), and gloo's finished
work is handed back. Otherwise the handle is a :class:`NeuronWork`: ``wait()``
blocks until the collective ends and raises its error, ``get_future()``
completes with the neuron tensors, ``wait(timeout)`` gives up after
``timeout``.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work

__all__ = ["CollectiveError", "NeuronWork", "describe_failure", "live_count", "run_to_end"]

CollectiveError = dist.DistBackendError

_PEER_GONE = ("closed by peer", "Connection reset", "Broken pipe", "Connection refused", "EOF", "read error")
_TIMED_OUT = ("Timed out", "timed out", "Timeout", "timeout")

# In-flight handles that C++ (DDP's reducer, functional collectives) may still call into. pybind
# forwards a C++ call to a Python override only while the Python object lives, so each handle is
# kept here until it has been waited on, or its future has been handed out and has completed.
_LIVE: set["NeuronWork"] = set()
_LIVE_LOCK = threading.Lock()


def describe_failure(what: str, rank: int, size: int, error: BaseException) -> str:
    """Return the message of a failed collective: which one, on which rank, why, and what to check."""
    text = str(error).strip()
    msg = text.splitlines()[0] if text else type(error).__name__
    out = f"neuron backend: {what} failed on rank {rank} of {size}: {msg}"
    if any(s in msg for s in _PEER_GONE):
        out += (" [another rank closed its connection, most likely because its process exited or crashed; "
                "its own log has the first error]")
    elif any(s in msg for s in _TIMED_OUT):
        out += (" [not every rank reached this collective within the process group's timeout "
                "(init_process_group(timeout=...)): a rank may have died or hung, or the ranks are running "
                "different collectives]")
    return out


def _error(what: str, rank: int, size: int, error: BaseException) -> CollectiveError:
    if isinstance(error, CollectiveError) and str(error).startswith("neuron backend:"):
        return error
    err = CollectiveError(describe_failure(what, rank, size, error))
    err.__cause__ = error
    return err


def run_to_end(works: Sequence[Work], what: str, group: "dist.ProcessGroup") -> None:
    """Wait for gloo's ``works`` in the calling thread; raise a :data:`CollectiveError` if one failed."""
    try:
        for w in works:
            w.wait()
    except Exception as e:
        raise _error(what, group.rank(), group.size(), e) from e


class NeuronWork(Work):
    """A collective in flight on neuron tensors.

    Args:
        works: gloo's work(s) on the CPU views.
        outputs: the neuron tensors the collective writes; the future's value.
        what: name of the collective, for error messages.
        rank: this process's rank in the group.
        size: the group's size.
        source: gloo's work whose ``source_rank()`` to report (``recv`` from any source).
    """

    def __init__(self, works: Sequence[Work], outputs: Sequence[torch.Tensor], what: str, rank: int, size: int,
                 source: Optional[Work] = None):
        super().__init__()
        self._works = list(works)
        self._outputs = list(outputs)
        self._what, self._rank, self._size = what, rank, size
        self._source = source
        self._error: Optional[CollectiveError] = None
        self._done = threading.Event()
        self._future_taken = False
        try:
            futures = [w.get_future() for w in self._works]
        except RuntimeError:  # some of gloo's works (reduce_scatter, all_to_all) have no future
            futures = None
        self._future: Optional[torch.futures.Future] = None
        with _LIVE_LOCK:
            _LIVE.add(self)
        if futures is not None:
            joined = futures[0] if len(futures) == 1 else torch.futures.collect_all(futures)
            self._future = joined.then(self._finish)
            self._future.add_done_callback(self._completed)

    # -- completion, on gloo's thread --------------------------------------------------------------
    def _finish(self, joined: torch.futures.Future) -> list[torch.Tensor]:
        try:
            value = joined.wait()
            if len(self._works) > 1:
                for f in value:
                    f.wait()
        except Exception as e:  # gloo's error: a peer died, a timeout, a bad argument
            self._error = _error(self._what, self._rank, self._size, e)
            raise self._error from e
        return self._outputs

    def _completed(self, _: torch.futures.Future) -> None:
        self._done.set()
        if self._future_taken:
            self._release()

    def _release(self) -> None:
        with _LIVE_LOCK:
            _LIVE.discard(self)

    # -- the Work interface --------------------------------------------------------------------------
    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until the collective ended; raise its error, or one if ``timeout`` (when > 0) passed."""
        seconds = timeout.total_seconds() if timeout is not None else 0.0
        if self._future is None:
            try:
                for w in self._works:
                    w.wait(timeout) if seconds > 0 else w.wait()
            except Exception as e:
                self._error = _error(self._what, self._rank, self._size, e)
                self._done.set()
                self._release()
                raise self._error from e
            self._done.set()
        elif not self._done.wait(seconds if seconds > 0 else None):
            raise CollectiveError(f"neuron backend: {self._what} on rank {self._rank} of {self._size} did not "
                                  f"finish within {timeout}")
        self._release()
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        """A future that completes with the neuron output tensors (or the collective's error)."""
        if self._future is None:  # gloo gave no future: one completes when a helper thread has waited
            future: torch.futures.Future = torch.futures.Future()

            def finish() -> None:
                try:
                    self.wait()
                    future.set_result(self._outputs)
                except Exception as e:
                    future.set_exception(e)

            threading.Thread(target=finish, name="neuron-work", daemon=True).start()
            self._future = future
        self._future_taken = True
        if self._done.is_set():
            self._release()
        return self._future

    def is_completed(self) -> bool:
        if self._future is None and not self._done.is_set():
            return all(w.is_completed() for w in self._works)
        return self._done.is_set()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return list(self._outputs)

    def source_rank(self) -> int:
        if self._source is None:
            raise ValueError(f"source_rank() is only defined for a recv from any source, not for {self._what}")
        return self._source._source_rank()

    def _source_rank(self) -> int:
        return self.source_rank()

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else ("done" if self._done.is_set() else "in flight")
        return f"NeuronWork({self._what}, rank {self._rank} of {self._size}, {state})"


def live_count() -> int:
    """Number of in-flight handles kept alive for C++ callers (for tests)."""
    return len(_LIVE)

