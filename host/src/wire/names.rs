//! The name a sender gives its transfer (`--name`), after the offer when the header
//! says [`HEADER_FLAG_NAMED`] (TCP). A receiver writing into a directory names the file
//! after it, once [`checked_name`] accepts it.
//!
//! Layout: `0` magic "GRDF", `4` version u16, `6` length u16 (1..=255), `8` the UTF-8
//! bytes.

use super::constants::{NAME_MAGIC, VERSION};
use super::error::{open, WireError};

pub const NAME_PREFIX_LEN: usize = 8;
pub const MAX_NAME_LEN: usize = 255;

/// The name message for `name`, if it is a name a receiver accepts.
pub fn encode_name(name: &str) -> Result<Vec<u8>, WireError> {
    let name = checked_name(name.as_bytes())?;
    let mut out = Vec::with_capacity(NAME_PREFIX_LEN + name.len());
    out.extend_from_slice(&NAME_MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    Ok(out)
}

/// The length of the name that follows this prefix.
pub fn decode_name_prefix(buf: &[u8]) -> Result<usize, WireError> {
    let mut r = open(buf, NAME_MAGIC, NAME_PREFIX_LEN)?;
    let len = r.u16() as usize;
    if len == 0 || len > MAX_NAME_LEN {
        return Err(WireError::BadName { len });
    }
    Ok(len)
}

/// `bytes` as a file name that stays in the directory it is written to and shows as
/// what it is: UTF-8, 1 to 255 bytes, no path separator (`/` or `\`), no NUL or other
/// control character, no Unicode format character ([`is_format_char`]), not `.` or `..`.
pub fn checked_name(bytes: &[u8]) -> Result<&str, WireError> {
    let bad = WireError::BadName { len: bytes.len() };
    let name = std::str::from_utf8(bytes).map_err(|_| bad)?;
    let fine = (1..=MAX_NAME_LEN).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control());
    if !fine {
        return Err(bad);
    }
    match name.chars().find(|&c| is_format_char(c)) {
        Some(c) => Err(WireError::FormatCharInName { code: c as u32 }),
        None => Ok(name),
    }
}

/// Whether `c` is of Unicode's general category Cf (format, Unicode 15.1): not drawn,
/// but it changes how the text around it is drawn (bidirectional overrides and
/// isolates, zero-width characters, the byte order mark, the soft hyphen, ...). The
/// standard library has no such test and a table of its own is short.
pub fn is_format_char(c: char) -> bool {
    matches!(
        c as u32,
        0x00AD
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

/// `text` as it is safe to print to a terminal: control and format characters written
/// as `\u{202e}`, so that a name (or a path holding one) shows as what it is, never
/// reordered or hidden by the characters in it. A backslash stays as it is.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let unseen = |c: char| c.is_control() || is_format_char(c);
    if !text.chars().any(unseen) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unseen(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RejectReason;

    #[test]
    fn names_stay_inside_their_directory() {
        for good in ["weights.bin", "a", "kv cache (3).pt", &"x".repeat(255)] {
            let msg = encode_name(good).unwrap();
            assert_eq!(decode_name_prefix(&msg[..NAME_PREFIX_LEN]), Ok(good.len()));
            assert_eq!(checked_name(&msg[NAME_PREFIX_LEN..]), Ok(good));
        }
        for bad in [
            "",
            ".",
            "..",
            "../etc/passwd",
            "a/b",
            "a\\b",
            "nul\0",
            "tab\t",
            &"x".repeat(256),
        ] {
            assert!(encode_name(bad).is_err(), "{bad:?}");
            assert!(checked_name(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(checked_name(&[0xff, 0xfe]).is_err(), "not UTF-8");
        // Characters that are not drawn but change what is: refused, saying which.
        for (bad, code) in [
            ("report\u{202E}gnp.exe", 0x202E),
            ("a\u{2066}b", 0x2066),
            ("a\u{200F}", 0x200F),
            ("zero\u{200B}width", 0x200B),
            ("\u{FEFF}bom", 0xFEFF),
            ("join\u{2060}er", 0x2060),
            ("soft\u{AD}hyphen", 0xAD),
            ("tag\u{E0041}", 0xE0041),
        ] {
            let e = checked_name(bad.as_bytes()).unwrap_err();
            assert_eq!(e, WireError::FormatCharInName { code }, "{bad:?}");
            assert!(encode_name(bad).is_err(), "{bad:?}");
            let words = e.to_string();
            assert!(
                words.contains(&format!("U+{code:04X}")) && words.contains("format character"),
                "{words}"
            );
        }
        // Letters of other scripts are names like any other.
        for good in ["données.bin", "файл", "模型.safetensors", "עברית.txt"] {
            assert_eq!(checked_name(good.as_bytes()), Ok(good));
        }
        // The reason travels in a reject.
        let reason = RejectReason::BadHeader(WireError::FormatCharInName { code: 0x202E });
        assert_eq!(RejectReason::decode(&reason.encode()), Some(reason));
        let reason = RejectReason::BadHeader(WireError::KeyedVerbsStriping);
        assert_eq!(RejectReason::decode(&reason.encode()), Some(reason));
        let mut long = encode_name("abc").unwrap();
        long[6..8].copy_from_slice(&300u16.to_le_bytes());
        assert_eq!(
            decode_name_prefix(&long[..NAME_PREFIX_LEN]),
            Err(WireError::BadName { len: 300 })
        );
    }

    #[test]
    fn names_print_with_their_unseen_characters_escaped() {
        assert_eq!(printable("weights.bin"), "weights.bin");
        assert_eq!(
            printable("/out/report\u{202E}gnp.exe"),
            "/out/report\\u{202e}gnp.exe"
        );
        assert_eq!(printable("a\tb\u{200B}c"), "a\\u{9}b\\u{200b}c");
        assert_eq!(printable("données"), "données");
    }
}
