"""Things people look at that are not the device: viewers of the files a run wrote.

They read those files and use nothing of the device (no :mod:`torchneuron.neuron`, no
``torchneuron._C``), so a page can be made on any machine from a file copied off another.

* :mod:`torchneuron.tools.traceviz`: a Chrome trace (``torch.profiler``'s export) as a
  self-contained HTML timeline (``torchneuron traceviz``).
* :mod:`torchneuron.tools.memviz`: a memory snapshot (``torch.neuron.memory._dump_snapshot``)
  as a self-contained HTML page (``torchneuron memviz``).
"""
