//! Several runs of one program compared, one snapshot each (the ranks of a distributed
//! job, usually): which rank peaked, the median, the outliers, and the call sites that
//! explain each outlier's excess. One definition for every front end (the HTML report,
//! the Python module's `analyze_many`).
//!
//! # The figures of a rank
//!
//! A rank is described by the device with its largest reserved peak ([`RankFigures`]):
//! that peak, the allocated peak of the same device, and the live bytes by call site at
//! that device's allocated peak, as `analyze` attributes them. One device, so that the
//! figures of a row and the sites that explain them describe the same memory.
//!
//! # Median, peak rank, median rank
//!
//! Over the ranks that could be read: the median of their peak reserved bytes (the mean of
//! the middle two for an even count); the *peak rank*, the one with the most (the first
//! among equals); the *median rank*, the real rank nearest the median (among equals the
//! lower peak, then the first): the baseline the others are compared with. For an even
//! count the median lies between the middle two, so the median rank is the lower of them:
//! never above the median.
//!
//! # Outliers
//!
//! A rank is an outlier when at least [`MIN_RANKS_FOR_OUTLIERS`] ranks were read and its
//! peak reserved bytes exceed [`OUTLIER_FACTOR`] × the median. The earlier definitions
//! disagreed: the report's page used this rule, the Python module named only the peak
//! rank. This one is kept because the peak rank always names someone, even among ranks
//! equal up to noise; a threshold over the median flags a real departure only, the median
//! is not pulled by the outlier itself (a mean would be), 10 % is above the differences
//! of ranks running the same program, and with two ranks the median is their mean: which
//! one is abnormal cannot be told, so neither is called an outlier.
//!
//! # The sites that explain an excess
//!
//! Each outlier (and the peak rank) is compared with the median rank, call site by call
//! site at their allocated peaks: the sites where it holds more, largest excess first
//! ([`TOP_SITES`] at most). A real rank as the baseline, rather than the median of each
//! site over the other ranks: the excesses are then the difference of two runs (what
//! `fragscope diff` attributes), they add up to at most the difference of the two runs'
//! live bytes, and the baseline is the same for every outlier; per-site medians mix
//! sites of different runs, and their sum describes none.
//!
//! Principal items: [`compare_ranks`], [`RankComparison`], [`RankFigures`].

use serde::Serialize;

use crate::analyze::Analysis;
use crate::oom::Verdict;

/// An outlier's peak reserved bytes exceed this many times the median ([module
/// doc](self)).
pub const OUTLIER_FACTOR: f64 = 1.1;

/// Ranks that must be read for any of them to be called an outlier ([module doc](self)).
pub const MIN_RANKS_FOR_OUTLIERS: usize = 3;

/// Call sites listed per compared rank, at most.
pub const TOP_SITES: usize = 10;

/// What the comparison reads of one rank: the figures of its device with the largest
/// reserved peak (the first among equals).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankFigures {
    /// That device; `None` when the file has none (then every figure is 0).
    pub device: Option<i64>,
    pub peak_reserved: u64,
    /// The allocated peak of the same device.
    pub peak_allocated: u64,
    /// The verdict of the file's first OOM (on any device).
    pub oom: Option<Verdict>,
    /// Live bytes by call site (named as `analyze` names them) at that device's allocated
    /// peak, in `analyze`'s order (most first); the sites beyond its top ones are not
    /// known by name and are not listed.
    pub sites: Vec<(String, u64)>,
}

impl RankFigures {
    /// The figures of a rank from its analysis.
    pub fn of(a: &Analysis) -> RankFigures {
        let mut out = RankFigures {
            oom: a.devices.iter().find_map(|d| d.oom.as_ref().map(|o| o.verdict)),
            ..RankFigures::default()
        };
        for d in &a.devices {
            let t = &d.fragmentation.timeline;
            if out.device.is_some() && t.peak_reserved.bytes <= out.peak_reserved {
                continue;
            }
            let mut sites: Vec<(String, u64)> = Vec::new();
            for s in &d.peaks.allocated_peak.sites {
                match sites.iter_mut().find(|(name, _)| *name == s.site.site) {
                    Some((_, b)) => *b += s.bytes,
                    None => sites.push((s.site.site.clone(), s.bytes)),
                }
            }
            out.device = Some(d.device);
            out.peak_reserved = t.peak_reserved.bytes;
            out.peak_allocated = t.peak_allocated.bytes;
            out.sites = sites;
        }
        out
    }
}

/// One rank of a [`RankComparison`], in the order given.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankRow {
    /// Its position in the list given (0 first).
    pub rank: usize,
    pub file: String,
    /// Why it could not be read (then its figures are 0 and it counts nowhere).
    pub error: Option<String>,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// The device the figures are of ([`RankFigures::device`]).
    pub device: Option<i64>,
    pub oom: Option<Verdict>,
}

