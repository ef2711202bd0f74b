//! torch.profiler / Kineto chrome traces with `[memory]` events (`profile_memory=True`),
//! and, as a convenience, JSON exports of a snapshot (same schema as the pickle).
//!
//! A `[memory]` event is an instant event (`"ph": "i"`) whose `args` hold `Bytes`
//! (positive = allocation, negative = free), `Device Type` (c10::DeviceType: 0 = CPU,
//! 1 = CUDA), `Device Id`, and in traces from about PyTorch 1.10 on also `Addr`,
//! `Total Allocated`, `Total Reserved` and `Ev Idx`. Only CUDA events are modelled; the
//! others are counted in a remark and skipped.
//!
//! Mapping onto the snapshot model (segments stay empty: a profiler trace has no state):
//! * `Bytes > 0` → `alloc` (addr = `Addr`, size = `Bytes`);
//! * `Bytes < 0` → `free_requested` immediately followed by `free_completed`, both with
//!   the same addr and size = −`Bytes`. The profiler records the moment the tensor is
//!   freed; PyTorch's own traces always carry the pair (equal when no `record_stream` is
//!   pending), so consumers that replay `free_completed` and those that look at
//!   `free_requested` both see the free;
//! * `time_us` = `ts` as written (µs; no conversion), stream 0 (the profiler does not
//!   record streams);
//! * every CUDA event also becomes a [`TotalsSample`] in `snapshot.totals[device]`;
//! * `deviceProperties[].totalGlobalMem` → `device_capacity[id]`.
//!
//! Events are ordered by `ts` (then `Ev Idx`, then file order). The file order is not the
//! device's order: it is grouped by thread, and `Ev Idx` follows it. On the HTA DDP
//! trace, file order leaves 2,844 frees that do not match a live allocation, while `ts`
//! order pairs all 13,385 allocations with their frees.
//!
//! Old traces (PyTorch 1.9, the TensorBoard-plugin samples) have no `Addr` and no totals.
//! Addresses are not invented: such a device gets no trace, only totals rebuilt as the
//! running sum of `Bytes`, and a remark says so.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::ReadError;
use crate::model::*;
use crate::pyobj::PyObj;

/// `c10::DeviceType::CUDA`.
const DEVICE_TYPE_CUDA: i64 = 1;

#[derive(Deserialize)]
struct Top {
    /// Only the CUDA `[memory]` events, kept as they are parsed ([`MemEvents`]): a tree of
    /// every event cost up to 95 times the file.
    #[serde(rename = "traceEvents", default)]
    trace_events: Option<MemEvents>,
    #[serde(rename = "deviceProperties", default)]
    device_properties: Option<Vec<DeviceProp>>,
    /// Present in a JSON export of a snapshot; see [`read_snapshot_json`].
    #[serde(default)]
    segments: Option<serde_json::Value>,
    #[serde(default)]
    device_traces: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    ts: Option<Lenient>,
    #[serde(default)]
    args: Option<MemArgs>,
}

/// Any JSON value; a number when it is one. Other events' `args` may reuse a key such as
/// `Bytes` with another type, which must not make the whole trace unreadable.
#[derive(Deserialize)]
#[serde(transparent)]
struct Lenient(serde_json::Value);

impl Lenient {
    fn num(&self) -> Option<&serde_json::Number> {
        match &self.0 {
            serde_json::Value::Number(n) => Some(n),
            _ => None,
        }
    }
}

/// `args` of an event; only the `[memory]` keys are kept, other events' args are skipped.
#[derive(Deserialize, Default)]
struct MemArgs {
    #[serde(rename = "Bytes", default)]
    bytes: Option<Lenient>,
    #[serde(rename = "Addr", default)]
    addr: Option<Lenient>,
    #[serde(rename = "Total Allocated", default)]
    total_allocated: Option<Lenient>,
    #[serde(rename = "Total Reserved", default)]
    total_reserved: Option<Lenient>,
    #[serde(rename = "Device Type", default)]
    device_type: Option<Lenient>,
    #[serde(rename = "Device Id", default)]
    device_id: Option<Lenient>,
    #[serde(rename = "Ev Idx", default)]
    ev_idx: Option<Lenient>,
}

