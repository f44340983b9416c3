//! The store's own proof of what it acknowledged: a high-water mark of durable commits, kept
//! outside sled's files and checked at every open.
//!
//! sled 0.34 recovers from a damaged log (a truncated data file, garbage in it) by cutting the
//! log at the first bad record, and opens what is left as if nothing had happened. For
//! payhook that would be a silent loss of money: a callback acknowledged with 200 is never
//! sent again, so a booking lost with the log is gone without a trace. So:
//!
//! * every committed batch carries a **seal** in sled (key `m\0seal`): the store's id, the
//!   commit's number and its time — written in the same atomic batch as the records;
//! * once the batch is durable, and **before anyone is answered**, the commit's number is
//!   written to `payhook.watermark` beside sled's files and made durable too;
//! * at open, sled's seal must carry this store's id and a number at least the watermark's.
//!   Otherwise the store refuses to open with an [`IntegrityError`] that says what is
//!   missing (how many acknowledged commits, and from when to when) and what to do.
//!
//! **Never a false alarm.** The watermark is written only after sled holds the commit
//! durably, so after a crash at any moment sled's seal is at least the watermark (it is one
//! ahead when the crash fell between the two writes; the watermark catches up at the next
//! open). Sweeps write no seal: they acknowledge nothing.
//!
//! **The operator's decision.** When a store has lost something, the service stays down
//! until an operator restores a backup or says to serve on what is left:
//! [`super::SledStore::accept_loss`] (`payhook store accept-loss`) moves the watermark down
//! to what sled holds, logs it at error level and appends a line to `payhook.audit.log` in
//! the store's directory. What was lost is recovered after that, since the commands that
//! read the store refuse it before: `payhook reconcile --admin-url`, through the service
//! started again, books what the store no longer holds. A restored backup holds its own watermark, so the check passes on it while
//! what was booked after the backup is missing too: that period is reconciled the same way.
//!
//! ## The file
//!
//! Two 64-byte slots, written alternately (commit *n* into slot *n* mod 2), each: the magic
//! `PHWM`, the format version (u32, big-endian), the store id (16 bytes), the commit number
//! (u64), the commit time in ms since the Unix epoch (u64), the first 8 bytes of the SHA-256
//! of those 40 bytes, and zeros. A write torn by a power failure damages one slot; the other
//! still holds the commit before. The valid slot with the higher number is the watermark.

use std::{
    fmt,
    fs::{File, OpenOptions},
    io::{Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    sync::Mutex,
};

use chrono::{DateTime, Utc};

use super::staging::lock;
use super::{StoreError, keys, ms_from_time, time_from_ms};

/// The watermark's file name, in the store's directory.
pub(crate) const FILE_NAME: &str = "payhook.watermark";
/// The operators' decisions about this store, one line each, in its directory.
pub(crate) const AUDIT_FILE_NAME: &str = "payhook.audit.log";

const MAGIC: &[u8; 4] = b"PHWM";
const VERSION: u32 = 1;
const SLOT: usize = 64;
/// Bytes of a slot covered by its checksum.
const BODY: usize = 40;

/// The seal of one commit: which store, which commit, when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    /// The store's id, chosen when it was created.
    pub store_id: uuid::Uuid,
    /// The commit's number: 0 at creation, one more for every committed batch.
    pub commit: u64,
    /// When the commit was made (UTC); stored as ms since the Unix epoch.
    pub at: DateTime<Utc>,
}

impl Seal {
    /// The value stored under [`keys::SEAL`].
    pub(crate) fn encode(&self) -> Vec<u8> {
        [
            self.store_id.as_bytes().as_slice(),
            &self.commit.to_be_bytes(),
            &ms_from_time(self.at).to_be_bytes(),
        ]
        .concat()
    }

