//! A faithful model of PyTorch's CUDA caching allocator (placeholder; being written).