#[derive(Deserialize)]
struct DeviceProp {
    #[serde(default)]
    id: Option<Lenient>,
    #[serde(rename = "totalGlobalMem", default)]
    total_global_mem: Option<Lenient>,
}

fn num_i64(n: &Lenient) -> Option<i64> {
    let n = n.num()?;
    n.as_i64().or_else(|| n.as_f64().filter(|f| f.is_finite() && f.abs() < 9.2e18).map(|f| f as i64))
}
fn num_u64(n: &Lenient) -> Option<u64> {
    n.num()?.as_u64().or_else(|| num_i64(n).and_then(|i| u64::try_from(i).ok()))
}

/// The `[memory]` events of `traceEvents`, taken one by one as the array is parsed
/// (each [`Event`] is dropped once looked at), with the counts of those skipped.
#[derive(Default)]
struct MemEvents {
    mem: Vec<MemEvent>,
    n_memory: u64,
    skipped_device: BTreeMap<String, u64>,
    malformed: u64,
}

impl<'de> Deserialize<'de> for MemEvents {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = MemEvents;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of trace events")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<MemEvents, A::Error> {
                let mut out = MemEvents::default();
                let mut i = 0usize;
                while let Some(e) = seq.next_element::<Event<'de>>()? {
                    out.take(i, &e);
                    i += 1;
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Visit)
    }
}

impl MemEvents {
    /// Keeps event number `i` if it is a CUDA `[memory]` event, else counts why not.
    fn take(&mut self, i: usize, e: &Event<'_>) {
        if e.name.as_deref() != Some("[memory]") {
            return;
        }
        self.n_memory += 1;
        let a = e.args.as_ref();
        let dev_type = a.and_then(|a| a.device_type.as_ref()).and_then(num_i64);
        if dev_type != Some(DEVICE_TYPE_CUDA) {
            let what = dev_type.map_or("no Device Type".to_string(), |t| format!("Device Type {t}"));
            *self.skipped_device.entry(what).or_default() += 1;
            return;
        }
        let a = a.expect("device type came from args");
        let device = a.device_id.as_ref().and_then(num_i64).and_then(|d| usize::try_from(d).ok());
        let (Some(device), Some(bytes), Some(ts)) =
            (device, a.bytes.as_ref().and_then(num_i64), e.ts.as_ref().and_then(num_i64))
        else {
            self.malformed += 1;
            return;
        };
        // Device ordinals are small; a huge one would only make us allocate empty lists.
        if device > 1024 {
            self.malformed += 1;
            return;
        }
        self.mem.push(MemEvent {
            ts,
            ev_idx: a.ev_idx.as_ref().and_then(num_i64).unwrap_or(i as i64),
            device,
            bytes,
            addr: a.addr.as_ref().and_then(num_u64),
            allocated: a.total_allocated.as_ref().and_then(num_u64),
            reserved: a.total_reserved.as_ref().and_then(num_u64),
        });
    }
}

/// One CUDA `[memory]` event, before sorting.
struct MemEvent {
    ts: i64,
    ev_idx: i64,
    device: usize,
    bytes: i64,
    addr: Option<u64>,
    allocated: Option<u64>,
    reserved: Option<u64>,
}