/// A call site where a rank holds more than the median rank at their allocated peaks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteExcess {
    pub site: String,
    /// The rank's live bytes there.
    pub bytes: u64,
    /// The median rank's (0 when it has none there, or not among its top sites).
    pub median_rank_bytes: u64,
    /// `bytes − median_rank_bytes` (> 0).
    pub excess: u64,
}

/// A rank whose peak reserved bytes exceed [`OUTLIER_FACTOR`] × the median.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Outlier {
    pub rank: usize,
    /// Its peak reserved bytes / the median.
    pub ratio: f64,
    /// Its peak reserved bytes − the median.
    pub excess_over_median: f64,
    /// Where it holds more than the median rank (largest excess first; empty when it is
    /// the median rank or nothing shows).
    pub sites: Vec<SiteExcess>,
}

/// Several ranks compared ([module doc](self)). JSON: the Python module's
/// `RankSummary.to_dict()` (schema `fragscope.ranks/1`) without its schema key, plus
/// `outliers`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankComparison {
    pub ranks: Vec<RankRow>,
    /// Most peak reserved bytes among the ranks read (the first among equals).
    pub peak_rank: Option<usize>,
    /// The rank read nearest the median (among equals the lower peak, then the first).
    pub median_rank: Option<usize>,
    /// Median of the peak reserved bytes of the ranks read.
    pub median_peak_reserved: Option<f64>,
    /// The peak rank's peak reserved bytes − the median.
    pub excess_over_median: Option<f64>,
    /// The ranks read whose file records an OOM.
    pub oom_ranks: Vec<usize>,
    /// Where the peak rank holds more than the median rank (empty when they are one).
    pub sites: Vec<SiteExcess>,
    /// The ranks over [`OUTLIER_FACTOR`] × the median, in rank order.
    pub outliers: Vec<Outlier>,
}

/// Compares the ranks `ranks` (file name, and its figures or why it could not be read),
/// in the order given ([module doc](self)).
pub fn compare_ranks(ranks: &[(&str, Result<&RankFigures, &str>)]) -> RankComparison {
    let rows: Vec<RankRow> = ranks
        .iter()
        .enumerate()
        .map(|(rank, (file, r))| {
            let f = r.ok().cloned().unwrap_or_default();
            RankRow {
                rank,
                file: file.to_string(),
                error: r.err().map(str::to_string),
                peak_reserved: f.peak_reserved,
                peak_allocated: f.peak_allocated,
                device: f.device,
                oom: f.oom,
            }
        })
        .collect();
    let read: Vec<(usize, &RankFigures)> =
        ranks.iter().enumerate().filter_map(|(i, (_, r))| Some((i, r.ok()?))).collect();
    let median = median(read.iter().map(|(_, f)| f.peak_reserved).collect());
    let peak = read.iter().fold(None, |best: Option<&(usize, &RankFigures)>, r| match best {
        Some(b) if b.1.peak_reserved >= r.1.peak_reserved => Some(b),
        _ => Some(r),
    });
    let base = median.and_then(|m| {
        read.iter().min_by(|a, b| {
            let d = |f: &RankFigures| (f.peak_reserved as f64 - m).abs();
            d(a.1).total_cmp(&d(b.1)).then(a.1.peak_reserved.cmp(&b.1.peak_reserved)).then(a.0.cmp(&b.0))
        })
    });
    let versus_median = |r: &(usize, &RankFigures)| match base {
        Some(b) if b.0 != r.0 => excess_sites(r.1, b.1),
        _ => Vec::new(),
    };
    let outliers = match median {
        Some(m) if read.len() >= MIN_RANKS_FOR_OUTLIERS && m > 0.0 => read
            .iter()
            .filter(|(_, f)| f.peak_reserved as f64 > OUTLIER_FACTOR * m)
            .map(|r| Outlier {
                rank: r.0,
                ratio: r.1.peak_reserved as f64 / m,
                excess_over_median: r.1.peak_reserved as f64 - m,
                sites: versus_median(r),
            })
            .collect(),
        _ => Vec::new(),
    };
    RankComparison {
        ranks: rows,
        peak_rank: peak.map(|p| p.0),
        median_rank: base.map(|b| b.0),
        median_peak_reserved: median,
        excess_over_median: peak.zip(median).map(|(p, m)| p.1.peak_reserved as f64 - m),
        oom_ranks: read.iter().filter(|(_, f)| f.oom.is_some()).map(|(i, _)| *i).collect(),
        sites: peak.map(versus_median).unwrap_or_default(),
        outliers,
    }
}

