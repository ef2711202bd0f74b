//! `predict`: memory of the same program at a size nobody recorded (batch size, sequence
//! length, ...), from recordings at other sizes, replayed through the allocator model
//! ([`fragscope_predict`]). [`Request`] → [`evaluate`] → [`Outcome`] → [`json`]
//! (`fragscope.predict/2`: each prediction with its `range`, each max-fit answer with
//! the sizes that fit for certain and that might).

use fragscope_predict::{check_size_list, FitQuality, MaxFit, Prediction, Program, Recording};
use fragscope_replay::ALTERNATIVES;
use fragscope_snapshot::Snapshot;
use serde::Serialize;

use crate::replay::config_on_top;
use crate::{msg, Error, Param};

pub const SCHEMA: &str = "fragscope.predict/2";

#[derive(Serialize)]
struct JsonOut<'a> {
    schema: &'static str,
    files: Vec<JsonFile>,
    /// Per device: how the recordings aligned and how their sizes fitted.
    fits: Vec<JsonFit<'a>>,
    predictions: Vec<JsonPrediction<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    max_fit: Vec<&'a MaxFit>,
    /// How the capacity was taken from a GPU name (absent for a capacity in bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity_note: Option<&'a str>,
}

#[derive(Serialize)]
struct JsonFile {
    file: String,
    size: u64,
}

#[derive(Serialize)]
struct JsonFit<'a> {
    device: i64,
    template_size: u64,
    #[serde(flatten)]
    quality: &'a FitQuality,
    notes: &'a [String],
}

#[derive(Serialize)]
struct JsonPrediction<'a> {
    #[serde(flatten)]
    prediction: &'a Prediction,
    fits: bool,
    fit_quality: CompactQuality,
}

#[derive(Serialize)]
struct CompactQuality {
    aligned_fraction: f64,
    unexplained: usize,
    extrapolated_share: f64,
}

/// Parses `128,256` into sizes (each ≥ 1), for parameter `what`.
pub fn parse_sizes(s: &str, what: Param) -> Result<Vec<u64>, Error> {
    let v: Result<Vec<u64>, _> = s.split(',').map(|x| x.trim().replace('_', "").parse::<u64>()).collect();
    let v =
        v.map_err(|_| Error::argument(msg![what, format!(" {s:?}: expected whole numbers separated by commas")]))?;
    if v.contains(&0) {
        return Err(Error::argument(msg![
            what,
            format!(" {s:?}: a size of 0; sizes are batch sizes, sequence lengths, ..., all at least 1")
        ]));
    }
    Ok(v)
}

// A GPU name's reading (its total less the CUDA context) is `capacity`'s, shared with
// `replay` and `fit`; the names stay here for the callers that know them as predict's.
pub use crate::capacity::{parse_capacity, usable_bytes, CUDA_CONTEXT_ALLOWANCE};

/// What to predict: the parsed arguments without the files ([`check_request`] checks it).
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub sizes: Vec<u64>,
    pub at: Vec<u64>,
    pub config: Option<String>,
    /// Bytes PyTorch's allocator may hold (a GPU name already less the CUDA context:
    /// [`parse_capacity`]).
    pub capacity: Option<u64>,
    /// How `capacity` was derived from a GPU name, shown with the results.
    pub capacity_note: Option<String>,
    pub max_fit: bool,
    pub max_size: u64,
    pub device: Option<i64>,
}

/// The predictions of one command: per device the fitted program, the replays, the
/// largest sizes that fit.
pub struct Outcome<'a> {
    pub names: Vec<String>,
    pub sizes: Vec<u64>,
    pub programs: Vec<Program<'a>>,
    /// Each prediction with the index of its program.
    pub predictions: Vec<(Prediction, usize)>,
    pub max_fit: Vec<MaxFit>,
    /// [`Request::capacity_note`].
    pub capacity_note: Option<String>,
}