    /// `None` unless `bytes` is exactly what [`Self::encode`] writes (32 bytes).
    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != 32 {
            return None;
        }
        Some(Self {
            store_id: uuid::Uuid::from_slice(bytes.get(..16)?).ok()?,
            commit: u64::from_be_bytes(bytes.get(16..24)?.try_into().ok()?),
            at: time_from_ms(u64::from_be_bytes(bytes.get(24..32)?.try_into().ok()?)),
        })
    }

    fn time(&self) -> String {
        self.at.to_rfc3339()
    }
}

impl fmt::Display for Seal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "commit #{} of {}", self.commit, self.time())
    }
}

/// What [`super::SledStore::check`] found: the store is sound, or what it lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityReport {
    /// The store's directory.
    pub path: PathBuf,
    /// The last commit sled holds.
    pub held: Seal,
}

impl fmt::Display for IntegrityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "store at {} is sound: it holds every acknowledged commit, the last being {} (store id {})",
            self.path.display(),
            self.held,
            self.held.store_id
        )
    }
}

/// A store that cannot prove it still holds everything it acknowledged. Each message names
/// the directory, what is missing and what the operator can do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum IntegrityError {
    /// sled holds fewer commits than were acknowledged: its log was damaged and cut short.
    #[error(
        "the store at {} has lost acknowledged writes: {} acknowledged commits are missing, \
         made between {} and {} (sled holds {}, but {} was acknowledged). The aggregator will \
         not resend what was acknowledged. Restore the directory from a backup (what was \
         booked after the backup is missing then too, and no check can tell: recover that \
         period as below), or run `payhook store accept-loss --data {}` to serve on what is \
         left; then start the service and recover the bookings of that period: `payhook \
         reconcile --admin-url URL --ref ...` books again what the store lost (a handler that \
         books outside payhook's store must skip a nonce it booked before), and the \
         aggregator's reports",
        path.display(), acknowledged.commit.saturating_sub(held.map_or(0, |h| h.commit)),
        held.map_or_else(|| "the store's creation".to_owned(), |h| h.time()),
        acknowledged.time(), describe(*held), acknowledged, path.display()
    )]
    LostCommits {
        /// The store's directory.
        path: PathBuf,
        /// The last commit sled still holds (`None`: none at all, e.g. an emptied data file).
        held: Option<Seal>,
        /// The last commit acknowledged.
        acknowledged: Seal,
    },
    /// sled's data belongs to another store than this directory's watermark.
    #[error(
        "the store at {} holds the data of another store (id {}, {}) than the one whose \
         commits were acknowledged here (id {}, {}): its data file was replaced. Put the \
         right data file back, or, to serve on this data and give up the other store's \
         records, run `payhook store accept-loss --data {}`",
        path.display(), held.store_id, held, acknowledged.store_id, acknowledged,
        path.display()
    )]
    ForeignData {
        /// The store's directory.
        path: PathBuf,
        /// The seal of the data found.
        held: Seal,
        /// The last commit acknowledged in this directory.
        acknowledged: Seal,
    },
    /// The watermark file is missing or unreadable while sled holds acknowledged commits.
    #[error(
        "the store at {} cannot prove it holds everything it acknowledged: its watermark \
         file {FILE_NAME} is {}, and sled holds {}. If the directory was copied without it, \
         copy it too; otherwise check the data against the aggregator's reports and run \
         `payhook store accept-loss --data {}`",
        path.display(), if *missing { "missing" } else { "damaged" }, describe(*held),
        path.display()
    )]
    Watermark {
        /// The store's directory.
        path: PathBuf,
        /// `true`: missing; `false`: no slot of it is valid.
        missing: bool,
        /// The last commit sled holds, if any.
        held: Option<Seal>,
    },
    /// sled holds a seal payhook cannot read: the record of its last commit is damaged, so
    /// what it holds cannot be compared with what was acknowledged.
    #[error(
        "the store at {} cannot prove it holds everything it acknowledged: sled's seal (the \
         record of its last commit, key `m\\0seal`) is damaged, and {}. Restore the directory \
         from a backup, or run `payhook store accept-loss --data {}` to seal it anew and serve \
         on what it holds; then start the service and check it against the aggregator's \
         reports (`payhook reconcile --admin-url URL --ref ...` books again what the store \
         lost)",
        path.display(),
        acknowledged.map_or_else(
            || "no watermark says what was acknowledged".to_owned(),
            |mark| format!("{mark} was acknowledged")
        ),
        path.display()
    )]
    DamagedSeal {
        /// The store's directory.
        path: PathBuf,
        /// The last commit acknowledged, when the watermark says.
        acknowledged: Option<Seal>,
    },
    /// sled could not read its own files (its configuration or log is damaged).
    #[error(
        "the store at {} is damaged: sled cannot read it ({reason}). Restore the directory \
         from a backup; to start an empty store instead, move the directory away (payhook \
         cannot tell what it had acknowledged without it)",
        path.display()
    )]
    Unreadable {
        /// The store's directory.
        path: PathBuf,
        /// sled's error.
        reason: String,
    },
}

