//! The scheduler's time slice a latency-bound thread asks for (Linux 6.12 and later, EEVDF):
//! a task with a shorter slice gets an earlier virtual deadline, so when it wakes beside tasks
//! with the default slice (a few milliseconds) it runs at once instead of waiting for one of
//! them to use its slice up. A lock server's I/O thread mostly sleeps in `epoll_wait` and
//! wakes for a few microseconds of work, which is what short slices are for; its share of
//! the CPU under contention does not change (that is its weight, the nice value).
//!
//! Owns: the two libc calls and their `unsafe`. Must not: change the thread's policy, nice
//! value or anything else, or fail loudly (an older kernel ignores the request or refuses it;
//! the thread then runs as before).

/// The slice the threads that serve requests (the I/O workers, the owner) ask for: the
/// shortest the kernel grants. Beside a writer paced at 250 MB/s (`make bench-load`), a lock
/// probe's p99 went from 2.2 ms to 1.7 ms (medians of ten alternating runs; memcached `-t 4`
/// 1.8 ms), the median unchanged, the unpaced writer's rate 5% lower.
pub const SERVING_THREAD_NANOS: u64 = 100_000;

/// `struct sched_attr` as far as `SCHED_ATTR_SIZE_VER0` (48 bytes).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// `SCHED_OTHER`: the only policy whose slice this asks to change.
const SCHED_OTHER: u32 = 0;

/// `SCHED_FLAG_RESET_ON_FORK`: threads and processes this thread creates start with the
/// default slice. A serving thread starts helpers (the cluster owner forks its snapshot
/// children and spawns install, compaction and reaper threads), which are not latency-bound
/// and must not share its head start. (It also starts them at nice 0 if this one runs at a
/// negative nice value.)
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// Ask for a slice of `nanos` (the kernel keeps it within 0.1-100 ms) for the calling thread,
/// not passed on to what it creates. True if the thread has that slice now: a kernel before
/// 6.12 accepts the request and ignores it, which reads back as no slice.
pub fn request_for_this_thread(nanos: u64) -> bool {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: sched_getattr writes at most `size` bytes into a struct we own of that size.
    let got = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &mut attr, size, 0) };
    if got != 0 || attr.policy != SCHED_OTHER {
        return false;
    }
    attr.size = size;
    attr.runtime = nanos;
    attr.flags |= SCHED_FLAG_RESET_ON_FORK;
    // SAFETY: sched_setattr reads a struct we own whose `size` field names its length.
    let set = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr, 0) };
    set == 0 && of_thread(0) == nanos
}

/// The slice thread `tid` of this user has (0 for the calling thread), in nanoseconds: the
/// kernel's default if it asked for none (a kernel before 6.12 reads 0), 0 if it cannot be
/// read.
pub fn of_thread(tid: i32) -> u64 {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: as in `request_for_this_thread`.
    let got = unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut attr, size, 0) };
    if got != 0 {
        return 0;
    }
    attr.runtime
}

#[cfg(test)]
mod tests {
    /// On a kernel that takes the request, the thread's slice is the one asked for, its nice
    /// value is unchanged and a thread it starts has the default slice; on one that does not,
    /// nothing changes.
    #[test]
    fn a_thread_gets_the_slice_it_asks_for_keeps_its_nice_value_and_does_not_pass_it_on() {
        std::thread::spawn(|| {
            // SAFETY: getpriority reads the calling thread's nice value.
            let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            let before = nice();
            let default = super::of_thread(0);
            if super::request_for_this_thread(200_000) {
                assert_eq!(super::of_thread(0), 200_000);
                let child = std::thread::spawn(|| super::of_thread(0)).join().unwrap();
                assert_eq!(child, default, "a thread it starts has the default slice");
            } else {
                assert_eq!(super::of_thread(0), default);
            }
            assert_eq!(nice(), before);
        })
        .join()
        .unwrap();
    }
}
