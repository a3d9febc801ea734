//! Files in and out, with one policy for the whole crate.
//!
//! * **Reading:** only regular files (a directory, FIFO, socket or device such as `/dev/zero`
//!   is refused with an error naming the path, before it is opened, so nothing hangs), read up
//!   to the size the file had when opened, into a buffer allocated fallibly.
//! * **Writing:** every file is written to a temporary file in the destination's folder,
//!   flushed and `fsync`ed, then renamed over the destination, and the folder is `fsync`ed. A
//!   crash, a `kill -9` or a full disk therefore leaves the previous file byte for byte (and at
//!   worst a stray `.NAME.kda-tmp-*` file beside it after a kill); an error removes the
//!   temporary. Writing in place (`--state-in S --state-out S`) is safe for the same reason.
//! * Several files that must change together ([`Staged`]) are all written first and renamed
//!   only when every one of them succeeded.

use std::cell::Cell;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{HostError, Result};

/// What kind of file `md` describes, for messages.
fn kind(md: &Metadata) -> &'static str {
    let t = md.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

fn not_regular(path: &Path, md: &Metadata) -> HostError {
    HostError::file(
        path.display().to_string(),
        format!("is {}, not a regular file", kind(md)),
    )
}

/// Checks that `path` is a regular file (symlinks followed) without opening it; returns its
/// length.
pub fn regular_file(path: &Path) -> Result<u64> {
    let md = std::fs::metadata(path).map_err(|e| HostError::io(path, e))?;
    if md.is_file() {
        Ok(md.len())
    } else {
        Err(not_regular(path, &md))
    }
}

/// Opens the regular file `path` for reading; returns it and its length.
pub fn open_regular(path: &Path) -> Result<(File, u64)> {
    // Checked before opening: opening a FIFO for reading blocks until a writer appears.
    regular_file(path)?;
    let f = File::open(path).map_err(|e| HostError::io(path, e))?;
    let md = f.metadata().map_err(|e| HostError::io(path, e))?;
    if !md.is_file() {
        return Err(not_regular(path, &md));
    }
    Ok((f, md.len()))
}

/// `Vec::with_capacity(bytes)`, or an error naming `what` when it cannot be allocated.
pub fn try_buffer(bytes: u64, what: impl FnOnce() -> String) -> Result<Vec<u8>> {
    let alloc_err = |what: String| HostError::Alloc {
        what,
        bytes: bytes as u128,
    };
    let mut v = Vec::new();
    match usize::try_from(bytes) {
        Ok(n) if n <= isize::MAX as usize && v.try_reserve_exact(n).is_ok() => Ok(v),
        _ => Err(alloc_err(what())),
    }
}

/// Reads the regular file `path`: as many bytes as it had when opened, no more.
pub fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let (f, len) = open_regular(path)?;
    let mut v = try_buffer(len, || format!("the contents of {}", path.display()))?;
    f.take(len)
        .read_to_end(&mut v)
        .map_err(|e| HostError::io(path, e))?;
    if v.len() as u64 != len {
        return Err(HostError::file(
            path.display().to_string(),
            format!(
                "shrank from {len} to {} bytes while being read (is another program writing it?)",
                v.len()
            ),
        ));
    }
    Ok(v)
}

thread_local! {
    static FAIL_AFTER: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Test hook: on the calling thread, writes of later [`stage`] calls fail with "no space left
/// on device" once `bytes` bytes have been written (`None` turns the hook off). It stands in
/// for a full disk where a small file system cannot be mounted.
#[doc(hidden)]
pub fn fail_writes_after(bytes: Option<u64>) {
    FAIL_AFTER.with(|c| c.set(bytes));
}

/// The temporary file's writer: counts bytes for the test hook.
struct TempWriter {
    file: File,
    written: u64,
    limit: Option<u64>,
}

impl Write for TempWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(limit) = self.limit {
            if self.written.saturating_add(buf.len() as u64) > limit {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "No space left on device (injected by the test hook)",
                ));
            }
        }
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// The file an output path will replace: `path` itself, or the file a symlink points to (the
/// link is kept). An existing destination must be a regular file.
fn destination(path: &Path) -> Result<PathBuf> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(path.to_path_buf()),
        Err(e) => Err(HostError::io(path, e)),
        Ok(md) if md.file_type().is_symlink() => {
            let target = std::fs::canonicalize(path).map_err(|e| {
                HostError::file(
                    path.display().to_string(),
                    format!("is a symbolic link that cannot be followed: {e}"),
                )
            })?;
            destination(&target)
        }
        Ok(md) if md.is_file() => Ok(path.to_path_buf()),
        Ok(md) => Err(HostError::file(
            path.display().to_string(),
            format!(
                "is {}, not a regular file; only regular files are replaced",
                kind(&md)
            ),
        )),
    }
}

