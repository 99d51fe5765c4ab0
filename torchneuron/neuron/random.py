"""Random number generators of neuron devices, one per device.

Each is a seed and an offset into a Philox 4x32-10 stream, like CUDA's, and its
state is CUDA's 16 bytes: the seed (uint64), then the offset (uint64). A random
op draws element i from offset + i and moves the offset on by its element count
rounded up to 4, so code that moves the offset itself (DTensor's random-op
tracker) gives each shard its own part of the stream.

As ``torch.cuda``'s, the calls that read a generator initialise the devices,
and those that only set one (seeding, ``set_rng_state``) wait until the
devices are initialised when they are not yet (``torch.manual_seed`` at the
top of a program leaves them alone, so it may still fork).
"""

from typing import Any, Iterable

import torch

from .. import _C
from ._lazy import _lazy_call, _lazy_init
from ._utils import _get_device_index

__all__ = [
    "default_generators", "get_rng_state", "get_rng_state_all", "initial_seed", "manual_seed",
    "manual_seed_all", "seed", "seed_all", "set_rng_state", "set_rng_state_all",
]

#: The default ``torch.Generator`` of each neuron device.
default_generators: tuple[torch.Generator, ...] = tuple(
    _C._default_generator(i) for i in range(_C._device_count())
)


def _generator(device: Any = None) -> torch.Generator:
    return default_generators[_get_device_index(device)]


def _get_generator(device: torch.device) -> torch.Generator:
    """Return the default generator of a neuron device (the current one when it has no index)."""
    return _generator(device)


def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    """Return the random number generator state of a device as a CPU ByteTensor.

    Args:
        device: the device (default: the current one).
    """
    _lazy_init()
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    """Return the random number generator state of every device."""
    _lazy_init()
    return [g.get_state() for g in default_generators]


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    """Set the random number generator state of a device.

    Args:
        new_state: a state returned by :func:`get_rng_state`.
        device: the device (default: the current one).
    """
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError(f"RNG state must be a torch.ByteTensor, but got {type(new_state).__name__}"
                        + (f" of dtype {new_state.dtype}" if isinstance(new_state, torch.Tensor) else ""))
    with torch.no_grad():
        state = new_state.detach().to("cpu", copy=True).contiguous()
    generator = _generator(device)
    _lazy_call(lambda: generator.set_state(state))


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Set the random number generator state of every device."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seed the random number generator of the current device.

    Args:
        seed: the seed.
    """
    seed = int(seed)
    generator = _generator()
    _lazy_call(lambda: generator.manual_seed(seed), seed=True)


def manual_seed_all(seed: int) -> None:
    """Seed the random number generators of every device.

    Args:
        seed: the seed.
    """
    seed = int(seed)

    def seed_all_devices() -> None:
        for g in default_generators:
            g.manual_seed(seed)

    _lazy_call(seed_all_devices, seed_all=True)


def seed() -> None:
    """Seed the current device's generator with a random number."""
    generator = _generator()
    _lazy_call(generator.seed)


def seed_all() -> None:
    """Seed every device's generator with one random number."""

    def seed_all_devices() -> None:
        s = default_generators[0].seed() if default_generators else 0
        for g in default_generators[1:]:
            g.manual_seed(s)

    _lazy_call(seed_all_devices)


def initial_seed() -> int:
    """Return the seed of the current device's generator."""
    _lazy_init()
    return _generator().initial_seed()