/// Reads a JSON document: a torch.profiler chrome trace, or a JSON export of a snapshot.
pub fn read_json(bytes: &[u8]) -> Result<Snapshot, ReadError> {
    let first = bytes.iter().copied().find(|b| !b.is_ascii_whitespace());
    if first != Some(b'{') {
        return Err(not_a_trace());
    }
    let top: Top = serde_json::from_slice(bytes).map_err(|e| ReadError::Json(e.to_string()))?;
    let Some(events) = top.trace_events else {
        if top.segments.is_some() || top.device_traces.is_some() {
            return read_snapshot_json(bytes);
        }
        return Err(not_a_trace());
    };

    let mut snap = Snapshot { format: SourceFormat::Kineto, ..Snapshot::default() };
    for p in top.device_properties.iter().flatten() {
        if let (Some(id), Some(mem)) = (p.id.as_ref().and_then(num_i64), p.total_global_mem.as_ref().and_then(num_u64))
        {
            snap.device_capacity.insert(id, mem);
        }
    }

    let MemEvents { mut mem, n_memory, skipped_device, malformed } = events;
    if n_memory == 0 {
        return Err(ReadError::Shape(
            "profiler trace without [memory] events: profile_memory=True was not set \
             (record with torch.profiler.profile(profile_memory=True))"
                .into(),
        ));
    }
    // Stable: equal (ts, Ev Idx) keep file order.
    mem.sort_by_key(|m| (m.ts, m.ev_idx));

    let ndev = mem.iter().map(|m| m.device + 1).max().unwrap_or(0);
    snap.totals = vec![Vec::new(); ndev];
    snap.device_traces = vec![Vec::new(); ndev];
    let mut running = vec![0i64; ndev];
    let mut no_addr = vec![0u64; ndev];
    for m in &mem {
        running[m.device] += m.bytes;
        let Some(addr) = m.addr else {
            // Old schema: no addresses, no totals. The running sum is all there is.
            no_addr[m.device] += 1;
            snap.totals[m.device].push(TotalsSample {
                time_us: m.ts,
                allocated: Some(running[m.device].max(0) as u64),
                reserved: m.reserved,
            });
            continue;
        };
        snap.totals[m.device].push(TotalsSample { time_us: m.ts, allocated: m.allocated, reserved: m.reserved });
        let trace = &mut snap.device_traces[m.device];
        let size = m.bytes.unsigned_abs();
        let ev = |action| {
            let mut ev = TraceEvent::new(action, addr, size);
            ev.time_us = m.ts;
            ev
        };
        if m.bytes >= 0 {
            trace.push(ev(Action::Alloc));
        } else {
            trace.push(ev(Action::FreeRequested));
            trace.push(ev(Action::FreeCompleted));
        }
    }
    for (d, &n) in no_addr.iter().enumerate() {
        if n > 0 {
            snap.notes.remarks.push(format!(
                "device {d}: profiler trace has no addresses: only totals are available ({n} [memory] events, \
                 running total of their Bytes)"
            ));
        }
    }
    for (what, n) in skipped_device {
        snap.notes.remarks.push(format!("skipped {n} [memory] events that are not CUDA ({what})"));
    }
    if malformed > 0 {
        snap.notes.remarks.push(format!("skipped {malformed} CUDA [memory] events without Device Id, Bytes or ts"));
    }
    Ok(snap)
}

fn not_a_trace() -> ReadError {
    ReadError::Shape("JSON without 'traceEvents': not a torch.profiler trace".into())
}

/// A snapshot exported as JSON (the pickle's dict, `json.dump`ed, as done by viewers and
/// scripts around `_memory_viz.py`). It is converted to the equivalent pickle and read by
/// the pickle reader, so both forms get exactly the same checks and model.
fn read_snapshot_json(bytes: &[u8]) -> Result<Snapshot, ReadError> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| ReadError::Json(e.to_string()))?;
    let obj = json_to_pyobj(v);
    let mut buf = Vec::new();
    crate::pickle::write::write_pyobj(&obj, &mut buf)?;
    drop(obj);
    let mut snap = crate::read_from(&buf[..])?;
    snap.notes.remarks.push("read from a JSON export of a snapshot".into());
    Ok(snap)
}

/// serde_json bounds nesting (128 levels), so this recursion is bounded too. Takes the
/// tree by value, so that each part of it is freed as it is converted.
fn json_to_pyobj(v: serde_json::Value) -> PyObj {
    use serde_json::Value as J;
    match v {
        J::Null => PyObj::None,
        J::Bool(b) => PyObj::Bool(b),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                PyObj::Int(i)
            } else if let Some(u) = n.as_u64() {
                PyObj::BigInt(crate::pyobj::encode_long(u as i128))
            } else {
                PyObj::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        J::String(s) => PyObj::Str(s),
        J::Array(a) => PyObj::List(a.into_iter().map(json_to_pyobj).collect()),
        J::Object(o) => PyObj::Dict(o.into_iter().map(|(k, v)| (PyObj::Str(k), json_to_pyobj(v))).collect()),
    }
}
