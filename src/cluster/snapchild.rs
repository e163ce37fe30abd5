//! Snapshots made by a forked child, as Redis makes its RDB files: `fork` gives the child a
//! copy-on-write image of the state as of the moment of the call, and the child serialises it
//! to a file, syncs it and exits, while the parent goes on applying, ticking and answering.
//!
//! Why a fork: the owner thread's part is the `fork` call, which copies page tables (about
//! 1/512 of the state's size), not the state; the serialisation, the write and the sync, which
//! grow with the state, are the child's. The state needs no locks, versions or copies of its
//! own, and the file is byte for byte the canonical snapshot that every replica would write at
//! that index. The cost is memory: pages the parent writes while the child runs are copied, at
//! most once each (bounded by the state's size), and the child buffers about 1 MiB
//! ([`crate::core::codec::spill`]). Snapshots are rare (the log must grow by the state's size
//! between two, see `node.rs`), so the copies are short-lived.
//!
//! The child runs only code that is safe after a fork in a threaded process with glibc: it
//! allocates (glibc's fork leaves malloc usable in the child), writes a file and a pipe, and
//! leaves with `_exit`, never through destructors, the log (another thread may hold its lock)
//! or a panic (caught). It dies with its parent (`PR_SET_PDEATHSIG`).
//!
//! Owns the child process and its pipe. Must not decide when to snapshot or what to do with
//! the file: the driver does ([`super::node`]).

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use raft::prelude::SnapshotMetadata;

use super::snapfile::{Descriptor, SnapshotWriter, DESCRIPTOR_LEN};

/// The child's CPU niceness and I/O priority (best effort, lowest level): below the node's.
const CHILD_NICE: libc::c_int = 10;
const IOPRIO_WHO_PROCESS: libc::c_int = 1;
const IOPRIO_CLASS_BE: libc::c_int = 2;
const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
const IOPRIO_BE_LOWEST: libc::c_int = 7;
/// The child hands its file to the disk this many bytes at a time and waits for the piece
/// before the last (Redis's incremental fsync): a multi-GiB file is never all dirty at once, so
/// its final sync is short, and the device never holds more than two pieces of it, so the
/// node's log syncs wait behind at most that much (about a millisecond here).
const WRITEBACK_EVERY: u64 = 1 << 20;
/// The child writes at most this many bytes a second (TiKV's `snap-io-max-bytes-per-sec` is of
/// the same order): unpaced, a child fills the disk's queue at its full speed and a node's log
/// sync waits tens to hundreds of milliseconds behind it (measured here: fsync p99 2.8 ms and
/// max 220 ms beside an unpaced 1.6 GB write, 1.4 ms and 6 ms beside one paced at 150 MB/s in
/// pieces of 1 MiB). A GiB of state takes about ten seconds; the next snapshot is due only when
/// the log has grown by the state's size, which takes far longer at any rate the log syncs.
pub const CHILD_WRITE_RATE: u64 = 100 << 20;

/// A snapshot being written by a child process.
pub struct SnapshotChild {
    pid: libc::pid_t,
    /// The read end of the pipe on which the child sends the file's descriptor.
    pipe: File,
    pub meta: SnapshotMetadata,
    pub tmp: PathBuf,
    pub started: Instant,
    /// How long the parent spent in `fork`.
    pub fork_time: Duration,
    reaped: bool,
}

/// What a finished child left.
pub enum Finished {
    /// The file is written and synced at the child's `tmp` path.
    Done(Descriptor),
    Failed(String),
}