/// The median of `v` (the mean of the middle two for an even count); `None` when empty.
fn median(mut v: Vec<u64>) -> Option<f64> {
    v.sort_unstable();
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2] as f64),
        _ => Some((v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0),
    }
}

/// The sites where `r` holds more than `base`, largest excess first (in `r`'s order
/// among equals), [`TOP_SITES`] at most.
fn excess_sites(r: &RankFigures, base: &RankFigures) -> Vec<SiteExcess> {
    let mut v: Vec<SiteExcess> = r
        .sites
        .iter()
        .filter_map(|(site, bytes)| {
            let theirs = base.sites.iter().find(|(s, _)| s == site).map_or(0, |(_, b)| *b);
            (*bytes > theirs).then(|| SiteExcess {
                site: site.clone(),
                bytes: *bytes,
                median_rank_bytes: theirs,
                excess: bytes - theirs,
            })
        })
        .collect();
    v.sort_by_key(|s| std::cmp::Reverse(s.excess));
    v.truncate(TOP_SITES);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn rank(peak_reserved: u64, sites: &[(&str, u64)]) -> RankFigures {
        RankFigures {
            device: Some(0),
            peak_reserved,
            peak_allocated: peak_reserved / 2,
            oom: None,
            sites: sites.iter().map(|(s, b)| (s.to_string(), *b)).collect(),
        }
    }

    fn compare(figures: &[RankFigures]) -> RankComparison {
        let names: Vec<String> = (0..figures.len()).map(|i| format!("rank{i}.pickle")).collect();
        let ranks: Vec<(&str, Result<&RankFigures, &str>)> =
            names.iter().zip(figures).map(|(n, f)| (n.as_str(), Ok(f))).collect();
        compare_ranks(&ranks)
    }

    fn outlier_ranks(c: &RankComparison) -> Vec<usize> {
        c.outliers.iter().map(|o| o.rank).collect()
    }

    #[test]
    fn odd_count_the_median_is_the_middle_rank_and_the_outlier_is_explained_by_its_sites() {
        let c = compare(&[
            rank(10 * GIB, &[("model.py:10:forward", 6 * GIB), ("opt.py:5:step", 2 * GIB)]),
            rank(
                16 * GIB,
                &[("model.py:10:forward", 6 * GIB), ("cache.py:3:get", 5 * GIB), ("opt.py:5:step", 3 * GIB)],
            ),
            rank(11 * GIB, &[("model.py:10:forward", 6 * GIB), ("opt.py:5:step", 2 * GIB)]),
        ]);
        assert_eq!(c.median_peak_reserved, Some((11 * GIB) as f64));
        assert_eq!((c.peak_rank, c.median_rank), (Some(1), Some(2)));
        assert_eq!(c.excess_over_median, Some((5 * GIB) as f64));
        assert_eq!(outlier_ranks(&c), [1]);
        let o = &c.outliers[0];
        assert_eq!(o.ratio, 16.0 / 11.0);
        let sites: Vec<(&str, u64, u64)> =
            o.sites.iter().map(|s| (s.site.as_str(), s.median_rank_bytes, s.excess)).collect();
        // The site the median rank lacks first; a site held alike is no excess.
        assert_eq!(sites, [("cache.py:3:get", 0, 5 * GIB), ("opt.py:5:step", 2 * GIB, GIB)]);
        assert_eq!(c.sites, o.sites, "the peak rank is the outlier");
        // 11 × 1.1 = 12.1 GiB: rank 0 (10) and rank 2 (11) are not outliers.
        assert_eq!(c.ranks.iter().map(|r| r.peak_reserved).collect::<Vec<_>>(), [10 * GIB, 16 * GIB, 11 * GIB]);
    }

    #[test]
    fn even_count_the_median_is_the_mean_of_the_middle_two_and_the_median_rank_the_lower() {
        // Middle two: 100 and 120 → median 110; both are 10 away, the lower is the baseline.
        let c = compare(&[rank(120, &[("a", 70)]), rank(100, &[("a", 60)]), rank(200, &[("a", 150)]), rank(90, &[])]);
        assert_eq!(c.median_peak_reserved, Some(110.0));
        assert_eq!(c.median_rank, Some(1));
        assert_eq!(c.peak_rank, Some(2));
        // 1.1 × 110 = 121: 120 is not an outlier, 200 is.
        assert_eq!(outlier_ranks(&c), [2]);
        assert_eq!(
            c.outliers[0].sites,
            [SiteExcess { site: "a".into(), bytes: 150, median_rank_bytes: 60, excess: 90 }]
        );
        assert_eq!(c.outliers[0].excess_over_median, 90.0);
    }

    #[test]
    fn at_the_threshold_a_rank_is_not_an_outlier() {
        // Median 100: 110 is exactly 1.1 × the median (not over it), 111 is over.
        let c = compare(&[rank(100, &[]), rank(110, &[]), rank(100, &[]), rank(90, &[]), rank(111, &[])]);
        assert_eq!(c.median_peak_reserved, Some(100.0));
        assert_eq!(outlier_ranks(&c), [4]);
    }

    #[test]
    fn ties_name_the_first_rank() {
        let c = compare(&[rank(50, &[("x", 10)]), rank(80, &[("x", 40)]), rank(80, &[("x", 45)]), rank(50, &[])]);
        // Peak: the first of the two 80s. Median 65: all four are 15 away; the lower
        // peak, then the first, is the baseline.
        assert_eq!((c.peak_rank, c.median_rank), (Some(1), Some(0)));
        assert_eq!(outlier_ranks(&c), [1, 2]);
        assert_eq!(c.outliers[1].sites[0].excess, 35);
        // Every rank equal: the peak rank is the median rank, nothing to explain.
        let same = compare(&[rank(7, &[("x", 5)]), rank(7, &[("x", 5)]), rank(7, &[("x", 5)])]);
        assert_eq!((same.peak_rank, same.median_rank), (Some(0), Some(0)));
        assert!(same.outliers.is_empty() && same.sites.is_empty());
        assert_eq!(same.excess_over_median, Some(0.0));
    }

    #[test]
    fn one_or_two_ranks_have_no_outlier() {
        let one = compare(&[rank(5 * GIB, &[("a", GIB)])]);
        assert_eq!(
            (one.peak_rank, one.median_rank, one.median_peak_reserved),
            (Some(0), Some(0), Some((5 * GIB) as f64))
        );
        assert!(one.outliers.is_empty() && one.sites.is_empty());
        // Two ranks: the median is their mean, which of them is abnormal cannot be told;
        // the peak rank is still compared with the median rank (the lower).
        let two = compare(&[rank(GIB, &[("a", 100)]), rank(10 * GIB, &[("a", 900), ("b", 50)])]);
        assert_eq!(two.median_peak_reserved, Some((11 * GIB) as f64 / 2.0));
        assert_eq!((two.peak_rank, two.median_rank), (Some(1), Some(0)));
        assert!(two.outliers.is_empty());
        assert_eq!(two.sites.iter().map(|s| (s.site.as_str(), s.excess)).collect::<Vec<_>>(), [("a", 800), ("b", 50)]);
    }

    #[test]
    fn an_unreadable_rank_is_listed_and_counts_nowhere() {
        let (a, b, c) = (rank(100, &[]), rank(300, &[]), rank(110, &[]));
        let mut oom = rank(105, &[]);
        oom.oom = Some(Verdict::Fragmentation);
        let ranks: Vec<(&str, Result<&RankFigures, &str>)> =
            vec![("r0", Ok(&a)), ("r1", Err("truncated pickle")), ("r2", Ok(&b)), ("r3", Ok(&c)), ("r4", Ok(&oom))];
        let cmp = compare_ranks(&ranks);
        assert_eq!(cmp.ranks[1].error.as_deref(), Some("truncated pickle"));
        assert_eq!((cmp.ranks[1].peak_reserved, cmp.ranks[1].device), (0, None));
        // Median of 100, 300, 110, 105 (not of a 0 for rank 1).
        assert_eq!(cmp.median_peak_reserved, Some(107.5));
        assert_eq!((cmp.peak_rank, cmp.median_rank), (Some(2), Some(4)));
        assert_eq!(outlier_ranks(&cmp), [2]);
        assert_eq!(cmp.oom_ranks, [4]);
        // Nothing read: no figure at all.
        let none = compare_ranks(&[("r0", Err("not a snapshot"))]);
        assert_eq!((none.peak_rank, none.median_rank, none.median_peak_reserved), (None, None, None));
        assert!(none.outliers.is_empty() && none.oom_ranks.is_empty());
        assert!(compare_ranks(&[]).ranks.is_empty());
    }

    #[test]
    fn sites_are_capped_and_in_order_of_excess() {
        let many: Vec<(String, u64)> = (0..15).map(|i| (format!("s{i}"), 100 + i)).collect();
        let big = RankFigures { sites: many, ..rank(1000, &[]) };
        let c = compare(&[rank(100, &[("s14", 114)]), big, rank(100, &[])]);
        let excess: Vec<u64> = c.outliers[0].sites.iter().map(|s| s.excess).collect();
        assert_eq!(excess.len(), TOP_SITES);
        assert!(excess.windows(2).all(|w| w[0] >= w[1]), "{excess:?}");
        assert!(c.outliers[0].sites.iter().all(|s| s.site != "s14"), "held alike by the median rank");
    }
}
