//! [`LifetimeSegregated`]: short- and long-lived blocks in separate arenas per stream,
//! the class predicted from (call site, size) by what earlier blocks of that key did.

use super::best_fit::PagedArena;
use super::{round512, DriverCalls, FastMap, Policy, PolicyOom, UnknownBlock};
use crate::device::{DeviceMemory, SimulatedDevice};
use crate::{Addr, InvariantError, StreamId};

/// A block is long-lived when this many requests (of any stream) come before its free.
/// Temporaries of one operator live for a handful of requests; activations kept for the
/// backward pass, parameters, gradients and optimizer state for thousands.
pub const LONG_LIVED_REQUESTS: u64 = 256;

/// A live block: (arena index, long-lived?, size, request number, (site, size) key).
type LiveBlock = (u32, bool, u64, u64, (u64, u64));

/// Two growable best-fit arenas per stream (short-lived, long-lived). A (site, size) key
/// is predicted by the last block of that key that was freed; a key never freed yet is
/// predicted short-lived, and a key still live after [`LONG_LIVED_REQUESTS`] is learned as
/// long-lived when its free comes.
pub struct LifetimeSegregated<D: DeviceMemory = SimulatedDevice> {
    dev: D,
    /// `(stream, short arena, long arena)`.
    arenas: Vec<(StreamId, PagedArena, PagedArena)>,
    live: FastMap<Addr, LiveBlock>,
    learned: FastMap<(u64, u64), bool>,
    site: u64,
    requests: u64,
    calls: DriverCalls,
}

impl<D: DeviceMemory> LifetimeSegregated<D> {
    pub fn new(dev: D) -> Self {
        LifetimeSegregated {
            dev,
            arenas: Vec::new(),
            live: FastMap::default(),
            learned: FastMap::default(),
            site: 0,
            requests: 0,
            calls: DriverCalls::default(),
        }
    }

    /// Unmap the free pages at every arena's top, after one synchronisation (counted
    /// when any page goes).
    fn trim_all(&mut self) {
        let mut any = false;
        for (_, s, l) in &mut self.arenas {
            any |= s.trim(&mut self.dev, &mut self.calls);
            any |= l.trim(&mut self.dev, &mut self.calls);
        }
        self.calls.synchronize += any as u64;
    }
}

impl<D: DeviceMemory> Policy for LifetimeSegregated<D> {
    fn name(&self) -> String {
        "lifetime".into()
    }
    fn hint_site(&mut self, site: u64) {
        self.site = site;
    }
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Addr, PolicyOom> {
        let r = round512(size);
        let key = (self.site, r);
        self.site = 0;
        self.requests += 1;
        let long = self.learned.get(&key).copied().unwrap_or(false);
        let oom = |me: &Self| PolicyOom { requested: size, stream, reserved: me.reserved() };
        let k = match self.arenas.iter().position(|(s, ..)| *s == stream) {
            Some(k) => k,
            None => {
                let (Some(s), Some(l)) = (PagedArena::new(&mut self.dev), PagedArena::new(&mut self.dev)) else {
                    return Err(oom(self));
                };
                self.arenas.push((stream, s, l));
                self.arenas.len() - 1
            }
        };
        let place = |me: &mut Self| {
            let (_, s, l) = &mut me.arenas[k];
            let a = if long { l } else { s };
            a.alloc(r, &mut me.dev, &mut me.calls)
        };
        let addr = match place(self) {
            Some(a) => a,
            None => {
                self.trim_all();
                match place(self) {
                    Some(a) => a,
                    None => return Err(oom(self)),
                }
            }
        };
        self.live.insert(addr, (k as u32, long, r, self.requests, key));
        Ok(addr)
    }
    fn empty_cache(&mut self) {
        self.trim_all();
    }
    fn free(&mut self, addr: Addr) -> Result<(), UnknownBlock> {
        let (k, long, size, at, key) = self.live.remove(&addr).ok_or(UnknownBlock(addr))?;
        let (_, s, l) = &mut self.arenas[k as usize];
        if long { l } else { s }.free(addr, size);
        self.learned.insert(key, self.requests - at >= LONG_LIVED_REQUESTS);
        Ok(())
    }
    fn reserved(&self) -> u64 {
        self.arenas.iter().map(|(_, s, l)| s.mapped + l.mapped).sum()
    }
    fn calls(&self) -> DriverCalls {
        self.calls
    }
    fn check(&self) -> Result<(), InvariantError> {
        for (_, s, l) in &self.arenas {
            s.check()?;
            l.check()?;
        }
        Ok(())
    }
}
