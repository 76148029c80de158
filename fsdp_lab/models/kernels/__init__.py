"""Triton kernels for the elementwise work of eager transformer blocks on a GPU (rotary, SwiGLU).

Each replaces several of PyTorch's elementwise kernels, each of which reads and writes whole
activations, by one pass, and computes what they compute (the rotary bit for bit; SwiGLU as the
GPU's own kernels compute it). Where one cannot run (no GPU, no Triton, a DTensor, inside
torch.compile, whose inductor fuses the PyTorch form itself) the block takes PyTorch's ops."""
