//! torch.profiler / Kineto chrome traces with `[memory]` events. Being written.

use crate::error::ReadError;
use crate::model::Snapshot;

pub(crate) fn read_json(_bytes: &[u8]) -> Result<Snapshot, ReadError> {
    Err(ReadError::Shape("JSON traces are not supported yet".into()))
}
