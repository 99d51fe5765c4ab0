"""Bug: a data prefetcher copies the next batch on a side stream; the loop uses it without waiting."""
import torch


class Prefetcher:
    def __init__(self, batches):
        self.batches = iter(batches)
        self.stream = torch.neuron.Stream()
        self.preload()

    def preload(self):
        self.next = next(self.batches, None)
        if self.next is None:
            return
        with torch.neuron.stream(self.stream):
            self.next = self.next.pin_memory().to("neuron", non_blocking=True)

    def get(self):
        batch = self.next  # no torch.neuron.current_stream().wait_stream(self.stream)
        if batch is not None:
            batch.record_stream(torch.neuron.current_stream())
        self.preload()
        return batch


model = torch.nn.Linear(32, 4).to("neuron")
loader = Prefetcher([torch.randn(8, 32) for _ in range(3)])
total = 0.0
while (batch := loader.get()) is not None:
    total += model(batch).sum().item()  # BUG: reads the batch before the copy stream has written it
print(total)