/// What sled holds, in words.
fn describe(held: Option<Seal>) -> String {
    held.map_or_else(|| "no commit at all".to_owned(), |h| h.to_string())
}

/// The watermark of an open store, advanced by the writer after each durable commit.
pub(crate) struct Watermark {
    /// The file, and the seal it holds. Only the committing leader touches it; the lock
    /// is never contended.
    state: Mutex<(File, Seal)>,
}

impl fmt::Debug for Watermark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watermark").finish_non_exhaustive()
    }
}

/// What the directory holds, read without changing anything.
struct Found {
    held: Option<Seal>,
    /// sled holds a seal that does not decode (`held` is then `None`).
    damaged_seal: bool,
    /// `None`: no watermark file; `Some(None)`: a file with no valid slot.
    watermark: Option<Option<Seal>>,
}

impl Found {
    fn read(dir: &Path, tree: &sled::Tree) -> Result<Self, StoreError> {
        let stored = tree.get(keys::SEAL)?;
        let held = stored.as_deref().and_then(Seal::decode);
        let damaged_seal = stored.is_some() && held.is_none();
        let watermark = match File::open(dir.join(FILE_NAME)) {
            Ok(mut file) => {
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes).map_err(|e| io_error(dir, e))?;
                Some(read_slots(&bytes))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_error(dir, e)),
        };
        Ok(Self {
            held,
            damaged_seal,
            watermark,
        })
    }

    /// Checks sled's seal against the watermark: the seal the store continues from, `None`
    /// for a store never sealed (new, or written by a payhook before seals), or what is lost.
    fn verdict(&self, dir: &Path) -> Result<Option<Seal>, IntegrityError> {
        let path = dir.to_path_buf();
        if self.damaged_seal {
            return Err(IntegrityError::DamagedSeal {
                path,
                acknowledged: self.watermark.flatten(),
            });
        }
        match (self.held, self.watermark) {
            (None, None) => Ok(None),
            // Created, and cut off before the first commit was acknowledged.
            (None, Some(Some(mark))) if mark.commit == 0 => Ok(None),
            (held, Some(Some(mark))) => match held {
                Some(held) if held.store_id != mark.store_id => Err(IntegrityError::ForeignData {
                    path,
                    held,
                    acknowledged: mark,
                }),
                Some(held) if held.commit >= mark.commit => Ok(Some(held)),
                _ => Err(IntegrityError::LostCommits {
                    path,
                    held,
                    acknowledged: mark,
                }),
            },
            // Sealed, and cut off before its watermark file was created.
            (Some(held), None) if held.commit == 0 => Ok(Some(held)),
            (held, watermark) => Err(IntegrityError::Watermark {
                path,
                missing: watermark.is_none(),
                held,
            }),
        }
    }
}

