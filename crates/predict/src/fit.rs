//! Fit one allocation's requested size as a function of the size parameter.
//!
//! Requested sizes in a trace are exact tensor bytes (`numel × element size`, before the
//! allocator rounds them), so a size that depends on a batch size or a sequence length
//! is, almost always, a polynomial of low degree with no remainder: `c·x` for an
//! activation, `c·x²` for attention scores, `a + b·x` for a concatenation with a fixed
//! part. The fit is the simplest law that gives every recorded size *exactly* (within
//! half a byte); the allocator model then rounds the predicted request as PyTorch does.
//!
//! Laws, simplest first: one parameter (`a`, `c·x`, `c·x²`), two (`a + b·x`,
//! `b·x + c·x²`, `a + c·x²`), three (`a + b·x + c·x²`). A law is only tried with at
//! least as many recordings as it has parameters; with more recordings than parameters
//! it is *confirmed* (a recording it was not determined by agrees), with exactly as many
//! it is only *determined* (it passes through the points; nothing checked it).

use serde::Serialize;

/// How an allocation's requested size follows the size parameter `x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Law {
    /// The same size at every recorded size.
    Constant,
    /// `c·x`.
    Linear,
    /// `c·x²`.
    Square,
    /// `a + b·x`.
    Affine,
    /// `b·x + c·x²`.
    LinearSquare,
    /// `a + c·x²`.
    ConstantSquare,
    /// `a + b·x + c·x²`.
    Quadratic,
    /// No law above gives every recorded size: extrapolated along the line through the
    /// two largest recorded sizes, and listed.
    Unfit,
    /// Seen at one recorded size only: kept at that size, and listed.
    Single,
    /// Step-like sizes (three or more recordings, non-decreasing, with a plateau: 1,279 /
    /// 1,279 / 1,535 bytes, or 64 / 128 / 132 / 132 MiB): a size chosen by a kernel or a
    /// library in steps, or capped. Kept at the largest recorded size where it ends on a
    /// plateau (a cap), else along the line through the smallest and largest recordings,
    /// rounded up to the step the recordings show ([`step_fit`]).
    Step,
}

impl Law {
    /// Which powers of `x` the law uses (constant, linear, square).
    fn basis(self) -> [bool; 3] {
        match self {
            Law::Constant | Law::Single => [true, false, false],
            Law::Linear => [false, true, false],
            Law::Square => [false, false, true],
            Law::Affine | Law::Unfit | Law::Step => [true, true, false],
            Law::LinearSquare => [false, true, true],
            Law::ConstantSquare => [true, false, true],
            Law::Quadratic => [true, true, true],
        }
    }
    fn params(self) -> usize {
        self.basis().iter().filter(|&&b| b).count()
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Law::Constant => "constant",
            Law::Linear => "c*x",
            Law::Square => "c*x^2",
            Law::Affine => "a+b*x",
            Law::LinearSquare => "b*x+c*x^2",
            Law::ConstantSquare => "a+c*x^2",
            Law::Quadratic => "a+b*x+c*x^2",
            Law::Unfit => "unfit",
            Law::Single => "single",
            Law::Step => "step",
        }
    }
}

const LAWS: [Law; 7] =
    [Law::Constant, Law::Linear, Law::Square, Law::Affine, Law::LinearSquare, Law::ConstantSquare, Law::Quadratic];

/// How far a predicted size can be trusted: what the uncertainty figures group by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Evidence {
    /// The same size in every recording: nothing extrapolated.
    Constant,
    /// A law with fewer parameters than recordings, which every recording agrees with.
    Confirmed,
    /// A law with as many parameters as recordings: exact on them, checked by none.
    Determined,
    /// No law (or one recording only): the prediction is a guess.
    Unfitted,
}

/// Largest predicted request (256 TiB).
pub const MAX_REQUEST: u64 = 1 << 48;

/// The fitted size of one allocation: `c[0] + c[1]·u + c[2]·u²` with `u = x / scale`
/// (scaled so that the fit is well conditioned whatever the magnitude of `x`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SizeFit {
    pub law: Law,
    pub evidence: Evidence,
    #[serde(skip)]
    c: [f64; 3],
    #[serde(skip)]
    scale: f64,
    /// Sizes rounded up to `offset + k·step` (a [`Law::Step`]); 0: not rounded.
    #[serde(skip)]
    step: u64,
    #[serde(skip)]
    offset: u64,
    /// The size parameter past which the size holds ([`held`]): a concave law through
    /// rising sizes turns over, and a size that grew over the recordings does not shrink
    /// past them. `f64::INFINITY`: never held.
    #[serde(skip)]
    hold: f64,
}

