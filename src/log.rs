//! Operator log lines: one line per event an operator cares about, on stderr, with an RFC 3339
//! UTC timestamp, a level and, on a cluster node, the node's id (`node=2`). Nothing is logged per
//! request at the default level (`info`).
//!
//! It owns the process-wide level and node id only; it must not buffer, allocate per call beyond the line
//! itself, or be called on the per-request path above `debug`.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "error" => Some(Level::Error),
            "warn" => Some(Level::Warn),
            "info" => Some(Level::Info),
            "debug" => Some(Level::Debug),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
/// The cluster node id every line names (0: a single node, no id).
static NODE: AtomicU64 = AtomicU64::new(0);

/// Name cluster node `id` on every line from now on (set once, at start).
pub fn set_node(id: u64) {
    NODE.store(id, Ordering::Relaxed);
}

thread_local! {
    static MUTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Silence (or not) the lines written on this thread: the cluster simulator runs many nodes'
/// drivers on one thread, thousands of runs in a row.
pub fn mute_thread(muted: bool) {
    MUTED.with(|m| m.set(muted));
}

pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

#[inline]
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Write one line if `level` is enabled: `2026-11-23T07:05:35.123Z warn holdfast: ...`, or on
/// a cluster node `2026-11-23T07:05:35.123Z warn node=2 holdfast: ...`.
pub fn write(level: Level, args: Arguments<'_>) {
    if !enabled(level) || MUTED.with(std::cell::Cell::get) {
        return;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let line = format!(
        "{} {} {}holdfast: {}\n",
        rfc3339(now.as_secs(), now.subsec_millis()),
        level.name(),
        node_field(NODE.load(Ordering::Relaxed)),
        args
    );
    // One write per line: lines from several threads never interleave within a line.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Lines about one kind of client event (closed for stalling, for bad input) at most once per
/// [`Limiter::PERIOD`], so that a flood of hostile clients cannot flood the log; the next line
/// says how many were not logged.
#[derive(Default, Debug)]
pub struct Limiter {
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl Limiter {
    pub const PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

    /// `Some(events not logged since the last line)` when a line may be written now.
    pub fn ready(&mut self, level: Level) -> Option<u64> {
        if !enabled(level) {
            return None;
        }
        let now = std::time::Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Self::PERIOD)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[macro_export]
macro_rules! log_error { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($t)*)) } }
#[macro_export]
macro_rules! log_warn { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Warn, format_args!($($t)*)) } }
#[macro_export]
macro_rules! log_info { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($t)*)) } }
#[macro_export]
macro_rules! log_debug { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($t)*)) } }

/// `node=ID ` for a cluster node, nothing for a single node.
fn node_field(id: u64) -> String {
    if id == 0 {
        String::new()
    } else {
        format!("node={id} ")
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for Unix seconds and milliseconds (proleptic Gregorian calendar,
/// Howard Hinnant's days-to-civil algorithm; no crate needed for UTC).
pub fn rfc3339(unix: u64, millis: u32) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_instants() {
        let cases = [
            (0, 0, "1970-01-01T00:00:00.000Z"),
            (951_782_400, 5, "2000-02-29T00:00:00.005Z"),
            (1_795_417_535, 123, "2026-11-23T07:05:35.123Z"),
            (4_102_444_799, 999, "2099-12-31T23:59:59.999Z"),
        ];
        for (secs, ms, want) in cases {
            assert_eq!(rfc3339(secs, ms), want, "{secs}");
        }
    }

    #[test]
    fn limiter_lets_one_line_through_per_period_and_counts_the_rest() {
        let mut l = Limiter::default();
        assert_eq!(l.ready(Level::Error), Some(0));
        assert_eq!(l.ready(Level::Error), None);
        assert_eq!(l.ready(Level::Error), None);
        l.last = Some(std::time::Instant::now() - Limiter::PERIOD);
        assert_eq!(l.ready(Level::Error), Some(2));
    }

    #[test]
    fn a_cluster_node_names_itself_after_the_level() {
        assert_eq!(node_field(0), "");
        assert_eq!(node_field(2), "node=2 ");
    }

    #[test]
    fn levels_parse_and_order() {
        assert_eq!(Level::parse("warn"), Some(Level::Warn));
        assert_eq!(Level::parse("WARN"), None);
        assert!(Level::Error < Level::Debug);
    }
}