impl Watermark {
    /// Checks the store in `dir` (sled already open on `db`) and returns its watermark and
    /// the seal the next commit follows; seals a new store.
    pub(crate) fn open(dir: &Path, db: &sled::Db, tree: &sled::Tree) -> Result<Self, StoreError> {
        let found = Found::read(dir, tree)?;
        let start = match found.verdict(dir)? {
            Some(seal) => seal,
            None => seal_new(dir, db, tree, found.watermark.flatten())?,
        };
        let watermark = Self::create_or_open(dir, start)?;
        Ok(watermark)
    }

    /// Checks the store in `dir` without writing anything.
    pub(crate) fn check(dir: &Path, tree: &sled::Tree) -> Result<IntegrityReport, StoreError> {
        let found = Found::read(dir, tree)?;
        let held = found.verdict(dir)?.unwrap_or(Seal {
            store_id: uuid::Uuid::nil(),
            commit: 0,
            at: DateTime::<Utc>::UNIX_EPOCH,
        });
        Ok(IntegrityReport {
            path: dir.to_path_buf(),
            held,
        })
    }

    /// The operator's decision to serve on what sled holds: the watermark moves to sled's
    /// seal (a new seal when sled holds none, or one that does not decode). Returns what was
    /// given up, if anything.
    pub(crate) fn accept_loss(
        dir: &Path,
        db: &sled::Db,
        tree: &sled::Tree,
    ) -> Result<Option<IntegrityError>, StoreError> {
        let found = Found::read(dir, tree)?;
        let verdict = found.verdict(dir);
        let given_up = verdict.as_ref().err().cloned();
        let seal = match (verdict, found.held) {
            (Ok(Some(seal)), _) | (_, Some(seal)) => seal,
            (_, None) => seal_new(dir, db, tree, None)?,
        };
        Self::write_file(dir, seal)?;
        if let Some(lost) = &given_up {
            let line = format!(
                "{} accept-loss: serving on {} (store id {}); given up: {}\n",
                chrono::Utc::now().to_rfc3339(),
                seal,
                seal.store_id,
                lost
            );
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(AUDIT_FILE_NAME))
                .and_then(|mut file| {
                    file.write_all(line.as_bytes())?;
                    file.sync_data()
                })
                .map_err(|e| io_error(dir, e))?;
            tracing::error!(
                path = %dir.display(),
                given_up = %lost,
                "an operator accepted the loss of acknowledged writes; the store serves on what it holds"
            );
        }
        Ok(given_up)
    }

    /// The seal of the store's newest durable commit.
    pub(crate) fn last(&self) -> Seal {
        lock(&self.state).1
    }

    /// The next commit's seal (not yet written).
    pub(crate) fn next(&self, at_ms: u64) -> Seal {
        let last = lock(&self.state).1;
        Seal {
            store_id: last.store_id,
            commit: last.commit.saturating_add(1),
            at: time_from_ms(at_ms),
        }
    }

    /// Records that `seal`'s commit is durable in sled: written and made durable before
    /// anyone is answered.
    pub(crate) fn advance(&self, seal: Seal) -> Result<(), StoreError> {
        let mut state = lock(&self.state);
        write_slot(&mut state.0, &seal)
            .and_then(|()| state.0.sync_data())
            .map_err(|e| StoreError::backend("writing the watermark failed", e))?;
        state.1 = seal;
        Ok(())
    }

    fn create_or_open(dir: &Path, start: Seal) -> Result<Self, StoreError> {
        let path = dir.join(FILE_NAME);
        if !path.exists() {
            Self::write_file(dir, start)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_error(dir, e))?;
        // Catch up after a crash between sled's commit and the watermark's.
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| io_error(dir, e))?;
        if read_slots(&bytes).is_none_or(|mark| mark.commit < start.commit) {
            write_slot(&mut file, &start)
                .and_then(|()| file.sync_data())
                .map_err(|e| io_error(dir, e))?;
        }
        Ok(Self {
            state: Mutex::new((file, start)),
        })
    }

    /// Writes a whole new watermark file holding `seal`, atomically (a temporary file,
    /// renamed over the old one).
    fn write_file(dir: &Path, seal: Seal) -> Result<(), StoreError> {
        let path = dir.join(FILE_NAME);
        let temporary = dir.join(format!("{FILE_NAME}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut file = File::create(&temporary)?;
            file.write_all(&[0; 2 * SLOT])?;
            write_slot(&mut file, &seal)?;
            file.sync_all()?;
            std::fs::rename(&temporary, &path)?;
            File::open(dir)?.sync_all()
        };
        write().map_err(|e| io_error(dir, e))
    }
}