impl SizeFit {
    /// The predicted requested bytes at `x`, rounded to the nearest byte; `None` when
    /// the law gives no positive size there (a size that shrinks to nothing).
    pub fn at(&self, x: u64) -> Option<u64> {
        let mut v = self.value(x as f64);
        if self.step > 0 && v.is_finite() && v > self.offset as f64 {
            let k = ((v - self.offset as f64) / self.step as f64 - 1e-9).ceil();
            v = self.offset as f64 + k * self.step as f64;
        }
        // Capped at 256 TiB (the largest size a snapshot may hold): far past any device,
        // and the allocator's arithmetic stays in range.
        (v.is_finite() && v >= 0.5).then(|| (v.round() as u64).min(MAX_REQUEST))
    }
    fn value(&self, x: f64) -> f64 {
        let u = x.min(self.hold) / self.scale;
        self.c[0] + self.c[1] * u + self.c[2] * u * u
    }
}

/// Fit `points` (size parameter, requested bytes; distinct parameters, any order):
/// the simplest exact law, unless no law is confirmed and the sizes are step-like
/// ([`Law::Step`]). `points` must not be empty.
pub fn fit(points: &[(u64, u64)]) -> SizeFit {
    let f = exact_fit(points);
    if matches!(f.evidence, Evidence::Determined | Evidence::Unfitted) {
        if let Some(s) = step_fit(points) {
            return s;
        }
    }
    held(f, points)
}

/// `f` held at the value of its vertex past the recordings when it turns against the
/// way the recorded sizes went: concave (`c·x²` with `c < 0`) while they grow, or convex
/// while they shrink. A request that grew over the recordings does not shrink past them
/// in a real program, nor does one that shrank grow back: the H200 GPT step has 48
/// requests of 48 or 64, 128, 132 MiB at batches 4, 8, 16 whose quadratics give nothing
/// from batch 24 on (the real size stays at its 132 MiB cap at batch 170), and 3 of
/// 125 MB, …, 64 KiB whose quadratic bends up to 68 GB at batch 170 (+74 % on the
/// reserved peak). Held from the vertex, or from the largest recording where the vertex
/// lies before it (the size is then the largest recording's: a cap, or a floor).
fn held(mut f: SizeFit, points: &[(u64, u64)]) -> SizeFit {
    let (p, _) = sorted(points);
    let (Some(lo), Some(hi)) = (p.first(), p.last()) else { return f };
    if (f.c[2] < 0.0 && hi.1 > lo.1) || (f.c[2] > 0.0 && hi.1 < lo.1) {
        let vertex = -f.c[1] / (2.0 * f.c[2]) * f.scale;
        f.hold = vertex.max(hi.0 as f64);
    }
    f
}

/// The line through `a` and `b` (size parameter, bytes), scaled by `scale`.
fn line(a: (u64, u64), b: (u64, u64), scale: f64, law: Law, evidence: Evidence) -> SizeFit {
    let c = solve(Law::Affine, &[a, b], scale).unwrap_or([b.1 as f64, 0.0, 0.0]);
    SizeFit { law, evidence, c, scale, step: 0, offset: 0, hold: f64::INFINITY }
}

fn constant(v: u64, scale: f64, law: Law, evidence: Evidence) -> SizeFit {
    SizeFit { law, evidence, c: [v as f64, 0.0, 0.0], scale, step: 0, offset: 0, hold: f64::INFINITY }
}

/// `points` sorted by size parameter, and the scale a fit of them uses.
fn sorted(points: &[(u64, u64)]) -> (Vec<(u64, u64)>, f64) {
    let mut by_x = points.to_vec();
    by_x.sort_unstable();
    let scale = by_x.last().map_or(1, |p| p.0).max(1) as f64;
    (by_x, scale)
}