impl SnapshotChild {
    /// Forks a child that writes `write`'s bytes (the state machine's snapshot, as of now) as
    /// the snapshot file `tmp` with metadata `meta`.
    pub fn spawn(
        meta: SnapshotMetadata,
        tmp: PathBuf,
        rate: u64,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<SnapshotChild> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both are open descriptors that nothing else owns.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let parent = std::process::id() as libc::pid_t;
        let t0 = Instant::now();
        // SAFETY: the child only runs `child_main`, which is written for a forked child (see
        // the module docs) and never returns.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            drop(read_end);
            child_main(parent, File::from(write_end), &meta, &tmp, rate, write);
        }
        let fork_time = t0.elapsed();
        drop(write_end);
        Ok(SnapshotChild {
            pid,
            pipe: File::from(read_end),
            meta,
            tmp,
            started: t0,
            fork_time,
            reaped: false,
        })
    }

    /// Whether the child has ended, and how; `None` while it runs. Never blocks.
    pub fn poll(&mut self) -> Option<Finished> {
        if self.reaped {
            return None;
        }
        let mut status: libc::c_int = 0;
        // SAFETY: waits for our own child only, without blocking.
        let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        if r == 0 {
            return None;
        }
        self.reaped = true;
        if r < 0 {
            return Some(Finished::Failed(format!(
                "waitpid: {}",
                io::Error::last_os_error()
            )));
        }
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            let why = if libc::WIFSIGNALED(status) {
                format!("killed by signal {}", libc::WTERMSIG(status))
            } else {
                format!("exit status {}", libc::WEXITSTATUS(status))
            };
            let _ = std::fs::remove_file(&self.tmp);
            return Some(Finished::Failed(format!(
                "the snapshot child failed: {why}"
            )));
        }
        let mut d = [0u8; DESCRIPTOR_LEN];
        match self.pipe.read_exact(&mut d) {
            Ok(()) => match Descriptor::decode(&d) {
                Some(d) => Some(Finished::Done(d)),
                None => Some(Finished::Failed("the snapshot child's answer".into())),
            },
            Err(e) => Some(Finished::Failed(format!(
                "the snapshot child's answer: {e}"
            ))),
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }
}

impl Drop for SnapshotChild {
    /// A child still running is stopped (the node is stopping, or gave up on it) and reaped,
    /// and its file removed, on a thread of their own: a child in its last fsync dies only once
    /// that returns, and unlinking a large file takes time too, neither on the owner's thread.
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: signals our own child.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let (pid, tmp) = (self.pid, std::mem::take(&mut self.tmp));
            let reap = move || {
                // SAFETY: reaps our own child, which nothing else waits for.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                let _ = std::fs::remove_file(&tmp);
            };
            if std::thread::Builder::new()
                .name("holdfast-reap".into())
                .spawn(reap)
                .is_err()
            {
                // SAFETY: as above; without a thread, here (rare).
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            }
        }
    }
}

/// The child: write the file, sync it, send its descriptor, exit. Never returns.
fn child_main(
    parent: libc::pid_t,
    mut answer: File,
    meta: &SnapshotMetadata,
    tmp: &Path,
    rate: u64,
    write: impl FnOnce(&mut Vec<u8>),
) -> ! {
    // SAFETY: prctl, getppid, setpriority and ioprio_set only affect this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            libc::_exit(3);
        }
        // The node's threads come first, for the CPU and the disk: a snapshot may take longer,
        // a lock request must not. (Not SCHED_IDLE: a child starved inside the file system,
        // holding a journal handle, would hold up every sync of the node's log behind it.)
        libc::setpriority(libc::PRIO_PROCESS, 0, CHILD_NICE);
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT | IOPRIO_BE_LOWEST,
        );
    }
    {
        use std::os::fd::AsRawFd;
        close_inherited(answer.as_raw_fd());
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        write_file(meta, tmp, rate, write)
    }));
    let code = match result {
        Ok(Ok(d)) => {
            if answer.write_all(&d.encode()).is_ok() {
                0
            } else {
                4
            }
        }
        Ok(Err(_)) => 1,
        Err(_) => 2,
    };
    // SAFETY: leaves without running destructors or atexit handlers, which belong to the
    // parent's threads.
    unsafe { libc::_exit(code) }
}

/// Closes every descriptor the child inherited but the standard ones and `keep` (the answer
/// pipe): the child holds no socket, listening socket or lock file of the parent's, so that a
/// connection the parent closes sees its end at once (not when the child exits), and the data
/// directory's lock goes with the parent. close_range(2) (Linux 5.9), else one close each.
fn close_inherited(keep: libc::c_int) {
    // SAFETY: closes descriptors of this (child) process only; none of them is used again here.
    unsafe {
        let range = |first: libc::c_int, last: libc::c_uint| -> bool {
            first as libc::c_uint > last
                || libc::syscall(
                    libc::SYS_close_range,
                    first as libc::c_uint,
                    last,
                    0 as libc::c_uint,
                ) == 0
        };
        if range(3, keep.saturating_sub(1) as libc::c_uint) && range(keep + 1, libc::c_uint::MAX) {
            return;
        }
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 {
            rl.rlim_cur.min(1 << 20) as libc::c_int
        } else {
            1 << 16
        };
        for fd in 3..max {
            if fd != keep {
                libc::close(fd);
            }
        }
    }
}

