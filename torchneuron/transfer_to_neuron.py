"""``import torchneuron.transfer_to_neuron``: run a CUDA-written program on neuron unchanged.

Importing this module turns on the CUDA compatibility layer
(:mod:`torchneuron.migrate.cuda_compat`): ``"cuda"`` devices, ``.cuda()``,
``torch.cuda.*``, ``torch.cuda.amp`` and ``"nccl"`` then mean the neuron device.
``torchneuron.migrate.cuda_compat.disable()`` turns it off again.

Example::

    import torch
    import torchneuron.transfer_to_neuron  # noqa: F401

    model = MyModel().cuda()                      # on neuron:0
    with torch.cuda.amp.autocast():               # autocast on neuron, float16
        loss = model(x.cuda()).sum()
"""

from torchneuron.migrate import cuda_compat

cuda_compat.enable()
