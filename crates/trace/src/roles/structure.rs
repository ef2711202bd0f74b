//! The model's layer structure, from the sizes of the blocks that hold it: what tells
//! the parameters of a recording that has no backward pass to give their sizes (a
//! forward-only benchmark, an `inference_mode` run, a recording begun after training).
//!
//! A model is built of layers that repeat: a transformer's block makes the same tensors
//! (four attention matrices, two or three MLP matrices, two norms) once per layer, so the
//! sizes of its parameters form one multiset repeated `L` times, plus a few tensors
//! outside the layers (the embedding and the output head, whose sizes hold the
//! vocabulary; a final norm). Gradients and each of Adam's moments are one more block of
//! every parameter's size, so a training state is `k` whole copies of that multiset
//! (1 = the weights alone; 2, 3, 4 = the weights with gradients and optimizer moments).
//! Buffers (RoPE tables, an `inv_freq`) are not copied with them.
//!
//! [`find`] reads the counts of the blocks' sizes and gives the copies, the layers and the
//! sizes that belong to the model ([`Found`]); it decides nothing when the sizes show no
//! repeated layer, and says so when they show two models' layers (a process that ran
//! two configurations), since which one the recording runs is not in the sizes.
//!
//! Principal types: [`Structure`], [`Found`].

use std::collections::BTreeMap;

use serde::Serialize;

/// The most blocks of one size a layer makes (per copy): attention's q, k, v, o and a
/// gated MLP's three matrices share sizes; a count that would need more per layer is
/// read as more layers instead.
const MAX_PER_LAYER: usize = 8;
/// The same for vectors (a size under 1/64 of the largest in the counts): the width-sized
/// ones come more often (four attention biases, the output projection's, two layer
/// norms' weights and biases: 9 in OPT).
const MAX_VECTORS_PER_LAYER: usize = 12;
/// The most copies of the parameters a training state holds (weights, gradients, Adam's
/// two moments).
const MAX_COPIES: usize = 4;
/// The most distinct sizes a layer's weights come in (attention's q/o and k/v under
/// grouped-query attention, the MLP's two orientations, norms, biases).
const MAX_LAYER_SIZES: usize = 6;
/// One layer's tensors: (tensor bytes, how many of that size).
type Layer = Vec<(u64, usize)>;
/// The most layers looked for.
const MAX_LAYERS: usize = 1024;
/// Tensors outside the layers (embedding, head, final norm, positions): at most this
/// many of one size per copy.
const MAX_OUTSIDE: usize = 4;

/// One model's structure, as the sizes show it (module doc). In JSON under
/// `roles.model_state` (docs/json-schema.md).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Structure {
    /// Layers: the per-layer multiset repeats this many times.
    pub layers: usize,
    /// One layer's tensors: (tensor bytes, how many of that size), largest first.
    pub per_layer: Vec<(u64, usize)>,
    /// The tensors outside the layers (embedding, output head, final norm, buffers), one
    /// copy: (tensor bytes, how many), largest first.
    pub outside_layers: Vec<(u64, usize)>,
    /// Whole copies of the multiset live: 1 = the weights; more = the weights with
    /// gradients and optimizer state, which the sizes alone do not tell apart.
    pub copies: usize,
    /// Bytes of one copy (the parameters).
    pub copy_bytes: u64,
    /// Sizes of the per-layer tensors whose half-size casts (autocast's bf16/fp16 copy of
    /// a weight, made at the layer that reads it) the trace shows.
    pub half_size_casts: usize,
}

impl Structure {
    /// Blocks of size `s` per copy, or 0 when `s` is not the model's.
    pub fn per_copy(&self, s: u64) -> usize {
        let inside = self.per_layer.iter().find(|x| x.0 == s).map_or(0, |x| x.1 * self.layers);
        inside + self.outside_layers.iter().find(|x| x.0 == s).map_or(0, |x| x.1)
    }

