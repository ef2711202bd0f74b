//! Analyses of PyTorch memory snapshots (placeholder; being written).
