//! Byte counts for people: `64KiB` in, `16 KiB` out.

const UNITS: [(&str, u64); 4] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
];

/// Parse a byte count: a whole number with an optional binary unit: `B`, `K`/`KiB`,
/// `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (case-insensitive, a space between is allowed).
/// `KB`, `MB`, ... are refused as ambiguous (1000 or 1024?).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "`{text}` is not a size: expected a number of bytes, optionally with a unit (64KiB, 1MiB, 1GiB)"
        ));
    }
    let unit = unit.trim_start();
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" | "mb" | "gb" | "tb" => {
            let binary = format!("{}iB", unit[..1].to_ascii_uppercase());
            return Err(format!(
                "ambiguous unit `{unit}` in `{text}`: write {binary} (powers of 1024) or a plain number of bytes"
            ));
        }
        _ => {
            return Err(format!(
                "unknown unit `{unit}` in `{text}`: use B, KiB, MiB, GiB or TiB (or K, M, G, T)"
            ))
        }
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is too large"))?;
    value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// `16 KiB`, `1.5 MiB`, `256 MiB`, `1000 bytes`.
pub fn format_bytes(n: u64) -> String {
    for (name, size) in UNITS {
        if n >= size {
            if n.is_multiple_of(size) {
                return format!("{} {name}", n / size);
            }
            let value = n as f64 / size as f64;
            let text = format!("{value:.2}");
            let text = text.trim_end_matches('0').trim_end_matches('.');
            return format!("{text} {name}");
        }
    }
    if n == 1 {
        "1 byte".into()
    } else {
        format!("{n} bytes")
    }
}

/// `a` and `b` as [`format_bytes`] shows them, unless the two would read as the same
/// amount while they differ (64 MiB + 4 bytes and 64 MiB both show as "64 MiB", and "size
/// 64 MiB exceeds 64 MiB" says nothing): then both as exact byte counts.
pub fn format_bytes_apart(a: u64, b: u64) -> (String, String) {
    if a != b && shown_amount(a) == shown_amount(b) {
        (exact_bytes(a), exact_bytes(b))
    } else {
        (format_bytes(a), format_bytes(b))
    }
}

/// The byte count the text of [`format_bytes`] stands for: `n` rounded as it is there
/// (to two decimals of its unit).
fn shown_amount(n: u64) -> u64 {
    for (_, size) in UNITS {
        if n >= size {
            let hundredths = (n as f64 / size as f64 * 100.0).round();
            return (hundredths / 100.0 * size as f64) as u64;
        }
    }
    n
}

/// `67108868 bytes`: every digit.
fn exact_bytes(n: u64) -> String {
    if n == 1 {
        "1 byte".into()
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_binary_units() {
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("16384"), Ok(16384));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("16m"), Ok(16 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("256 MiB"), Ok(256 << 20));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size(" 8 kib "), Ok(8192));
    }

    #[test]
    fn bad_sizes_are_refused_with_a_reason() {
        assert!(parse_size("").unwrap_err().contains("not a size"));
        assert!(parse_size("KiB").unwrap_err().contains("not a size"));
        assert!(parse_size("-4").unwrap_err().contains("not a size"));
        assert!(parse_size("1.5MiB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        let e = parse_size("64MB").unwrap_err();
        assert!(e.contains("ambiguous") && e.contains("MiB"), "{e}");
        assert!(parse_size("99999999999999999999")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_size("17179869184GiB")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn byte_counts_read_naturally() {
        assert_eq!(format_bytes(16384), "16 KiB");
        assert_eq!(format_bytes(1 << 30), "1 GiB");
        assert_eq!(format_bytes(2 << 30), "2 GiB");
        assert_eq!(format_bytes(256 << 20), "256 MiB");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(1000), "1000 bytes");
        assert_eq!(format_bytes(1), "1 byte");
        assert_eq!(format_bytes(0), "0 bytes");
    }

    #[test]
    fn two_counts_that_would_read_the_same_are_shown_exactly() {
        let (a, b) = format_bytes_apart((64 << 20) + 4, 64 << 20);
        assert_eq!(
            (a.as_str(), b.as_str()),
            ("67108868 bytes", "67108864 bytes")
        );
        // 1 GiB less 4 bytes rounds to "1024 MiB": the same amount as "1 GiB".
        let (a, b) = format_bytes_apart((1 << 30) - 4, 1 << 30);
        assert_eq!(
            (a.as_str(), b.as_str()),
            ("1073741820 bytes", "1073741824 bytes")
        );
        // Apart as shown: the units stay.
        let (a, b) = format_bytes_apart(2 << 30, 1 << 30);
        assert_eq!((a.as_str(), b.as_str()), ("2 GiB", "1 GiB"));
        let (a, b) = format_bytes_apart(1536, 1024);
        assert_eq!((a.as_str(), b.as_str()), ("1.5 KiB", "1 KiB"));
        let (a, b) = format_bytes_apart(1 << 20, 1 << 20);
        assert_eq!((a.as_str(), b.as_str()), ("1 MiB", "1 MiB"));
    }
}
