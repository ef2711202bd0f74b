//! [`PyTorchCaching`]: the caching allocator model of this crate behind [`Policy`].

use super::{DriverCalls, Policy, PolicyOom, UnknownBlock};
use crate::device::{DeviceMemory, SimulatedDevice};
use crate::{Addr, AllocatorConfig, CachingAllocator, InvariantError, StreamId};

/// PyTorch's CUDA caching allocator under a `PYTORCH_CUDA_ALLOC_CONF` (default pools;
/// expandable segments when the configuration says so).
pub struct PyTorchCaching<D: DeviceMemory = SimulatedDevice> {
    eng: CachingAllocator<D>,
    name: String,
}

impl<D: DeviceMemory> PyTorchCaching<D> {
    pub fn new(cfg: AllocatorConfig, dev: D) -> Self {
        let conf = cfg.to_conf_string();
        let name = if conf.is_empty() { "pytorch".to_string() } else { format!("pytorch:{conf}") };
        PyTorchCaching { eng: CachingAllocator::new(cfg, dev), name }
    }
}

impl<D: DeviceMemory> Policy for PyTorchCaching<D> {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Addr, PolicyOom> {
        self.eng.malloc(size, stream).map_err(|o| PolicyOom { requested: size, stream, reserved: o.reserved })
    }
    fn free(&mut self, addr: Addr) -> Result<(), UnknownBlock> {
        self.eng.free(addr).map_err(|_| UnknownBlock(addr))
    }
    fn reserved(&self) -> u64 {
        self.eng.reserved_bytes()
    }
    fn calls(&self) -> DriverCalls {
        let st = self.eng.stats();
        // The model counts a page map of an expandable segment as a device allocation.
        if self.eng.config().expandable_segments {
            // PyTorch synchronises the stream before each unmapped range (as `replay`
            // counts `stream_syncs`).
            DriverCalls {
                map: st.num_device_alloc,
                unmap: st.num_device_free,
                synchronize: st.num_device_free,
                ..Default::default()
            }
        } else {
            DriverCalls { cuda_malloc: st.num_device_alloc, cuda_free: st.num_device_free, ..Default::default() }
        }
    }
    fn empty_cache(&mut self) {
        self.eng.empty_cache();
    }
    fn check(&self) -> Result<(), InvariantError> {
        self.eng.check_invariants()
    }
}

impl<D: DeviceMemory> PyTorchCaching<D> {
    /// `torch.cuda.empty_cache()`: give back every segment with no live block.
    pub fn empty_cache(&mut self) {
        self.eng.empty_cache();
    }
}
