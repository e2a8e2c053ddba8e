"""The project's own kernels: pure functions on tensors, with no registry knowledge."""
