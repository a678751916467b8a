//! Where a receiver writes what it received (`host recv --output PATH|-`), so that a
//! file appears under its final name only with every byte verified: the bytes go to a
//! temporary name in the same directory, are flushed to the disk (`fsync`), and only
//! then renamed; a failed check, a killed sender or a full disk leaves no file under the
//! final name, and the temporary one is removed.
//!
//! `PATH` names a file (each transfer replaces it, atomically) or an existing directory:
//! one file per transfer, named after the sender's `--name` (checked by
//! [`checked_name`]: it cannot leave the directory) or, without one, after the peer and
//! a counter. In a directory nothing is ever replaced: the name is the sender's, so a
//! sender could otherwise overwrite any file there; a name taken gets `.1`, `.2`, ...
//! as wget does (the file is hard-linked under the new name, which fails if the name
//! exists, so two transfers of one name cannot both win). `-` is standard output (no
//! atomicity there: whatever reads it sees the bytes as they are written, after they
//! verified).

use crate::wire::checked_name;
use anyhow::{bail, Context, Result};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where received data goes.
#[derive(Debug, Clone)]
pub enum Output {
    Stdout,
    File(PathBuf),
    Dir(PathBuf),
    /// To a library caller: each verified transfer's bytes, with its name, on a channel.
    Memory(std::sync::mpsc::Sender<(Option<String>, Vec<u8>)>),
}

impl Output {
    /// `-`, an existing directory, or a file in an existing directory.
    pub fn parse(arg: &str) -> Result<Output> {
        if arg == "-" {
            return Ok(Output::Stdout);
        }
        let path = PathBuf::from(arg);
        if path.is_dir() {
            return Ok(Output::Dir(path));
        }
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !parent.is_dir() {
            bail!("--output {arg}: {} is not a directory", parent.display());
        }
        if path.file_name().is_none() {
            bail!("--output {arg}: not a file name");
        }
        Ok(Output::File(path))
    }

    /// The final path of a transfer named `name` by its sender (or none) from `peer`,
    /// the `counter`-th this receiver stores; `None` for standard output.
    pub fn final_path(&self, name: Option<&str>, peer: &str, counter: u64) -> Option<PathBuf> {
        match self {
            Output::Stdout | Output::Memory(_) => None,
            Output::File(p) => Some(p.clone()),
            Output::Dir(dir) => {
                let named = name.and_then(|n| checked_name(n.as_bytes()).ok());
                let file = match named {
                    Some(n) => n.to_string(),
                    None => format!("{}-{counter}.bin", peer.replace([':', '[', ']'], "_")),
                };
                Some(dir.join(file))
            }
        }
    }

    /// Write one transfer: `fill` writes its bytes. Returns where they went (`-` for
    /// standard output). Unnamed transfers into a directory are numbered in the order
    /// this process stores them.
    pub fn store(
        &self,
        name: Option<&str>,
        peer: &str,
        fill: impl FnOnce(&mut dyn Write) -> Result<()>,
    ) -> Result<String> {
        static STORED: AtomicU64 = AtomicU64::new(0);
        let counter = STORED.fetch_add(1, Ordering::Relaxed);
        self.store_numbered(name, peer, counter, fill)
    }

    /// [`store`](Output::store) as the `counter`-th transfer.
    pub fn store_numbered(
        &self,
        name: Option<&str>,
        peer: &str,
        counter: u64,
        fill: impl FnOnce(&mut dyn Write) -> Result<()>,
    ) -> Result<String> {
        if let Output::Memory(to) = self {
            let mut bytes = Vec::new();
            fill(&mut bytes)?;
            to.send((name.map(str::to_string), bytes))
                .map_err(|_| anyhow::anyhow!("the caller no longer takes received data"))?;
            return Ok("memory".into());
        }
        let Some(path) = self.final_path(name, peer, counter) else {
            let stdout = std::io::stdout();
            let mut lock = stdout.lock();
            fill(&mut lock).context("writing to standard output")?;
            lock.flush().context("writing to standard output")?;
            return Ok("-".into());
        };
        let mut pending = Pending::create(&path)?;
        fill(&mut pending.file).with_context(|| format!("writing {}", pending.tmp.display()))?;
        let stored = match self {
            Output::Dir(_) => pending.commit_new()?,
            _ => pending.commit()?,
        };
        Ok(stored.display().to_string())
    }
}

