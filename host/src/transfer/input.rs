//! The sender's own data (`--input FILE|-`): read whole into host memory, since the
//! transfer needs its length up front and a chunk may be sent again after its
//! checksum failed. Standard input is read to its end first (it has no length to ask).

use crate::memory::HostBuffer;
use anyhow::{bail, Context, Result};
use std::io::Read;

/// The bytes of `arg`: a file, or standard input for `-`.
pub fn read_input(arg: &str) -> Result<HostBuffer> {
    if arg == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .context("reading standard input")?;
        return buffer_of(&bytes, "standard input");
    }
    let mut file = std::fs::File::open(arg).with_context(|| format!("--input {arg}"))?;
    let len = file
        .metadata()
        .with_context(|| format!("--input {arg}"))?
        .len();
    let len = usize::try_from(len).context("--input is larger than this machine's memory")?;
    if len == 0 {
        bail!("--input {arg} is empty: nothing to send");
    }
    let mut buffer = HostBuffer::zeroed(len)?;
    file.read_exact(buffer.as_bytes_mut())
        .with_context(|| format!("reading --input {arg}"))?;
    let mut more = [0u8; 1];
    if file
        .read(&mut more)
        .with_context(|| format!("reading --input {arg}"))?
        != 0
    {
        bail!("--input {arg} grew while it was read: send a file that does not change");
    }
    Ok(buffer)
}

/// The file name part of `arg`, as a default `--name` (none for standard input).
pub fn default_name(arg: &str) -> Option<String> {
    if arg == "-" {
        return None;
    }
    std::path::Path::new(arg)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

fn buffer_of(bytes: &[u8], what: &str) -> Result<HostBuffer> {
    if bytes.is_empty() {
        bail!("{what} is empty: nothing to send");
    }
    let mut buffer = HostBuffer::zeroed(bytes.len())?;
    buffer.write_at(0, bytes)?;
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_whole_and_an_empty_one_is_refused() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("input-{}.bin", std::process::id()));
        std::fs::write(&path, b"abcde").unwrap();
        let mut b = read_input(path.to_str().unwrap()).unwrap();
        assert_eq!(b.as_bytes(), b"abcde");
        std::fs::write(&path, b"").unwrap();
        let Err(e) = read_input(path.to_str().unwrap()) else {
            panic!("an empty file was taken")
        };
        assert!(e.to_string().contains("is empty"), "{e}");
        std::fs::remove_file(&path).unwrap();
        let Err(e) = read_input("/nonexistent/file") else {
            panic!("a missing file was taken")
        };
        assert!(format!("{e:#}").contains("No such file"), "{e:#}");
        assert_eq!(
            default_name("/a/b/weights.bin").as_deref(),
            Some("weights.bin")
        );
        assert_eq!(default_name("-"), None);
    }
}
