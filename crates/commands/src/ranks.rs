//! Ranks compared (`analyze_many` in Python, the report's page of several files): the one
//! definition is [`fragscope_diagnose::compare_ranks`]; this module gives it to front ends
//! that hold `analyze` documents rather than analyses (Python's `RankSummary` is built
//! from the JSON text of each rank, which may come from Dask or Ray workers), and the
//! document `fragscope.ranks/1`.

use fragscope_diagnose::{compare_ranks, Analysis, OomVerdict, RankComparison, RankFigures};
use serde::{Deserialize as _, Serialize};
use serde_json::Value;

use crate::Error;

pub const SCHEMA: &str = "fragscope.ranks/1";

/// A rank's figures read from its `analyze` document (one file of `fragscope.analyze/2`):
/// the same as [`RankFigures::of`] on the analysis the document was written from.
pub fn figures_of_document(file: &Value) -> Result<RankFigures, Error> {
    let bad = || Error::input("not an analyze document (fragscope.analyze/2)");
    let devices = file.get("devices").and_then(Value::as_array).ok_or_else(bad)?;
    let mut out = RankFigures::default();
    for d in devices {
        if out.oom.is_none() {
            if let Some(v) = d.get("oom").and_then(|o| o.get("verdict")) {
                out.oom = Some(OomVerdict::deserialize(v).map_err(|_| bad())?);
            }
        }
        let t = d.pointer("/fragmentation/timeline").ok_or_else(bad)?;
        let bytes = |k: &str| t.get(k).and_then(|p| p.get("bytes")).and_then(Value::as_u64).ok_or_else(bad);
        let (reserved, allocated) = (bytes("peak_reserved")?, bytes("peak_allocated")?);
        if out.device.is_some() && reserved <= out.peak_reserved {
            continue;
        }
        let mut sites: Vec<(String, u64)> = Vec::new();
        for s in d.pointer("/peaks/allocated_peak/sites").and_then(Value::as_array).ok_or_else(bad)? {
            let (Some(site), Some(b)) = (s.get("site").and_then(Value::as_str), s.get("bytes").and_then(Value::as_u64))
            else {
                return Err(bad());
            };
            match sites.iter_mut().find(|(name, _)| name == site) {
                Some((_, n)) => *n += b,
                None => sites.push((site.to_string(), b)),
            }
        }
        out.device = Some(d.get("device").and_then(Value::as_i64).ok_or_else(bad)?);
        out.peak_reserved = reserved;
        out.peak_allocated = allocated;
        out.sites = sites;
    }
    Ok(out)
}

#[derive(Serialize)]
struct RanksOut<'a> {
    schema: &'static str,
    #[serde(flatten)]
    comparison: &'a RankComparison,
}

/// The ranks document of `files` (in rank order), each with its `analyze` document's text
/// (`Ok`) or why it could not be analysed (`Err`). A document that does not read as an
/// analysis makes its rank unreadable, with the reason.
pub fn json_of_documents(files: &[(String, Result<String, String>)]) -> Result<String, Error> {
    let figures: Vec<Result<RankFigures, String>> = files
        .iter()
        .map(|(_, r)| match r {
            Err(e) => Err(e.clone()),
            Ok(text) => serde_json::from_str::<Value>(text).map_err(|e| format!("not JSON: {e}")).and_then(|v| {
                let file = v.pointer("/files/0").cloned().unwrap_or(Value::Null);
                figures_of_document(&file).map_err(|e| e.to_string())
            }),
        })
        .collect();
    document(files.iter().map(|(n, _)| n.as_str()), &figures)
}

/// The ranks document of analyses held in memory.
pub fn json_of_analyses(files: &[(String, Result<&Analysis, String>)]) -> Result<String, Error> {
    let figures: Vec<Result<RankFigures, String>> =
        files.iter().map(|(_, r)| r.as_ref().map(|a| RankFigures::of(a)).map_err(Clone::clone)).collect();
    document(files.iter().map(|(n, _)| n.as_str()), &figures)
}

/// The document of ranks named `names`, each with its figures or why it has none.
fn document<'a>(
    names: impl Iterator<Item = &'a str>,
    figures: &[Result<RankFigures, String>],
) -> Result<String, Error> {
    let ranks: Vec<(&str, Result<&RankFigures, &str>)> =
        names.zip(figures).map(|(n, f)| (n, f.as_ref().map_err(String::as_str))).collect();
    crate::to_json(&RanksOut { schema: SCHEMA, comparison: &compare_ranks(&ranks) })
}