/// A file being written under a temporary name beside its final one; removed on drop
/// unless committed.
struct Pending {
    tmp: PathBuf,
    file: File,
    final_path: PathBuf,
    committed: bool,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// `.gpu-rdma-partial-PID-N-RANDOM`: RANDOM is 64 bits from the standard library's
/// hasher keys, which it seeds from the system's random source (no `unsafe`, no
/// dependency), so nobody outside this process can predict it.
fn temp_name(n: u64) -> String {
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one(n);
    format!(".gpu-rdma-partial-{}-{n}-{random:016x}", std::process::id())
}

impl Pending {
    fn create(final_path: &Path) -> Result<Pending> {
        let dir = final_path.parent().unwrap_or(Path::new("."));
        // A fixed prefix, not the final name: a name that fills NAME_MAX (255 bytes)
        // leaves no room for a longer temporary one, and the transfer would be received
        // whole only to fail here. The process id and a counter keep it unique among
        // this process's own; a random part keeps a sender from naming its transfer as
        // the next one will be (and so failing the honest transfer that comes next). A
        // name taken anyway is passed over for the next.
        const TRIES: u32 = 64;
        for _ in 0..TRIES {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let tmp = dir.join(temp_name(n));
            match OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(file) => {
                    return Ok(Pending {
                        tmp,
                        file,
                        final_path: final_path.to_path_buf(),
                        committed: false,
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("creating {}", tmp.display())),
            }
        }
        bail!(
            "creating a temporary file in {}: {TRIES} names in a row were taken",
            dir.display()
        )
    }

    /// Flush to the disk, rename into place (replacing a file of that name), and flush
    /// the directory (so the rename itself survives a crash). Where it went.
    fn commit(mut self) -> Result<PathBuf> {
        self.flush()?;
        fs::rename(&self.tmp, &self.final_path).with_context(|| {
            format!(
                "renaming {} to {}",
                self.tmp.display(),
                self.final_path.display()
            )
        })?;
        self.committed = true;
        self.flush_directory();
        Ok(self.final_path.clone())
    }

    /// As [`commit`](Pending::commit), but never replacing a file: under the final name
    /// if it is free, else the first free of `NAME.1` ... `NAME.999`. A hard link
    /// fails if its name exists, which is what makes "if free" hold against a second
    /// transfer storing the same name at the same moment.
    fn commit_new(self) -> Result<PathBuf> {
        self.flush()?;
        for k in 0..MAX_SUFFIX {
            let candidate = match k {
                0 => self.final_path.clone(),
                k => numbered(&self.final_path, k),
            };
            match fs::hard_link(&self.tmp, &candidate) {
                Ok(()) => {
                    // The temporary name goes on drop; the data stays under `candidate`.
                    self.flush_directory();
                    return Ok(candidate);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "linking {} to {} (the output directory's file system must allow hard links)",
                            self.tmp.display(),
                            candidate.display()
                        )
                    })
                }
            }
        }
        bail!(
            "{} and {MAX_SUFFIX} numbered names after it are taken",
            self.final_path.display()
        )
    }

    fn flush(&self) -> Result<()> {
        self.file
            .sync_all()
            .with_context(|| format!("flushing {}", self.tmp.display()))
    }

    fn flush_directory(&self) {
        let dir = match self.final_path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
}

/// Names tried for one transfer in a directory: `NAME` and `NAME.1` to `NAME.999`.
const MAX_SUFFIX: u32 = 1000;