/// Checks the usage of `predict` for `files` recordings (before reading any file): the
/// one-line errors, exit code 2.
pub fn check_request(files: usize, req: &Request) -> Result<(), Error> {
    if files < 2 {
        return Err(Error::argument(msg![format!(
            "predict needs two or more recordings of one program at different sizes, got {files}: {}",
            fragscope_predict::recording_recipe()
        )]));
    }
    if req.sizes.len() != files {
        return Err(Error::argument(msg![
            Param::Sizes,
            format!(" gives {} size(s) for {files} file(s): one size per recording, in file order", req.sizes.len())
        ]));
    }
    check_size_list(&req.sizes).map_err(|e| Error::argument(msg![e.to_string()]))?;
    if req.at.contains(&0) {
        return Err(Error::argument(msg![
            Param::At,
            ": a size of 0; sizes are batch sizes, sequence lengths, ..., all at least 1"
        ]));
    }
    if req.at.is_empty() && !req.max_fit {
        return Err(Error::argument(msg![
            Param::At,
            " is required (the sizes to predict), or ",
            Param::MaxFit,
            " with ",
            Param::Capacity
        ]));
    }
    if req.max_fit && req.capacity.is_none() {
        return Err(Error::argument(msg![
            Param::MaxFit,
            " needs ",
            Param::Capacity,
            " (a GPU name such as H100-80GB, or bytes)"
        ]));
    }
    if let Some(c) = &req.config {
        fragscope_alloc::parse_config(c).map_err(|e| Error::argument(msg![e.to_string()]))?;
    }
    Ok(())
}

/// Aligns and fits `snaps` (recordings named `names`) and replays what `req` asks.
pub fn evaluate<'a>(names: &[String], snaps: &[&'a Snapshot], req: &Request) -> Result<Outcome<'a>, Error> {
    check_request(snaps.len(), req)?;
    let recs: Vec<Recording> = snaps.iter().zip(&req.sizes).map(|(&s, &size)| Recording { snap: s, size }).collect();
    let devices = match req.device {
        Some(d) => vec![d],
        None => {
            let mut common = fragscope_replay::replayable_devices(snaps[0]);
            for s in &snaps[1..] {
                let d = fragscope_replay::replayable_devices(s);
                common.retain(|x| d.contains(x));
            }
            common
        }
    };
    if devices.is_empty() {
        return Err(Error::input("the recordings share no device with an allocation trace: nothing to predict"));
    }
    let mut programs = Vec::new();
    for &d in &devices {
        programs.push(Program::fit(&recs, Some(d)).map_err(|e| Error::input(e.to_string()))?);
    }
    let mut predictions = Vec::new();
    let mut max_fit = Vec::new();
    for (k, prog) in programs.iter().enumerate() {
        let base = prog.recorded_config.clone();
        let cfg = match &req.config {
            Some(c) => config_on_top(&base, c)?,
            None => base.clone(),
        };
        for &x in &req.at {
            predictions.push((prog.predict(x, &cfg, req.capacity), k));
        }
        if let (true, Some(cap)) = (req.max_fit, req.capacity) {
            max_fit.push(prog.max_fit_range(&cfg, cap, req.max_size));
            if req.config.is_none() {
                for alt in ALTERNATIVES {
                    max_fit.push(prog.max_fit_range(&config_on_top(&base, alt)?, cap, req.max_size));
                }
            }
        }
    }
    Ok(Outcome {
        names: names.to_vec(),
        sizes: req.sizes.clone(),
        programs,
        predictions,
        max_fit,
        capacity_note: req.capacity_note.clone(),
    })
}

/// The `--json` document (schema `fragscope.predict/2`): what `fragscope predict --json`
/// prints.
pub fn json(out: &Outcome) -> Result<String, Error> {
    let doc = JsonOut {
        schema: SCHEMA,
        files: out.names.iter().zip(&out.sizes).map(|(f, &size)| JsonFile { file: f.clone(), size }).collect(),
        fits: out
            .programs
            .iter()
            .map(|p| JsonFit { device: p.device, template_size: p.template_size, quality: &p.quality, notes: &p.notes })
            .collect(),
        predictions: out
            .predictions
            .iter()
            .map(|(p, k)| {
                let prog = &out.programs[*k];
                JsonPrediction {
                    prediction: p,
                    fits: p.fits(),
                    fit_quality: CompactQuality {
                        aligned_fraction: prog.quality.aligned_fraction,
                        unexplained: prog.quality.unexplained_total,
                        extrapolated_share: p.extrapolated_share,
                    },
                }
            })
            .collect(),
        max_fit: out.max_fit.iter().collect(),
        capacity_note: out.capacity_note.as_deref(),
    };
    crate::to_json(&doc)
}