    /// "32 layers of 9 tensors (3 × 100.00 MiB, 4 × 25.00 MiB, …) and 4 tensors outside
    /// them, 1 copy of 12.69 GiB".
    pub fn describe(&self) -> String {
        let fs = fragscope_alloc::format_size;
        let list = |v: &[(u64, usize)]| {
            let mut s: Vec<String> = v.iter().take(4).map(|(b, c)| format!("{c} × {}", fs(*b))).collect();
            if v.len() > 4 {
                s.push("…".into());
            }
            s.join(", ")
        };
        let n: usize = self.per_layer.iter().map(|x| x.1).sum();
        let out: usize = self.outside_layers.iter().map(|x| x.1).sum();
        format!(
            "{} layers of {n} tensors ({}) and {out} tensor(s) outside them ({}); {} cop{} of {}",
            self.layers,
            list(&self.per_layer),
            list(&self.outside_layers),
            self.copies,
            if self.copies == 1 { "y" } else { "ies" },
            fs(self.copy_bytes)
        )
    }
}

/// What the sizes show.
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    /// No layer repeated: nothing decided.
    Nothing,
    /// One model.
    One(Structure),
    /// Layers of more than one model (their layer counts): which the recording runs
    /// is not in the sizes.
    Several(Vec<usize>),
    /// Layers (how many) whose tensors come in more distinct sizes (how many) than a
    /// layer's weights do: per-layer state besides the weights (a KV cache, buffers)
    /// repeats with them, and the sizes do not tell which is which.
    Mixed(usize, usize),
}