/// The longest file name the file systems a receiver writes to take (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// `path` with `.k` after its file name, the name cut (on a character boundary) so
/// that the whole still fits [`NAME_MAX`]: a name of 255 bytes that is taken must still
/// get an alternative, not fail with "File name too long" after the whole transfer.
fn numbered(path: &Path, k: u32) -> PathBuf {
    let suffix = format!(".{k}");
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut keep = name.len().min(NAME_MAX - suffix.len());
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    path.with_file_name(format!("{}{suffix}", &name[..keep]))
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("store-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_file_appears_only_whole_and_a_failed_write_leaves_nothing() {
        let dir = temp_dir("file");
        let out = Output::parse(dir.join("data.bin").to_str().unwrap()).unwrap();
        let e = out
            .store_numbered(None, "p", 0, |w| {
                w.write_all(b"half")?;
                bail!("the check failed")
            })
            .unwrap_err();
        assert!(format!("{e:#}").contains("the check failed"));
        assert!(names(&dir).is_empty(), "{:?}", names(&dir));
        let at = out
            .store_numbered(None, "p", 0, |w| Ok(w.write_all(b"whole")?))
            .unwrap();
        assert!(at.ends_with("data.bin"));
        assert_eq!(fs::read(dir.join("data.bin")).unwrap(), b"whole");
        assert_eq!(names(&dir), ["data.bin"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A sender may name its transfer as it guesses this process's next temporary
    /// files will be named (the pid and a counter, as they were named alone before):
    /// the next honest store is not stopped by them. It failed ("creating ...: File
    /// exists"), reported not stored.
    #[test]
    fn names_taken_by_a_sender_that_guesses_the_temporary_ones_are_passed_over() {
        let dir = temp_dir("squat");
        let out = Output::parse(dir.to_str().unwrap()).unwrap();
        let next = TEMP_COUNTER.load(Ordering::Relaxed);
        let pid = std::process::id();
        // Other tests of this process may take counters meanwhile: squat a good stretch.
        for n in next..next + 40 {
            let name = format!(".gpu-rdma-partial-{pid}-{n}");
            fs::write(dir.join(&name), b"squatter").unwrap();
        }
        out.store_numbered(Some("honest.bin"), "p", 0, |w| Ok(w.write_all(b"data")?))
            .unwrap();
        assert_eq!(fs::read(dir.join("honest.bin")).unwrap(), b"data");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Nor can the whole name be guessed: beyond the pid and the counter, its random
    /// part differs from one name to the next.
    #[test]
    fn temporary_names_carry_a_part_nobody_can_guess() {
        let a = temp_name(7);
        let b = temp_name(7);
        let prefix = format!(".gpu-rdma-partial-{}-7-", std::process::id());
        assert!(a.starts_with(&prefix) && b.starts_with(&prefix), "{a} {b}");
        assert_eq!(a.len(), prefix.len() + 16, "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn a_directory_gets_a_file_per_transfer_named_safely() {
        let dir = temp_dir("dir");
        let out = Output::parse(dir.to_str().unwrap()).unwrap();
        assert!(matches!(out, Output::Dir(_)));
        out.store_numbered(Some("weights.bin"), "10.0.0.1:5000", 0, |w| {
            Ok(w.write_all(b"a")?)
        })
        .unwrap();
        // A name that would leave the directory is not used: the peer's is.
        out.store_numbered(Some("../escape"), "10.0.0.1:5000", 1, |w| {
            Ok(w.write_all(b"b")?)
        })
        .unwrap();
        out.store_numbered(None, "[::1]:7", 2, |w| Ok(w.write_all(b"c")?))
            .unwrap();
        assert_eq!(
            names(&dir),
            ["10.0.0.1_5000-1.bin", "___1__7-2.bin", "weights.bin"]
        );
        assert!(!dir.parent().unwrap().join("escape").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn in_a_directory_a_taken_name_is_numbered_never_replaced() {
        let dir = temp_dir("taken");
        let out = Output::parse(dir.to_str().unwrap()).unwrap();
        fs::write(dir.join("notes.txt"), b"the user's own file").unwrap();
        let store = |bytes: &'static [u8]| {
            out.store_numbered(Some("notes.txt"), "p", 0, |w| Ok(w.write_all(bytes)?))
                .unwrap()
        };
        assert!(store(b"first").ends_with("notes.txt.1"));
        assert!(store(b"second").ends_with("notes.txt.2"));
        assert_eq!(
            fs::read(dir.join("notes.txt")).unwrap(),
            b"the user's own file"
        );
        assert_eq!(fs::read(dir.join("notes.txt.1")).unwrap(), b"first");
        assert_eq!(fs::read(dir.join("notes.txt.2")).unwrap(), b"second");
        // No temporary file left behind.
        assert_eq!(names(&dir), ["notes.txt", "notes.txt.1", "notes.txt.2"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_name_of_255_bytes_is_stored_and_its_alternative_is_cut_to_fit() {
        let dir = temp_dir("long");
        let out = Output::parse(dir.to_str().unwrap()).unwrap();
        // 'é' is 2 bytes: 127 of them and one 'x' make 255, and the cut for `.1` must
        // fall between two of them, not inside one.
        let long = format!("{}x", "é".repeat(127));
        assert_eq!(long.len(), 255);
        let store = |bytes: &'static [u8]| {
            out.store_numbered(Some(&long), "p", 0, |w| Ok(w.write_all(bytes)?))
                .unwrap()
        };
        assert!(store(b"first").ends_with(&long));
        let second = store(b"second");
        let cut = format!("{}.1", "é".repeat(126));
        assert!(second.ends_with(&cut), "{second}");
        assert_eq!(fs::read(dir.join(&long)).unwrap(), b"first");
        assert_eq!(fs::read(dir.join(&cut)).unwrap(), b"second");
        let mut want = vec![long.clone(), cut.clone()];
        want.sort();
        assert_eq!(names(&dir), want);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn same_name_stored_at_once_from_many_threads_loses_nothing() {
        let dir = temp_dir("race");
        let out = Output::parse(dir.to_str().unwrap()).unwrap();
        let stored: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8u8)
                .map(|i| {
                    let out = &out;
                    s.spawn(move || {
                        out.store_numbered(Some("same.bin"), "p", 0, |w| Ok(w.write_all(&[i])?))
                            .unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut contents: Vec<u8> = names(&dir)
            .iter()
            .map(|n| fs::read(dir.join(n)).unwrap()[0])
            .collect();
        contents.sort();
        assert_eq!(contents, (0..8).collect::<Vec<u8>>(), "{stored:?}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_output_in_a_missing_directory_is_refused_up_front() {
        let e = Output::parse("/nonexistent-dir-xyz/file").unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
        assert!(matches!(Output::parse("-").unwrap(), Output::Stdout));
    }
}