/// A file written front to back whose pages go to the disk as it grows ([`WRITEBACK_EVERY`]).
struct Paced {
    file: File,
    written: u64,
    started_to: u64,
    /// Bytes a second at most (0: as fast as the disk takes them), since `since`.
    rate: u64,
    since: Instant,
}

impl Paced {
    fn new(file: File, rate: u64) -> Paced {
        Paced {
            file,
            written: 0,
            started_to: 0,
            rate,
            since: Instant::now(),
        }
    }

    /// Starts the writeback of what was written since the last call, and waits for the piece
    /// before it (advice: failures are ignored; the final fsync makes the file durable).
    fn pace(&mut self) {
        use std::os::fd::AsRawFd;
        let fd = self.file.as_raw_fd();
        let (from, to) = (self.started_to, self.written);
        // SAFETY: sync_file_range on our own open file, within what was written.
        unsafe {
            if from >= WRITEBACK_EVERY {
                let before = from - WRITEBACK_EVERY;
                libc::sync_file_range(
                    fd,
                    before as libc::off64_t,
                    WRITEBACK_EVERY as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WAIT_BEFORE
                        | libc::SYNC_FILE_RANGE_WRITE
                        | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                );
            }
            libc::sync_file_range(
                fd,
                from as libc::off64_t,
                (to - from) as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.started_to = to;
        if self.rate > 0 {
            let due = Duration::from_secs_f64(to as f64 / self.rate as f64);
            if let Some(ahead) = due.checked_sub(self.since.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
    }
}

impl Write for Paced {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started_to >= WRITEBACK_EVERY {
            self.pace();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// The bytes of the snapshot writer, shared between the spill sink and the code that finishes
/// the file.
struct Shared(Rc<RefCell<SnapshotWriter<Paced>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

/// Writes the snapshot file at `tmp` from `write`'s bytes, streamed a buffer at a time, at
/// most `rate` bytes a second (0: unpaced), and syncs it.
pub fn write_file(
    meta: &SnapshotMetadata,
    tmp: &Path,
    rate: u64,
    write: impl FnOnce(&mut Vec<u8>),
) -> io::Result<Descriptor> {
    let f = Paced::new(File::create(tmp)?, rate);
    let w = Rc::new(RefCell::new(SnapshotWriter::new(f, meta)?));
    crate::core::codec::spill_to(Box::new(Shared(w.clone())), write)?;
    let w = Rc::try_unwrap(w)
        .map_err(|_| io::Error::other("the snapshot writer is still shared"))?
        .into_inner();
    let (f, d) = w.finish()?;
    f.file.sync_all()?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::storage::tests::TempDir;
    use std::net::{TcpListener, TcpStream};

    /// A connection the parent closes while a child writes a snapshot ends at once: the child
    /// holds none of the parent's descriptors.
    #[test]
    fn a_connection_closed_by_the_parent_ends_while_the_child_runs() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let dir = TempDir::new("child-fds");
        let meta = SnapshotMetadata {
            index: 1,
            ..Default::default()
        };
        let mut child = SnapshotChild::spawn(meta, dir.0.join("snap.tmp"), 0, |out| {
            std::thread::sleep(Duration::from_secs(3));
            out.push(1);
        })
        .unwrap();
        drop(server);
        client
            .set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
        let mut b = [0u8; 1];
        let r = client.read(&mut b);
        assert!(
            matches!(r, Ok(0)),
            "the client saw no end of its connection while the child ran: {r:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match child.poll() {
                Some(Finished::Done(_)) => break,
                Some(Finished::Failed(why)) => panic!("{why}"),
                None => {
                    assert!(Instant::now() < deadline, "the child never finished");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// A paced file is never written faster than its rate, and its bytes are what was
    /// written: at 8 MiB a second, 4 MiB take at least half a second.
    #[test]
    fn a_paced_file_keeps_to_its_rate() {
        let dir = TempDir::new("paced");
        let path = dir.0.join("paced");
        let mut p = Paced::new(File::create(&path).unwrap(), 8 << 20);
        let piece: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
        let t0 = Instant::now();
        for _ in 0..64 {
            p.write_all(&piece).unwrap();
        }
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(495),
            "4 MiB written in {took:?}"
        );
        drop(p);
        let back = std::fs::read(&path).unwrap();
        assert_eq!(back.len(), 4 << 20);
        assert!(back.chunks(piece.len()).all(|c| c == piece.as_slice()));
    }
}