/// The folder holding `path` (`.` for a bare file name).
fn folder(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Checks that `path` can be an output file: its folder exists and is a folder, and the path
/// names a regular file or nothing yet.
pub fn check_output(path: &Path) -> Result<()> {
    let dest = destination(path)?;
    if dest.file_name().is_none() {
        return Err(HostError::file(
            path.display().to_string(),
            "does not name a file",
        ));
    }
    let dir = folder(&dest);
    let problem = match std::fs::metadata(dir) {
        Ok(md) if md.is_dir() => return Ok(()),
        Ok(md) => format!(" is {}", kind(&md)),
        Err(e) => format!(": {e}"),
    };
    Err(HostError::file(
        path.display().to_string(),
        format!("cannot be written: its folder {}{problem}", dir.display()),
    ))
}

/// A file written to a temporary beside its destination and `fsync`ed, waiting for
/// [`Staged::commit`] (or [`commit_all`]) to rename it into place. Dropped uncommitted, it
/// removes the temporary and leaves the destination untouched.
#[derive(Debug)]
pub struct Staged {
    dest: PathBuf,
    tmp: Option<PathBuf>,
}

/// Writes a temporary file for `path` with `write` (through a buffer) and `fsync`s it. Errors
/// name `path`.
pub fn stage(path: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<Staged> {
    static N: AtomicUsize = AtomicUsize::new(0);
    check_output(path)?;
    let dest = destination(path)?;
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let tmp = folder(&dest).join(format!(
        ".{name}.kda-tmp-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| HostError::io(path, e))?;
    // From here on, dropping `staged` removes the temporary.
    let staged = Staged {
        dest,
        tmp: Some(tmp),
    };
    if let Ok(md) = std::fs::metadata(&staged.dest) {
        // Keep the replaced file's permissions.
        let _ = file.set_permissions(md.permissions());
    }
    let raw = TempWriter {
        file,
        written: 0,
        limit: FAIL_AFTER.with(Cell::get),
    };
    let mut w = BufWriter::with_capacity(1 << 20, raw);
    write(&mut w).map_err(|e| HostError::io(path, e))?;
    let raw = w
        .into_inner()
        .map_err(|e| HostError::io(path, e.into_error()))?;
    raw.file.sync_all().map_err(|e| HostError::io(path, e))?;
    Ok(staged)
}

impl Staged {
    /// The file this will replace.
    pub fn destination(&self) -> &Path {
        &self.dest
    }

    fn rename(&mut self) -> Result<()> {
        if let Some(tmp) = &self.tmp {
            std::fs::rename(tmp, &self.dest).map_err(|e| HostError::io(&self.dest, e))?;
            self.tmp = None;
        }
        Ok(())
    }

    /// Renames the temporary over the destination and `fsync`s the folder.
    pub fn commit(self) -> Result<()> {
        commit_all(vec![self])
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

fn sync_folder(dir: &Path) -> Result<()> {
    match File::open(dir).and_then(|d| d.sync_all()) {
        Ok(()) => Ok(()),
        // Some file systems cannot fsync a folder; the rename itself has been done.
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => Ok(()),
        Err(e) => Err(HostError::io(dir, e)),
    }
}

/// Renames every staged file into place (all of them were fully written before), then
/// `fsync`s their folders.
pub fn commit_all(staged: Vec<Staged>) -> Result<()> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for mut s in staged {
        s.rename()?;
        let d = folder(&s.dest).to_path_buf();
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs.iter().try_for_each(|d| sync_folder(d))
}

/// Replaces `path` atomically with what `write` writes.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    stage(path, write)?.commit()
}

/// Replaces `path` atomically with `bytes`.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic(path, |w| w.write_all(bytes))
}

/// Identity of a file for "is this the same file" checks: its canonical path, and its device
/// and inode when it exists (so hard links compare equal too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileId {
    /// Canonical path (of the folder, plus the name, when the file does not exist yet).
    pub path: PathBuf,
    /// `(device, inode)` of an existing file.
    pub inode: Option<(u64, u64)>,
}

impl FileId {
    /// The identity of `path` (which need not exist; its folder must).
    pub fn of(path: &Path) -> Result<Self> {
        let dest = destination(path)?;
        let path = match std::fs::canonicalize(&dest) {
            Ok(p) => p,
            Err(_) => {
                let dir = folder(&dest);
                let dir = std::fs::canonicalize(dir).map_err(|e| HostError::io(dir, e))?;
                dir.join(dest.file_name().unwrap_or_default())
            }
        };
        let inode = std::fs::metadata(&path).ok().and_then(|md| inode(&md));
        Ok(FileId { path, inode })
    }

    /// True when both name the same file.
    pub fn same(&self, other: &FileId) -> bool {
        self.path == other.path || (self.inode.is_some() && self.inode == other.inode)
    }
}

#[cfg(unix)]
fn inode(md: &Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((md.dev(), md.ino()))
}

#[cfg(not(unix))]
fn inode(_: &Metadata) -> Option<(u64, u64)> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kda-fsio-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("kda-tmp"))
            .collect()
    }

    #[test]
    fn atomic_replace_and_injected_failure() {
        let d = tmpdir("atomic");
        let p = d.join("f.bin");
        write_bytes(&p, b"old contents").unwrap();
        write_bytes(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        fail_writes_after(Some(4));
        let e = write_bytes(&p, &[7u8; 1 << 21]).unwrap_err().to_string();
        fail_writes_after(None);
        assert!(e.contains("f.bin") && e.contains("No space left"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert!(leftovers(&d).is_empty(), "{:?}", leftovers(&d));
        // An error from the writer itself also leaves the old file.
        let e = write_atomic(&p, |w| {
            w.write_all(b"partial")?;
            Err(io::Error::other("stop"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("stop"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert!(leftovers(&d).is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn staged_files_change_together() {
        let d = tmpdir("staged");
        let (a, b) = (d.join("a"), d.join("b"));
        write_bytes(&a, b"a0").unwrap();
        write_bytes(&b, b"b0").unwrap();
        let sa = stage(&a, |w| w.write_all(b"a1")).unwrap();
        assert!(stage(&d.join("no/such/b"), |w| w.write_all(b"b1")).is_err());
        drop(sa);
        assert_eq!(std::fs::read(&a).unwrap(), b"a0");
        let sa = stage(&a, |w| w.write_all(b"a1")).unwrap();
        let sb = stage(&b, |w| w.write_all(b"b1")).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"a0");
        commit_all(vec![sa, sb]).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"a1");
        assert_eq!(std::fs::read(&b).unwrap(), b"b1");
        assert!(leftovers(&d).is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn special_files_and_identities() {
        let d = tmpdir("special");
        let e = read_regular(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/dev/zero") && e.contains("character device"),
            "{e}"
        );
        let e = read_regular(&d).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let e = write_bytes(&d, b"x").unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let f = d.join("f");
        write_bytes(&f, b"abc").unwrap();
        assert_eq!(read_regular(&f).unwrap(), b"abc");
        let link = d.join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let hard = d.join("hard");
        std::fs::hard_link(&f, &hard).unwrap();
        let id = FileId::of(&f).unwrap();
        assert!(id.same(&FileId::of(&link).unwrap()));
        assert!(id.same(&FileId::of(&hard).unwrap()));
        assert!(id.same(&FileId::of(&d.join(".").join("f")).unwrap()));
        assert!(!id.same(&FileId::of(&d.join("new")).unwrap()));
        // Writing through the symlink replaces its target and keeps the link.
        write_bytes(&link, b"xyz").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"xyz");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        let _ = std::fs::remove_dir_all(&d);
    }
}