/// The [`Law::Step`] of `points` when they are step-like: three or more, non-decreasing
/// as the size parameter grows, not all equal, two neighbours equal (a plateau). The step
/// is the greatest common divisor of the recorded increments (1,279 → 1,535: 256), the
/// grid's offset the largest size modulo the step (255): sizes stay on that grid.
fn step_fit(points: &[(u64, u64)]) -> Option<SizeFit> {
    let (p, scale) = sorted(points);
    let n = p.len();
    let rising = p.windows(2).all(|w| w[1].1 >= w[0].1);
    let plateau = p.windows(2).any(|w| w[1].1 == w[0].1);
    if n < 3 || !rising || !plateau || p[0].1 == p[n - 1].1 {
        return None;
    }
    let step = p.windows(2).map(|w| w[1].1 - w[0].1).filter(|&d| d > 0).fold(0, gcd);
    let top = p[n - 1].1;
    // A plateau at the top is a cap: the size stays there; else it grows at the recorded
    // average rate, on the grid.
    let mut f = if p[n - 2].1 == top {
        constant(top, scale, Law::Step, Evidence::Determined)
    } else {
        line(p[0], p[n - 1], scale, Law::Step, Evidence::Determined)
    };
    f.step = step;
    f.offset = top % step;
    Some(f)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The plausible alternatives of `f`, the fit of `points`: the laws the recordings do
/// not rule out, which a prediction's range replays ([`crate::Prediction::range`]).
///
/// * a confirmed or constant law, or a size seen once: none (a recording it was not
///   fitted to agrees, or there is no evidence at all);
/// * a law only determined by two recordings (`a + b·x`): the other two-parameter laws
///   through the same points (`b·x + c·x²`, `a + c·x²`): line vs quadratic;
/// * a quadratic only determined by three recordings: the line through the two largest
///   (a concave one is held at its highest value past the recordings, [`held`]: the
///   size that turns over and shrinks is not among the alternatives);
/// * a size that follows no law: kept at the largest recording's size, and the line
///   through the smallest and largest;
/// * a step-like size: kept at the largest recorded size (the plateau goes on), and the
///   line through the two largest recordings, on the step's grid (the next step comes
///   sooner).
pub fn alternatives(points: &[(u64, u64)], f: &SizeFit) -> Vec<SizeFit> {
    let (p, scale) = sorted(points);
    let n = p.len();
    if n < 2 || matches!(f.evidence, Evidence::Constant | Evidence::Confirmed) {
        return Vec::new();
    }
    let (lo, hi) = (p[0], p[n - 1]);
    let ev = f.evidence;
    match f.law {
        Law::Step => {
            let mut up = line(p[n - 2], hi, scale, Law::Step, ev);
            (up.step, up.offset) = (f.step, f.offset);
            vec![constant(hi.1, scale, Law::Step, ev), up]
        }
        Law::Unfit => vec![constant(hi.1, scale, Law::Unfit, ev), line(lo, hi, scale, Law::Unfit, ev)],
        _ if f.law.params() == 2 && n == 2 => [Law::Affine, Law::LinearSquare, Law::ConstantSquare]
            .into_iter()
            .filter(|&l| l != f.law)
            .filter_map(|l| {
                let c = solve(l, &p, scale)?;
                let g = SizeFit { law: l, evidence: ev, c, scale, step: 0, offset: 0, hold: f64::INFINITY };
                p.iter()
                    .all(|&(x, s)| (g.value(x as f64) - s as f64).abs() <= 0.5 + 1e-12 * s as f64)
                    .then(|| held(g, &p))
            })
            .collect(),
        _ => vec![line(p[n - 2], hi, scale, Law::Affine, ev)],
    }
}

/// The simplest exact law of `points` (module doc), else [`Law::Unfit`].
fn exact_fit(points: &[(u64, u64)]) -> SizeFit {
    let scale = points.iter().map(|p| p.0).max().unwrap_or(1).max(1) as f64;
    if points.len() == 1 || points.iter().all(|p| p.1 == points[0].1) {
        let law = if points.len() == 1 { Law::Single } else { Law::Constant };
        let evidence = if points.len() == 1 { Evidence::Unfitted } else { Evidence::Constant };
        return SizeFit {
            law,
            evidence,
            c: [points[0].1 as f64, 0.0, 0.0],
            scale,
            step: 0,
            offset: 0,
            hold: f64::INFINITY,
        };
    }
    for law in LAWS.iter().copied().skip(1) {
        let p = law.params();
        if p > points.len() {
            break;
        }
        if let Some(c) = solve(law, points, scale) {
            let f = SizeFit {
                law,
                evidence: if p < points.len() { Evidence::Confirmed } else { Evidence::Determined },
                c,
                scale,
                step: 0,
                offset: 0,
                hold: f64::INFINITY,
            };
            if points.iter().all(|&(x, s)| (f.value(x as f64) - s as f64).abs() <= 0.5 + 1e-12 * s as f64) {
                return f;
            }
        }
    }
    // Nothing exact: the line through the two largest sizes, the nearest evidence for
    // an extrapolation upwards.
    let mut by_x: Vec<(u64, u64)> = points.to_vec();
    by_x.sort_unstable();
    let two = &by_x[by_x.len() - 2..];
    let c = solve(Law::Affine, two, scale).unwrap_or([two[1].1 as f64, 0.0, 0.0]);
    SizeFit { law: Law::Unfit, evidence: Evidence::Unfitted, c, scale, step: 0, offset: 0, hold: f64::INFINITY }
}

/// Least-squares coefficients of `law` on `points` (exact when the law has as many
/// parameters as points), by the normal equations on scaled `x`.
fn solve(law: Law, points: &[(u64, u64)], scale: f64) -> Option<[f64; 3]> {
    let basis = law.basis();
    let idx: Vec<usize> = (0..3).filter(|&k| basis[k]).collect();
    let p = idx.len();
    // Normal equations: (AᵀA) c = Aᵀb, at most 3×3.
    let mut m = [[0.0f64; 4]; 3];
    for &(x, s) in points {
        let u = x as f64 / scale;
        let pw = [1.0, u, u * u];
        for r in 0..p {
            for k in 0..p {
                m[r][k] += pw[idx[r]] * pw[idx[k]];
            }
            m[r][3] += pw[idx[r]] * s as f64;
        }
    }
    // Gaussian elimination with partial pivoting.
    for col in 0..p {
        let piv = (col..p).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[piv][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, piv);
        let pivot = m[col];
        for (r, row) in m.iter_mut().enumerate().take(p) {
            if r != col {
                let f = row[col] / pivot[col];
                for (x, y) in row.iter_mut().zip(pivot.iter()).skip(col) {
                    *x -= f * y;
                }
            }
        }
    }
    let mut c = [0.0; 3];
    for (r, &k) in idx.iter().enumerate() {
        c[k] = m[r][3] / m[r][r];
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_concave_law_through_rising_sizes_holds_past_the_recordings() {
        // The H200 GPT step's capped request: 64, 128, 132 MiB at batches 4, 8, 16. The
        // quadratic through them turns over at 12.2 and gives nothing from 24 on.
        let mib = 1u64 << 20;
        let f = fit(&[(4, 64 * mib), (8, 128 * mib), (16, 132 * mib)]);
        assert_eq!((f.law, f.evidence), (Law::Quadratic, Evidence::Determined));
        assert_eq!([f.at(4), f.at(8), f.at(16)], [Some(64 * mib), Some(128 * mib), Some(132 * mib)]);
        assert_eq!([f.at(24), f.at(170)], [Some(132 * mib), Some(132 * mib)]);
        // 11·x − x² through 10, 18, 24: still rising at the largest recording, held at its
        // vertex (5.5: 30.25) past it.
        let f = fit(&[(1, 10), (2, 18), (3, 24)]);
        assert_eq!([f.at(3), f.at(4), f.at(5), f.at(100)], [Some(24), Some(28), Some(30), Some(30)]);
        // Sizes that shrink over the recordings follow a concave law down; a convex law
        // through shrinking sizes is held at its lowest value instead of growing back.
        let f = fit(&[(1, 24), (2, 18), (3, 10)]);
        assert_eq!(f.at(4), None);
        let f = fit(&[(4, 125_000_000), (8, 30_000_000), (16, 65_536)]);
        assert_eq!([f.at(16), f.at(170)], [Some(65_536), Some(65_536)]);
    }

    #[test]
    fn simplest_exact_law() {
        assert_eq!(fit(&[(128, 4096), (256, 4096)]).law, Law::Constant);
        let f = fit(&[(128, 5_242_880), (256, 10_485_760)]);
        assert_eq!((f.law, f.evidence), (Law::Linear, Evidence::Confirmed));
        assert_eq!(f.at(512), Some(20_971_520));
        // Attention scores: batch 4 × 32 heads × s² × 4 bytes.
        let f = fit(&[(128, 4 * 32 * 128 * 128 * 4), (256, 4 * 32 * 256 * 256 * 4)]);
        assert_eq!(f.law, Law::Square);
        assert_eq!(f.at(1024), Some(4 * 32 * 1024 * 1024 * 4));
        // A fixed part beside a growing one: determined by two points only.
        let f = fit(&[(100, 1000 + 7 * 100), (200, 1000 + 7 * 200)]);
        assert_eq!((f.law, f.evidence), (Law::Affine, Evidence::Determined));
        assert_eq!(f.at(800), Some(1000 + 7 * 800));
        // A causal mask s(s+1)/2 × 4 B: needs three recordings, and a fourth confirms it.
        let tri = |s: u64| s * (s + 1) / 2 * 4;
        let f = fit(&[(100, tri(100)), (150, tri(150)), (200, tri(200))]);
        assert_eq!(f.law, Law::LinearSquare);
        assert_eq!(f.evidence, Evidence::Confirmed);
        assert_eq!(f.at(4096), Some(tri(4096)));
    }

    #[test]
    fn step_like_sizes_have_a_law_of_their_own() {
        // 1,279 / 1,279 / 1,535 bytes: a plateau, then a step of 256; the quadratic through
        // the three points would be only determined.
        let pts = [(4, 1279), (8, 1279), (16, 1535)];
        let f = fit(&pts);
        assert_eq!((f.law, f.evidence), (Law::Step, Evidence::Determined));
        // Along the line through the smallest and largest, rounded up to the 256-byte grid.
        let at = |x: u64| f.at(x).unwrap();
        assert_eq!(at(16), 1535);
        assert_eq!((at(28) - 255) % 256, 0);
        assert!(at(28) >= 1535 + 12 * 256 / 12);
        // Alternatives: the plateau goes on; the next step comes at the last rate.
        let alts = alternatives(&pts, &f);
        assert_eq!(alts.iter().map(|g| g.at(64).unwrap()).collect::<Vec<_>>(), vec![1535, 1535 + 48 * 32]);
        // A cap (a plateau at the top) stays where it is.
        let mib = 1 << 20;
        let cap = [(4, 64 * mib), (8, 128 * mib), (16, 132 * mib), (32, 132 * mib)];
        let f = fit(&cap);
        assert_eq!((f.law, f.at(170)), (Law::Step, Some(132 * mib)));
        // Not step-like: growing without a plateau, or shrinking.
        assert_ne!(fit(&[(4, 100), (8, 300), (16, 400)]).law, Law::Step);
        assert_ne!(fit(&[(4, 500), (8, 500), (16, 400)]).law, Law::Step);
    }

    #[test]
    fn alternatives_only_where_the_recordings_leave_the_law_open() {
        // Confirmed and constant laws: none.
        assert!(alternatives(&[(1, 10), (2, 20), (4, 40)], &fit(&[(1, 10), (2, 20), (4, 40)])).is_empty());
        assert!(alternatives(&[(1, 10), (2, 10)], &fit(&[(1, 10), (2, 10)])).is_empty());
        // A line only determined by two points: the quadratics through them.
        let two = [(100, 1700), (200, 2400)];
        let alts = alternatives(&two, &fit(&two));
        assert_eq!(alts.iter().map(|g| g.law).collect::<Vec<_>>(), vec![Law::LinearSquare, Law::ConstantSquare]);
        for g in &alts {
            assert_eq!((g.at(100), g.at(200)), (Some(1700), Some(2400)), "{:?}", g.law);
            assert_ne!(g.at(800), fit(&two).at(800));
        }
        // A quadratic only determined by three points: the line through the two largest.
        let three = [(4, 64), (8, 128), (16, 132)];
        let f = fit(&three);
        assert_eq!((f.law, f.evidence), (Law::Quadratic, Evidence::Determined));
        let alts = alternatives(&three, &f);
        assert_eq!(alts.len(), 1);
        assert_eq!(alts[0].at(24), Some(136));
    }

    #[test]
    fn unfit_and_single() {
        // Three sizes no law of degree ≤ 2 with ≤ 2 parameters gives, and a fourth that
        // breaks the quadratic: listed as unfit, extrapolated along the last segment.
        let pts = [(1, 10), (2, 30), (3, 20), (4, 90)];
        let f = fit(&pts);
        assert_eq!((f.law, f.evidence), (Law::Unfit, Evidence::Unfitted));
        assert_eq!(f.at(5), Some(160));
        let f = fit(&[(7, 123)]);
        assert_eq!((f.law, f.evidence, f.at(1000)), (Law::Single, Evidence::Unfitted, Some(123)));
        // A shrinking size that reaches nothing.
        assert_eq!(fit(&[(1, 200), (2, 100)]).at(3), None);
    }
}