/// Seals a store that has no seal yet: a new id (or the watermark's, when its creation was
/// cut off), commit 0, durable in sled.
fn seal_new(
    dir: &Path,
    db: &sled::Db,
    tree: &sled::Tree,
    watermark: Option<Seal>,
) -> Result<Seal, StoreError> {
    let seal = Seal {
        store_id: watermark.map_or_else(uuid::Uuid::new_v4, |w| w.store_id),
        commit: 0,
        at: time_from_ms(super::now_ms()),
    };
    tree.insert(keys::SEAL, seal.encode())?;
    db.flush()?;
    File::open(dir.join("db"))
        .and_then(|file| file.sync_data())
        .map_err(|e| io_error(dir, e))?;
    Ok(seal)
}

fn write_slot(file: &mut File, seal: &Seal) -> std::io::Result<()> {
    let mut slot = [0u8; SLOT];
    slot[..4].copy_from_slice(MAGIC);
    slot[4..8].copy_from_slice(&VERSION.to_be_bytes());
    slot[8..BODY].copy_from_slice(&seal.encode());
    let digest = ring::digest::digest(&ring::digest::SHA256, &slot[..BODY]);
    slot[BODY..BODY + 8].copy_from_slice(&digest.as_ref()[..8]);
    let offset = (seal.commit % 2) * SLOT as u64;
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(&slot)
}

/// The watermark in a file's bytes: its valid slot with the higher commit.
fn read_slots(bytes: &[u8]) -> Option<Seal> {
    bytes
        .chunks(SLOT)
        .take(2)
        .filter_map(read_slot)
        .max_by_key(|seal| seal.commit)
}

fn read_slot(slot: &[u8]) -> Option<Seal> {
    let body = slot.get(..BODY)?;
    let digest = ring::digest::digest(&ring::digest::SHA256, body);
    let valid = body.starts_with(MAGIC)
        && body[4..8] == VERSION.to_be_bytes()
        && slot.get(BODY..BODY + 8)? == &digest.as_ref()[..8];
    valid.then(|| Seal::decode(&body[8..])).flatten()
}

fn io_error(dir: &Path, error: std::io::Error) -> StoreError {
    StoreError::backend(format!("the store's watermark in {}", dir.display()), error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal(commit: u64) -> Seal {
        Seal {
            store_id: uuid::Uuid::from_u128(7),
            commit,
            at: time_from_ms(1_700_000_000_000 + commit),
        }
    }

    #[test]
    fn the_higher_valid_slot_is_the_watermark_and_a_torn_slot_leaves_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w");
        let mut file = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        file.write_all(&[0; 2 * SLOT]).unwrap();
        for commit in 0..=5 {
            write_slot(&mut file, &seal(commit)).unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        assert_eq!(read_slots(&bytes), Some(seal(5)));
        // Commit 5 is in slot 1; tear it.
        bytes[SLOT + 20] ^= 0xff;
        assert_eq!(read_slots(&bytes), Some(seal(4)));
        bytes[20] ^= 0xff;
        assert_eq!(read_slots(&bytes), None);
        assert_eq!(read_slots(b"garbage"), None);
    }

    #[test]
    fn seals_read_back() {
        assert_eq!(Seal::decode(&seal(9).encode()), Some(seal(9)));
        assert_eq!(Seal::decode(&[1, 2, 3]), None);
    }
}
