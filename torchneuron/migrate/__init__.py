"""Moving CUDA-written programs to neuron.

- :mod:`torchneuron.migrate.cuda_compat`: the CUDA compatibility layer, which makes
  CUDA-written code run on neuron unchanged (``import torchneuron.transfer_to_neuron``).
- :mod:`torchneuron.migrate.rewrite`: rewrites CUDA-specific code into device-agnostic
  code (``torchneuron migrate``).
- :mod:`torchneuron.migrate.doctor`: runs a program on neuron and reports what it
  does there: ops, host-device syncs, copies, memory, graph breaks (``torchneuron doctor``).
- :mod:`torchneuron.migrate.parity`: runs a program on the CPU and on neuron and
  compares their losses (``torchneuron parity``).
- :mod:`torchneuron.migrate.runner` runs a program in-process and records its losses;
  :mod:`torchneuron.migrate.host_rng` makes neuron ops draw from the CPU generator.

Nothing is imported here, so ``import torchneuron.migrate`` costs nothing and
patches nothing.
"""
