//! Locks that hold across threads and processes: the tests of one `cargo test` run in
//! parallel threads, and another `make test` may run beside it on the same machine and
//! the same test Slurm. Each lock is a file in the temporary directory, locked with
//! `flock` (a lock is released when its holder ends, however it ends).

use std::fs::File;

/// What the tests of every process on this machine share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    /// This machine's cores, for the tests whose verdict rests on speeds they measure
    /// (held exclusively by each: one at a time, whichever process runs it).
    Measure,
    /// The test Slurm's nodes: a test that drains or fails nodes holds them
    /// exclusively; the other Slurm tests hold them shared.
    SlurmNodes,
}

/// Whether a lock is taken alone or beside others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Beside other shared holders, never beside an exclusive one.
    Shared,
    /// Alone.
    Exclusive,
}

/// `what`, held `how` until the returned file is dropped; blocks until it is free.
pub fn lock(what: Lock, how: Held) -> File {
    let name = match what {
        Lock::Measure => "rubick-tests-measure.lock",
        Lock::SlurmNodes => "rubick-tests-slurm-nodes.lock",
    };
    let path = std::env::temp_dir().join(name);
    let file = File::options().create(true).truncate(false).write(true).open(&path).expect("the lock file opens");
    match how {
        Held::Shared => file.lock_shared(),
        Held::Exclusive => file.lock(),
    }
    .unwrap_or_else(|e| panic!("{}: cannot lock it: {e}", path.display()));
    file
}
