//! Sizes in text as PyTorch prints them, so users see the numbers their error message and
//! `torch.cuda.memory_summary()` showed; and the exact counts and percentages beside them,
//! written one way by every front end.

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// PyTorch's `format_size` (§13.1): `"512 bytes"`, `"1024.00 KiB"`, `"12.50 MiB"`,
/// `"1.50 GiB"`. Used for every figure fragscope prints in text, so users see the numbers
/// their error message showed.
pub fn format_size(bytes: u64) -> String {
    if bytes <= KIB {
        format!("{bytes} bytes")
    } else if bytes <= MIB {
        format!("{:.2} KiB", bytes as f64 / KIB as f64)
    } else if bytes <= GIB {
        format!("{:.2} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    }
}

/// An integer with thousands separators (`1,234,567`), for exact figures.
pub fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A fraction as a percentage with one decimal (`"12.5%"`).
pub fn percent(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

#[cfg(test)]
mod tests {
    use super::format_size;

    #[test]
    fn units_switch_past_each_power_of_1024() {
        assert_eq!(format_size(512), "512 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(1 << 20), "1024.00 KiB");
        assert_eq!(format_size(25 << 19), "12.50 MiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }
}
