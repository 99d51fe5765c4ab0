"""Benchmarks comparing the neuron device with native PyTorch CPU in one process."""
