//! The binary encoding of the state machine's snapshots (and, later, of its commands in a
//! replicated log): LEB128 varints and length-prefixed byte strings.
//!
//! Owns: the primitive encoders and a checked decoding cursor. Must not: trust its input. A
//! snapshot or log entry read back from disk or from a peer may be truncated or corrupt; every
//! read here is bounds-checked, every length is checked against what is left of the input before
//! anything is allocated for it, and every failure is a [`DecodeError`], never a panic.

use std::fmt;

/// Why bytes could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ended inside a value.
    Truncated,
    /// A value that no encoder writes (a bad tag, an overlong varint, a count over its cap).
    Invalid(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("truncated"),
            DecodeError::Invalid(why) => write!(f, "invalid: {why}"),
        }
    }
}

impl std::error::Error for DecodeError {}

pub type Result<T> = std::result::Result<T, DecodeError>;

/// Append `n` as an unsigned LEB128 varint (1 to 10 bytes).
#[inline]
pub fn put_u64(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

#[inline]
pub fn put_u8(out: &mut Vec<u8>, b: u8) {
    out.push(b);
}

#[inline]
pub fn put_bool(out: &mut Vec<u8>, b: bool) {
    out.push(u8::from(b));
}

/// `None` as a 0 byte, `Some(n)` as a 1 byte and `n`: every value round-trips, `u64::MAX`
/// too (a client's CAS or request id can be anything).
#[inline]
pub fn put_opt_u64(out: &mut Vec<u8>, n: Option<u64>) {
    match n {
        None => out.push(0),
        Some(n) => {
            out.push(1);
            put_u64(out, n);
        }
    }
}

/// A length-prefixed byte string.
#[inline]
pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Where a snapshot streams to, on this thread ([`spill_to`]); none: snapshots stay in memory.
struct SpillSink {
    out: Box<dyn std::io::Write>,
    failed: Option<std::io::Error>,
}

thread_local! {
    static SPILL: std::cell::RefCell<Option<SpillSink>> = const { std::cell::RefCell::new(None) };
}

/// Bytes gathered before [`spill`] hands them on.
const SPILL_AT: usize = 1 << 20;

/// Called by snapshot writers between records: while [`spill_to`] has a sink on this thread (a
/// forked snapshot child), the bytes so far go to it and `out` starts empty again, so that a
/// snapshot of any size is written with a bounded buffer. Without a sink it does nothing: the
/// bytes are the same either way, only where they end up differs.
#[inline]
pub fn spill(out: &mut Vec<u8>) {
    if out.len() >= SPILL_AT {
        spill_now(out);
    }
}

#[cold]
fn spill_now(out: &mut Vec<u8>) {
    SPILL.with(|s| {
        if let Some(sink) = s.borrow_mut().as_mut() {
            if sink.failed.is_none() {
                if let Err(e) = sink.out.write_all(out) {
                    sink.failed = Some(e);
                }
            }
            out.clear();
        }
    });
}

/// Runs `f` with `sink` as this thread's [`spill`] sink, then hands it the rest of the
/// buffer `f` filled: everything `f` wrote reaches `sink`, in order; the first write error.
pub fn spill_to(
    sink: Box<dyn std::io::Write>,
    f: impl FnOnce(&mut Vec<u8>),
) -> std::io::Result<Box<dyn std::io::Write>> {
    SPILL.with(|s| {
        *s.borrow_mut() = Some(SpillSink {
            out: sink,
            failed: None,
        })
    });
    let mut buf = Vec::with_capacity(SPILL_AT + (SPILL_AT >> 2));
    f(&mut buf);
    let mut sink = SPILL
        .with(|s| s.borrow_mut().take())
        .expect("the sink set above");
    if let Some(e) = sink.failed {
        return Err(e);
    }
    sink.out.write_all(&buf)?;
    Ok(sink.out)
}

/// What [`release_as_read`] calls with the address read up to.
type ConsumedHook = Box<dyn FnMut(usize)>;

thread_local! {
    /// While [`release_as_read`] runs on this thread: the address from which [`consumed`]
    /// calls its hook next, and the hook. `usize::MAX`: no hook.
    static CONSUMED_NEXT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
    static CONSUMED: std::cell::RefCell<Option<ConsumedHook>> =
        const { std::cell::RefCell::new(None) };
}

/// Bytes read between two calls of a [`release_as_read`] hook, at least.
const CONSUMED_EVERY: usize = 8 << 20;

/// Called by snapshot restorers between records: while [`release_as_read`] has a hook on this
/// thread (a snapshot being restored from a mapped file), the hook learns, every few MiB, the
/// address up to which the bytes were read, and may give their pages back. Without a hook it
/// does nothing but a comparison.
#[inline]
pub fn consumed(r: &Reader<'_>) {
    let at = r.buf.as_ptr() as usize + r.pos;
    if at >= CONSUMED_NEXT.with(|n| n.get()) {
        consumed_now(at);
    }
}

#[cold]
fn consumed_now(at: usize) {
    CONSUMED.with(|c| {
        if let Some(hook) = c.borrow_mut().as_mut() {
            hook(at);
        }
    });
    CONSUMED_NEXT.with(|n| n.set(at.saturating_add(CONSUMED_EVERY)));
}

/// Runs `f` with `hook` as this thread's [`consumed`] hook: restoring a multi-GiB snapshot from
/// a mapping, the pages already parsed need not stay mapped beside the state built from them.
/// The hook goes when `f` returns or unwinds: no later call on this thread reaches it.
pub fn release_as_read<T>(hook: impl FnMut(usize) + 'static, f: impl FnOnce() -> T) -> T {
    struct Unset;
    impl Drop for Unset {
        fn drop(&mut self) {
            CONSUMED_NEXT.with(|n| n.set(usize::MAX));
            CONSUMED.with(|c| c.borrow_mut().take());
        }
    }
    CONSUMED.with(|c| *c.borrow_mut() = Some(Box::new(hook)));
    CONSUMED_NEXT.with(|n| n.set(0));
    let _unset = Unset;
    f()
}

/// A value that writes its whole state as canonical bytes and can be rebuilt from them: equal
/// states give equal bytes, whatever their history, slot numbers or hash seeds; a restored value
/// behaves exactly like the original.
pub trait Snapshot: Sized {
    /// What the value is built with (limits, timeouts): the restoring node's own, not stored.
    type Config: Copy;

    fn snapshot(&self, out: &mut Vec<u8>);

    /// Rebuild from untrusted bytes: anything truncated, corrupt or inconsistent is an error.
    fn restore(config: Self::Config, r: &mut Reader<'_>) -> Result<Self>;
}

/// Checks shared by every [`Snapshot`] implementation's tests.
#[cfg(test)]
pub mod testing {
    use super::*;
    use crate::rng::Rng;

    /// Snapshot `t`, restore it under another hash seed, check that the copy passes
    /// `invariants` and snapshots to the same bytes; the copy.
    pub fn round_trip<T: Snapshot>(
        t: &T,
        config: T::Config,
        hash_seed: u64,
        invariants: impl Fn(&T),
    ) -> T {
        let mut bytes = Vec::new();
        t.snapshot(&mut bytes);
        let copy = crate::core::hash::with_seed(hash_seed, || {
            let mut r = Reader::new(&bytes);
            let copy = T::restore(config, &mut r).expect("restore");
            r.finish().expect("whole snapshot read");
            copy
        });
        invariants(&copy);
        let mut again = Vec::new();
        copy.snapshot(&mut again);
        assert_eq!(again, bytes, "snapshot of the restored value differs");
        copy
    }

    /// Every truncation of `t`'s snapshot is an error; `flips` random bit flips never panic, and
    /// whatever still restores passes `invariants`.
    pub fn damage_is_refused<T: Snapshot>(
        t: &T,
        config: T::Config,
        flips: usize,
        invariants: impl Fn(&T),
    ) {
        let mut bytes = Vec::new();
        t.snapshot(&mut bytes);
        for cut in 0..bytes.len() {
            let mut r = Reader::new(&bytes[..cut]);
            assert!(T::restore(config, &mut r).is_err(), "cut at {cut}");
        }
        let mut rng = Rng::new(bytes.len() as u64);
        for _ in 0..flips {
            let mut bad = bytes.clone();
            let at = rng.index(bad.len());
            bad[at] ^= 1 << rng.below(8);
            if let Ok(copy) = T::restore(config, &mut Reader::new(&bad)) {
                invariants(&copy);
            }
        }
    }
}

/// A checked cursor over untrusted bytes.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn u8(&mut self) -> Result<u8> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    pub fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid("bool")),
        }
    }

    /// A varint of at most 10 bytes whose value fits 64 bits.
    pub fn u64(&mut self) -> Result<u64> {
        let mut n: u64 = 0;
        for i in 0..10 {
            let b = self.u8()?;
            let bits = u64::from(b & 0x7f);
            if i == 9 && bits > 1 {
                return Err(DecodeError::Invalid("varint over 64 bits"));
            }
            n |= bits << (7 * i);
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err(DecodeError::Invalid("varint over 10 bytes"))
    }

    pub fn u32(&mut self) -> Result<u32> {
        u32::try_from(self.u64()?).map_err(|_| DecodeError::Invalid("over 32 bits"))
    }

    pub fn opt_u64(&mut self) -> Result<Option<u64>> {
        Ok(if self.bool()? {
            Some(self.u64()?)
        } else {
            None
        })
    }

    /// A count of items that each take at least `min_bytes` bytes of input: a count the rest of
    /// the input cannot hold is refused before anything is allocated for it.
    pub fn count(&mut self, min_bytes: usize) -> Result<usize> {
        let n = self.u64()?;
        let fits = n
            .checked_mul(min_bytes.max(1) as u64)
            .is_some_and(|need| need <= self.remaining() as u64);
        if !fits {
            return Err(DecodeError::Truncated);
        }
        Ok(n as usize)
    }

    /// A length-prefixed byte string of at most `max` bytes, borrowed from the input.
    pub fn bytes(&mut self, max: usize) -> Result<&'a [u8]> {
        let len = self.u64()?;
        if len > max as u64 {
            return Err(DecodeError::Invalid("byte string over its cap"));
        }
        let len = len as usize;
        if len > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        let b = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        Ok(b)
    }

    /// Exactly these bytes next (a magic number, a version).
    pub fn expect(&mut self, want: &[u8], what: &'static str) -> Result<()> {
        if self.remaining() < want.len() {
            return Err(DecodeError::Truncated);
        }
        if &self.buf[self.pos..self.pos + want.len()] != want {
            return Err(DecodeError::Invalid(what));
        }
        self.pos += want.len();
        Ok(())
    }

    /// The input must be used up.
    pub fn finish(&self) -> Result<()> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(DecodeError::Invalid("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restorer's progress reaches the hook every few MiB, at increasing addresses within
    /// what it read; once the scope ends (or unwinds) nothing does.
    #[test]
    fn the_consumed_hook_sees_progress_and_goes_with_its_scope() {
        let buf = vec![7u8; 40 << 20];
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let s = seen.clone();
        let base = buf.as_ptr() as usize;
        release_as_read(
            move |at| s.borrow_mut().push(at),
            || {
                let mut r = Reader::new(&buf);
                while r.remaining() >= 4096 {
                    consumed(&r);
                    r.bytes(4096).unwrap();
                }
            },
        );
        let seen = seen.borrow();
        assert!(seen.len() >= 4 && seen.len() <= 6, "{} calls", seen.len());
        assert!(seen.windows(2).all(|w| w[1] >= w[0] + CONSUMED_EVERY));
        assert!(seen.iter().all(|&at| at >= base && at < base + buf.len()));
        // Outside the scope, and after one that panicked, no hook is called.
        let late = std::rc::Rc::new(std::cell::Cell::new(0));
        let l = late.clone();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            release_as_read(move |_| l.set(l.get() + 1), || panic!("a corrupt snapshot"))
        }));
        assert!(r.is_err());
        let r = Reader::new(&buf[30 << 20..]);
        consumed(&r);
        assert_eq!(late.get(), 0);
    }

    #[test]
    fn varints_round_trip_at_every_width() {
        let mut values = vec![0, 1, 127, 128, 16383, 16384, u64::MAX - 1, u64::MAX];
        values.extend((0..64).map(|s| 1u64 << s));
        for v in values {
            let mut b = Vec::new();
            put_u64(&mut b, v);
            let mut r = Reader::new(&b);
            assert_eq!(r.u64(), Ok(v));
            r.finish().unwrap();
            for cut in 0..b.len() {
                assert_eq!(Reader::new(&b[..cut]).u64(), Err(DecodeError::Truncated));
            }
        }
    }

    #[test]
    fn overlong_and_oversized_varints_are_invalid() {
        let eleven = [0x80u8; 10].iter().copied().chain([0]).collect::<Vec<_>>();
        assert!(matches!(
            Reader::new(&eleven).u64(),
            Err(DecodeError::Invalid(_))
        ));
        let mut over = vec![0xffu8; 9];
        over.push(0x02);
        assert!(matches!(
            Reader::new(&over).u64(),
            Err(DecodeError::Invalid(_))
        ));
    }

    #[test]
    fn a_length_past_the_input_is_refused_before_allocation() {
        let mut b = Vec::new();
        put_u64(&mut b, u64::MAX / 2);
        assert_eq!(Reader::new(&b).count(8), Err(DecodeError::Truncated));
        assert_eq!(
            Reader::new(&b).bytes(usize::MAX),
            Err(DecodeError::Truncated)
        );
        assert!(matches!(
            Reader::new(&b).bytes(10),
            Err(DecodeError::Invalid(_))
        ));
    }

    #[test]
    fn options_bools_and_strings_round_trip() {
        let mut b = Vec::new();
        put_opt_u64(&mut b, None);
        put_opt_u64(&mut b, Some(0));
        put_opt_u64(&mut b, Some(41));
        // A client's CAS or request id may be the largest value (it once came back as MAX - 1).
        put_opt_u64(&mut b, Some(u64::MAX));
        put_bool(&mut b, true);
        put_bytes(&mut b, b"name");
        let mut r = Reader::new(&b);
        assert_eq!(r.opt_u64(), Ok(None));
        assert_eq!(r.opt_u64(), Ok(Some(0)));
        assert_eq!(r.opt_u64(), Ok(Some(41)));
        assert_eq!(r.opt_u64(), Ok(Some(u64::MAX)));
        assert_eq!(r.bool(), Ok(true));
        assert_eq!(r.bytes(4), Ok(&b"name"[..]));
        r.finish().unwrap();
        assert!(matches!(
            Reader::new(&[2]).bool(),
            Err(DecodeError::Invalid(_))
        ));
    }
}