/// The structure in the counts of the blocks' sizes (`counts`: tensor bytes → blocks;
/// module doc).
pub fn find(counts: &BTreeMap<u64, usize>) -> Found {
    let total: u64 = counts.iter().map(|(s, c)| s * *c as u64).sum();
    if total == 0 {
        return Found::Nothing;
    }
    let k = copies(counts, total);
    // One copy's counts, of the sizes the copies divide (the others are buffers).
    let per: BTreeMap<u64, usize> = counts.iter().filter(|(_, c)| *c % k == 0).map(|(s, c)| (*s, c / k)).collect();
    let Some((layers, per_layer)) = layers_of(&per) else { return Found::Nothing };
    let layered_bytes: u64 = per_layer.iter().map(|(s, m)| s * (m * layers) as u64).sum();
    let per_bytes: u64 = per.iter().map(|(s, c)| s * *c as u64).sum();
    if 3 * layered_bytes < per_bytes {
        return Found::Nothing;
    }
    if per_layer.len() > MAX_LAYER_SIZES {
        return Found::Mixed(layers, per_layer.len());
    }
    // The sizes left: a second model's layers, or tensors outside the layers. Those
    // share the layers' common factor (the width times the element size: a norm is
    // `d`, an embedding `vocab × d`); a size without it (an input batch, a counter) is no
    // tensor of the model.
    let unit = per_layer.iter().fold(0, |g, x| gcd(g, x.0));
    let mut outside = Vec::new();
    let mut rest: BTreeMap<u64, usize> = BTreeMap::new();
    for (&s, &c) in &per {
        let inside = per_layer.iter().find(|x| x.0 == s).map_or(0, |x| x.1 * layers);
        let left = c - inside;
        if left == 0 {
            continue;
        }
        if left <= MAX_OUTSIDE {
            if s % unit == 0 {
                outside.push((s, left));
            }
        } else {
            rest.insert(s, left);
        }
    }
    // Sizes repeated more often than tensors outside the layers come, that the layers do
    // not explain: a second model's (worth more than the accuracy asked of the first).
    let rest_bytes: u64 = rest.iter().map(|(s, c)| s * *c as u64).sum();
    if rest_bytes * 100 > per_bytes {
        let mut several = vec![layers];
        several.extend(layers_of(&rest).map(|x| x.0));
        return Found::Several(several);
    }
    let by_size_desc = |v: &mut Vec<(u64, usize)>| v.sort_by_key(|x| std::cmp::Reverse(x.0));
    let mut per_layer = per_layer;
    by_size_desc(&mut per_layer);
    by_size_desc(&mut outside);
    let copy_bytes = layered_bytes + outside.iter().map(|(s, c)| s * *c as u64).sum::<u64>();
    Found::One(Structure { layers, per_layer, outside_layers: outside, copies: k, copy_bytes, half_size_casts: 0 })
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `s` read again where the trace shows how many layers one pass runs (`pass_layers`,
/// from the steps): a structure of `c·pass_layers` layers (`c` from 2 to
/// [`MAX_COPIES`]) whose tensors outside the layers `c` divides is `c` copies of a model of
/// `pass_layers` layers (the weights and their gradients, say), not one model of more
/// layers than its passes run.
pub fn with_pass_layers(mut s: Structure, pass_layers: usize) -> Structure {
    if s.copies != 1 || pass_layers == 0 || !s.layers.is_multiple_of(pass_layers) {
        return s;
    }
    let c = s.layers / pass_layers;
    if !(2..=MAX_COPIES).contains(&c) || s.outside_layers.iter().any(|x| x.1 % c != 0) {
        return s;
    }
    s.layers = pass_layers;
    s.copies = c;
    for x in s.outside_layers.iter_mut() {
        x.1 /= c;
    }
    s.copy_bytes /= c as u64;
    s
}

/// Whole copies: the most `k` (up to [`MAX_COPIES`]) such that the sizes whose counts
/// `k` divides hold 99 % of the bytes and every other size has fewer than `k` blocks (a
/// buffer, made once, not copied with the parameters). The weights' small tensors (norms,
/// biases) keep a single copy honest: a model with an odd count of norms is one copy even
/// where its large matrices come in pairs.
fn copies(counts: &BTreeMap<u64, usize>, total: u64) -> usize {
    (2..=MAX_COPIES)
        .rev()
        .find(|&k| {
            let whole: u64 = counts.iter().filter(|(_, c)| *c % k == 0).map(|(s, c)| s * *c as u64).sum();
            whole * 100 >= total * 99 && counts.values().all(|c| c % k == 0 || *c < k)
        })
        .unwrap_or(1)
}

/// The layers in one copy's counts: the `L ≥ 3` whose per-layer multiset (sizes counted
/// `m·L + r` times, `1 ≤ m ≤` [`MAX_PER_LAYER`], `r ≤ 2`: a final norm outside; two
/// sizes at least with `r = 0`) holds the most bytes, and of those the most layers (half
/// as many layers with twice the tensors each fit as well). Two "layers" would take in
/// an embedding and its head.
fn layers_of(per: &BTreeMap<u64, usize>) -> Option<(usize, Vec<(u64, usize)>)> {
    let most = per.values().copied().max().unwrap_or(0);
    let largest = per.keys().copied().max().unwrap_or(0);
    // (bytes in the layers, layers, the per-layer multiset) of the best so far.
    let mut best: Option<(u64, usize, Layer)> = None;
    // No model has a thousand layers; the bound keeps a device of a million blocks of one
    // size linear.
    for l in 3..=most.min(MAX_LAYERS) {
        let mut exact = 0;
        let layer: Vec<(u64, usize)> = per
            .iter()
            .filter_map(|(&s, &c)| {
                let m = c / l;
                let cap = if s.saturating_mul(64) < largest { MAX_VECTORS_PER_LAYER } else { MAX_PER_LAYER };
                let fits = (1..=cap).contains(&m) && c % l <= 2;
                exact += usize::from(fits && c % l == 0);
                fits.then_some((s, m))
            })
            .collect();
        if exact < 2 {
            continue;
        }
        let bytes: u64 = layer.iter().map(|(s, m)| s * (m * l) as u64).sum();
        if best.as_ref().is_none_or(|b| bytes >= b.0) {
            best = Some((bytes, l, layer));
        }
    }
    best.map(|(_, l, layer)| (l, layer))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counts of `copies` copies of a model of `layers` layers whose layer holds
    /// `per_layer` and which has `outside` tensors besides, plus `buffers` (not copied).
    fn model(
        layers: usize,
        per_layer: &[(u64, usize)],
        outside: &[(u64, usize)],
        copies: usize,
        buffers: &[(u64, usize)],
    ) -> BTreeMap<u64, usize> {
        let mut c: BTreeMap<u64, usize> = BTreeMap::new();
        for &(s, m) in per_layer {
            *c.entry(s).or_default() += m * layers * copies;
        }
        for &(s, m) in outside {
            *c.entry(s).or_default() += m * copies;
        }
        for &(s, m) in buffers {
            *c.entry(s).or_default() += m;
        }
        c
    }

    /// A transformer layer: d×4d MLP ×3 (gated), d×d attention ×4, two norms (fp32).
    fn transformer(d: u64) -> Vec<(u64, usize)> {
        vec![(16 * d * d, 3), (4 * d * d, 4), (4 * d, 2)]
    }

    fn one(f: Found) -> Structure {
        match f {
            Found::One(s) => s,
            other => panic!("one structure expected, got {other:?}"),
        }
    }

    #[test]
    fn the_layers_of_one_copy_and_the_vocabulary_matrices_outside_them() {
        for (layers, d, vocab) in [(32u64, 2560u64, 10_000u64), (12, 768, 50_257), (24, 1024, 32_000)] {
            let outside = [(4 * vocab * d, 2), (4 * d, 1)];
            let c = model(layers as usize, &transformer(d), &outside, 1, &[(4 * 64, layers as usize), (4, 1)]);
            let s = one(find(&c));
            assert_eq!((s.layers, s.copies), (layers as usize, 1), "{s:?}");
            let params = layers * (16 * d * d * 3 + 4 * d * d * 4 + 8 * d) + 8 * vocab * d + 4 * d;
            // A per-layer buffer counts with the parameters (sizes alone do not tell it
            // apart, and it is small); a counter without the layers' width does not.
            assert_eq!(s.copy_bytes, params + layers * 256);
        }
    }

    #[test]
    fn copies_of_the_multiset_are_the_training_state() {
        let d = 1024;
        let outside = [(4 * 32_000 * d, 2), (4 * d, 1)];
        for k in 1..=4 {
            let c = model(24, &transformer(d), &outside, k, &[(8, 1)]);
            let s = one(find(&c));
            assert_eq!((s.layers, s.copies), (24, k), "{k} copies: {s:?}");
            assert_eq!(s.per_copy(4 * d * d), 24 * 4);
        }
    }

    #[test]
    fn two_models_layers_are_not_one_model() {
        let mut c = model(32, &transformer(2560), &[(4 * 10_000 * 2560, 2), (4 * 2560, 1)], 1, &[]);
        for (s, n) in model(48, &transformer(1600), &[(4 * 10_000 * 1600, 2), (4 * 1600, 1)], 2, &[]) {
            *c.entry(s).or_default() += n;
        }
        assert!(matches!(find(&c), Found::Several(_)), "{:?}", find(&c));
    }

    #[test]
    fn layers_that_hold_more_than_weights_are_not_the_parameters() {
        // A KV cache per layer (keys and values, and a quantised copy's scales) repeats
        // with the weights.
        let mut layer = transformer(4096);
        layer.extend([(16_384 * 1000, 2), (16_384 * 500, 1), (16_384 * 62, 3), (16_384 * 47, 1)]);
        let c = model(32, &layer, &[(4 * 32_000 * 4096, 2), (4 * 4096, 1)], 1, &[]);
        assert_eq!(find(&c), Found::Mixed(32, 7));
        // Near miss: the weights alone are one model.
        let c = model(32, &transformer(4096), &[(4 * 32_000 * 4096, 2)], 1, &[]);
        assert!(matches!(find(&c), Found::One(_)));
    }

    #[test]
    fn the_layers_a_pass_runs_tell_copies_from_layers() {
        // Two copies of 12 layers whose counts are all even read as 24 layers; a pass
        // that runs 12 says 2 copies. Near miss: a pass of 24 layers changes nothing.
        // (A buffer made five times keeps the counts from showing the copies.)
        let c = model(12, &transformer(768), &[(4 * 10_000 * 768, 2), (4 * 768, 1)], 2, &[(256, 5)]);
        let s = one(find(&c));
        assert_eq!((s.layers, s.copies), (24, 1));
        let t = with_pass_layers(s.clone(), 12);
        assert_eq!((t.layers, t.copies, t.copy_bytes * 2), (12, 2, s.copy_bytes));
        assert_eq!(t.per_copy(4 * 10_000 * 768), 2, "{t:?}");
        assert_eq!(with_pass_layers(s.clone(), 24), s);
    }

    #[test]
    fn sizes_without_a_repeated_layer_decide_nothing() {
        let c: BTreeMap<u64, usize> = [(7 << 20, 1), (3 << 20, 1), (1 << 30, 1)].into_iter().collect();
        assert_eq!(find(&c), Found::Nothing);
        assert_eq!(find(&BTreeMap::new()), Found::Nothing);
    }
}
