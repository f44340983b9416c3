//! sled's blob files, made durable before a commit that may refer to them is acknowledged.
//!
//! sled 0.34 writes a log message larger than about a quarter of a segment (128 KiB with
//! the default 512 KiB segments) to a file of its own, `blobs/<lsn>` beside its data file,
//! and the log holds only a pointer to it. It syncs neither that file nor the directory:
//! `flush()` and payhook's `fdatasync` of the data file make the pointer durable, not what
//! it points to. After a power cut the file may be missing, and sled's recovery then passes
//! over the message without an error (`DanglingBlob`). Such a message is a large value, or
//! a node of sled's tree written whole with its values (a leaf holds up to 16 keys), so
//! effects writing values of a few KiB can make them.
//!
//! So each durable commit, and each sweep, `fsync`s every blob file it has not synced yet,
//! and then the directory, before anyone is answered. Reading the directory costs a commit
//! a few system calls; it holds no file but while a large value lives.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::StoreError;
use super::staging::lock;

/// The blob files of one store, and those already synced.
#[derive(Debug)]
pub(crate) struct Blobs {
    dir: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The blob files known synced.
    synced: HashSet<OsString>,
    /// A sync failed: what it left unwritten may be lost, and a later sync of the same file
    /// through another descriptor can succeed without writing it (Linux reports a write-back
    /// error to the descriptors open when it happened, and may mark the pages clean). Every
    /// later sync fails, so that nothing is acknowledged on top of it.
    failed: bool,
}

impl Blobs {
    /// The blobs of the store in `store_dir`: those a process before left are synced now
    /// (one that stopped without a power cut left them in the page cache, unsynced), and so
    /// is the store's directory, which holds the `blobs` directory's entry.
    pub(crate) fn open(store_dir: &Path) -> Result<Self, StoreError> {
        sync(store_dir)?;
        let blobs = Self {
            dir: store_dir.join("blobs"),
            state: Mutex::default(),
        };
        blobs.sync_new()?;
        Ok(blobs)
    }

    /// `fsync`s each blob file not synced yet, then the directory when there was one (its
    /// entries are what finds them); returns how many there were. A file sled removed
    /// meanwhile is passed over. Once a sync failed, every call fails: see
    /// [`State::failed`].
    pub(crate) fn sync_new(&self) -> Result<usize, StoreError> {
        // Held throughout, so that no sync can pass between a failure and its record.
        let mut state = lock(&self.state);
        if state.failed {
            return Err(StoreError::backend_message(format!(
                "an earlier fsync of a blob file in {} failed: what it left unwritten may be lost",
                self.dir.display()
            )));
        }
        let synced = Self::sync_unsynced(&self.dir, &state.synced);
        match synced {
            Ok((new, present)) => {
                // Only those present: sled removes a blob once nothing refers to it.
                state.synced = present;
                Ok(new)
            }
            Err(error) => {
                state.failed = true;
                Err(error)
            }
        }
    }

    /// Syncs the files of `dir` not in `synced`, and `dir` after them when there were any:
    /// how many, and the files present.
    fn sync_unsynced(
        dir: &Path,
        synced: &HashSet<OsString>,
    ) -> Result<(usize, HashSet<OsString>), StoreError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == ErrorKind::NotFound => return Ok((0, HashSet::new())),
            Err(error) => return Err(failed(dir, error)),
        };
        let mut present = HashSet::with_capacity(synced.len());
        let mut new = 0;
        for entry in entries {
            let entry = entry.map_err(|e| failed(dir, e))?;
            let name = entry.file_name();
            if !synced.contains(&name) {
                match File::open(entry.path()).and_then(|file| file.sync_all()) {
                    Ok(()) => new += 1,
                    Err(error) if error.kind() == ErrorKind::NotFound => continue,
                    Err(error) => return Err(failed(&entry.path(), error)),
                }
            }
            present.insert(name);
        }
        if new > 0 {
            sync(dir)?;
        }
        Ok((new, present))
    }

    /// How many blob files are known synced (for tests).
    #[cfg(test)]
    pub(crate) fn synced(&self) -> usize {
        lock(&self.state).synced.len()
    }
}

/// `fsync`s the file or directory at `path`.
fn sync(path: &Path) -> Result<(), StoreError> {
    File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(|e| failed(path, e))
}

fn failed(path: &Path, error: std::io::Error) -> StoreError {
    StoreError::backend(format!("fsync of {} failed", path.display()), error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_blob_is_synced_once_and_forgotten_once_removed() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::open(dir.path()).unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 0, "no blobs directory yet");
        std::fs::create_dir(dir.path().join("blobs")).unwrap();
        for name in ["1", "2"] {
            std::fs::write(dir.path().join("blobs").join(name), b"blob").unwrap();
        }
        assert_eq!(blobs.sync_new().unwrap(), 2);
        assert_eq!(blobs.sync_new().unwrap(), 0);
        std::fs::remove_file(dir.path().join("blobs/1")).unwrap();
        std::fs::write(dir.path().join("blobs/3"), b"blob").unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 1);
        assert_eq!(blobs.synced(), 2);
        // A store opened again syncs what it finds.
        assert_eq!(Blobs::open(dir.path()).unwrap().synced(), 2);
    }

    /// A file that cannot be synced (here a link to itself, which no `open` follows) fails
    /// the sync, and every one after it, once the file is gone too: a later sync through
    /// a new descriptor would not say what the failed one left unwritten.
    #[test]
    fn once_a_sync_failed_every_later_one_fails() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::open(dir.path()).unwrap();
        let blob_dir = dir.path().join("blobs");
        std::fs::create_dir(&blob_dir).unwrap();
        std::os::unix::fs::symlink("7", blob_dir.join("7")).unwrap();
        assert!(blobs.sync_new().is_err(), "a loop cannot be opened");
        std::fs::remove_file(blob_dir.join("7")).unwrap();
        std::fs::write(blob_dir.join("8"), b"blob").unwrap();
        let error = blobs.sync_new().unwrap_err().to_string();
        assert!(error.contains("an earlier fsync"), "{error}");
    }
}
