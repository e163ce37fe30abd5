//! Formatting on the admin thread: Prometheus text exposition format and JSON.
//!
//! It owns no state; it must not block or ask the owner anything.

use std::fmt::Write;

use serde_json::{json, Map, Value};

use super::Ctx;
use crate::server::query::{
    ClusterMetrics, ClusterStatus, DlockKey, Histogram, LockList, Snapshot, Who, CLUSTER_BOUNDS,
    LATENCY_BOUNDS,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Untyped,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Untyped => "untyped",
        }
    }
}

/// How a `stats` name becomes a metric: name, type, label (lock-table counters share a metric
/// and differ by `table`; watch events by `kind`), help.
pub(crate) fn map_stat(name: &str) -> (String, Kind, Option<(&'static str, &'static str)>, String) {
    const TABLE: &[(&str, &str, Kind, &str)] = &[
        ("locks_held", "holdfast_locks_held", Kind::Gauge, "memcache"),
        (
            "lock_grants",
            "holdfast_lock_grants_total",
            Kind::Counter,
            "memcache",
        ),
        (
            "lock_conflicts",
            "holdfast_lock_conflicts_total",
            Kind::Counter,
            "memcache",
        ),
        ("lockd_held", "holdfast_locks_held", Kind::Gauge, "lockd"),
        (
            "lockd_waiting",
            "holdfast_lock_waiters",
            Kind::Gauge,
            "lockd",
        ),
        (
            "lockd_grants",
            "holdfast_lock_grants_total",
            Kind::Counter,
            "lockd",
        ),
        (
            "lockd_orphaned",
            "holdfast_lockd_orphaned",
            Kind::Gauge,
            "lockd",
        ),
        (
            "lockd_orphan_expiries",
            "holdfast_lockd_orphan_expiries_total",
            Kind::Counter,
            "lockd",
        ),
        (
            "lockd_adoptions",
            "holdfast_lockd_adoptions_total",
            Kind::Counter,
            "lockd",
        ),
        (
            "dlock_held_keys",
            "holdfast_locks_held",
            Kind::Gauge,
            "dlock",
        ),
        (
            "dlock_waiting",
            "holdfast_lock_waiters",
            Kind::Gauge,
            "dlock",
        ),
        (
            "dlock_grants",
            "holdfast_lock_grants_total",
            Kind::Counter,
            "dlock",
        ),
        (
            "dlock_leases",
            "holdfast_dlock_leases",
            Kind::Gauge,
            "dlock",
        ),
        (
            "dlock_timeouts",
            "holdfast_dlock_wait_timeouts_total",
            Kind::Counter,
            "dlock",
        ),
        (
            "dlock_lease_expiries",
            "holdfast_dlock_lease_expiries_total",
            Kind::Counter,
            "dlock",
        ),
        (
            "dlock_idle_disconnects",
            "holdfast_dlock_idle_disconnects_total",
            Kind::Counter,
            "dlock",
        ),
    ];
    // yrmcds counters: their own names (an acquire takes resources, not a lock).
    const COUNTER_TABLE: &[(&str, &str, Kind)] = &[
        ("counter_objects", "holdfast_counter_objects", Kind::Gauge),
        (
            "counter_total_objects",
            "holdfast_counter_objects_created_total",
            Kind::Counter,
        ),
        (
            "counter_acquired",
            "holdfast_counter_acquired_total",
            Kind::Counter,
        ),
        (
            "counter_not_available",
            "holdfast_counter_not_available_total",
            Kind::Counter,
        ),
        (
            "counter_released",
            "holdfast_counter_released_total",
            Kind::Counter,
        ),
        (
            "counter_released_on_close",
            "holdfast_counter_released_on_close_total",
            Kind::Counter,
        ),
    ];
    // The native protocol: its grants, and this node's watches and pushed frames.
    const NATIVE_TABLE: &[(&str, &str, Kind, Option<&str>)] = &[
        (
            "dlock_native_holds",
            "holdfast_dlock_native_holds",
            Kind::Gauge,
            None,
        ),
        (
            "dlock_native_leases",
            "holdfast_dlock_native_leases",
            Kind::Gauge,
            None,
        ),
        (
            "dlock_delayed_keys",
            "holdfast_dlock_delayed_keys",
            Kind::Gauge,
            None,
        ),
        ("dlock_watches", "holdfast_dlock_watches", Kind::Gauge, None),
        (
            "dlock_watched_keys",
            "holdfast_dlock_watched_keys",
            Kind::Gauge,
            None,
        ),
        (
            "dlock_events_acquired",
            "holdfast_dlock_watch_events_total",
            Kind::Counter,
            Some("acquired"),
        ),
        (
            "dlock_events_released",
            "holdfast_dlock_watch_events_total",
            Kind::Counter,
            Some("released"),
        ),
        (
            "dlock_events_expired",
            "holdfast_dlock_watch_events_total",
            Kind::Counter,
            Some("expired"),
        ),
        (
            "dlock_events_lost",
            "holdfast_dlock_watch_events_total",
            Kind::Counter,
            Some("lost"),
        ),
        (
            "dlock_loss_notices",
            "holdfast_dlock_loss_notices_total",
            Kind::Counter,
            None,
        ),
    ];
    const GAUGES: &[&str] = &[
        "pid",
        "uptime",
        "time",
        "pointer_size",
        "curr_connections",
        "threads",
        "limit_maxbytes",
        "bytes",
        "curr_items",
    ];
    const COUNTERS: &[&str] = &[
        "total_connections",
        "rejected_connections",
        "cmd_get",
        "cmd_set",
        "cmd_flush",
        "cmd_touch",
        "get_hits",
        "get_misses",
        "get_expired",
        "delete_misses",
        "delete_hits",
        "incr_misses",
        "incr_hits",
        "decr_misses",
        "decr_hits",
        "cas_misses",
        "cas_hits",
        "cas_badval",
        "touch_hits",
        "touch_misses",
        "total_items",
        "expired_unfetched",
        "evictions",
        "reclaimed",
    ];
    let help = format!("memcached stats \"{name}\"");
    if let Some(&(_, metric, kind, table)) = TABLE.iter().find(|t| t.0 == name) {
        return (metric.to_string(), kind, Some(("table", table)), help);
    }
    if let Some(&(_, metric, kind, event)) = NATIVE_TABLE.iter().find(|t| t.0 == name) {
        return (metric.to_string(), kind, event.map(|e| ("kind", e)), help);
    }
    if let Some(&(_, metric, kind)) = COUNTER_TABLE.iter().find(|t| t.0 == name) {
        return (metric.to_string(), kind, None, help);
    }
    if GAUGES.contains(&name) {
        return (format!("holdfast_{name}"), Kind::Gauge, None, help);
    }
    if COUNTERS.contains(&name) {
        return (format!("holdfast_{name}_total"), Kind::Counter, None, help);
    }
    // A stat added since this table was written: shown, typed as unknown (a unit test,
    // `exec_admin::tests::every_stat_has_a_metric_type`, fails until it is added above).
    (format!("holdfast_{name}"), Kind::Untyped, None, help)
}

/// One metric family: every sample of a name must be together, under one TYPE line.
struct Family {
    name: String,
    kind: Kind,
    help: String,
    samples: Vec<(String, String)>,
}

fn family<'a>(fams: &'a mut Vec<Family>, name: &str, kind: Kind, help: &str) -> &'a mut Family {
    let i = match fams.iter().position(|f| f.name == name) {
        Some(i) => i,
        None => {
            fams.push(Family {
                name: name.to_string(),
                kind,
                help: help.to_string(),
                samples: Vec::new(),
            });
            fams.len() - 1
        }
    };
    &mut fams[i]
}

fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The `/metrics` page.
pub fn metrics(s: &Snapshot, ctx: &Ctx) -> String {
    let mut fams: Vec<Family> = Vec::new();
    for (name, value) in &s.stats {
        if name.contains(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            continue;
        }
        if name == "version" {
            let f = family(
                &mut fams,
                "holdfast_build_info",
                Kind::Gauge,
                "the daemon's version",
            );
            f.samples.push((
                format!("{{version=\"{}\"}}", label_value(value)),
                "1".into(),
            ));
            continue;
        }
        if value.parse::<f64>().is_err() {
            continue;
        }
        let (metric, kind, label, help) = map_stat(name);
        let labels = label.map_or(String::new(), |(l, v)| format!("{{{l}=\"{v}\"}}"));
        family(&mut fams, &metric, kind, &help)
            .samples
            .push((labels, value.clone()));
    }
    let protos = ["memcache", "lockd", "dlock", "counter"];
    for (proto, addr) in &ctx.listeners {
        let f = family(
            &mut fams,
            "holdfast_open_connections",
            Kind::Gauge,
            "this process's open client connections per listener",
        );
        f.samples.push((
            format!("{{listener=\"{}\",address=\"{addr}\"}}", proto.name()),
            s.open[proto.index()].to_string(),
        ));
    }
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    for (name, help, value) in [
        (
            "holdfast_owner_queue_requests",
            "requests the workers handed to a separate owner thread that it has not taken yet",
            &ctx.shared.owner_queue,
        ),
        (
            "holdfast_owner_queue_requests_peak",
            "the most requests ever waiting for a separate owner thread to take them",
            &ctx.shared.owner_queue_peak,
        ),
    ] {
        family(&mut fams, name, Kind::Gauge, help)
            .samples
            .push((String::new(), value.load(relaxed).to_string()));
    }
    let active = ctx.active.load(relaxed);
    family(
        &mut fams,
        "holdfast_admin_connections",
        Kind::Gauge,
        "admin port connections being served",
    )
    .samples
    .push((String::new(), active.to_string()));

    let mut out = String::with_capacity(8192);
    for f in &fams {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.name());
        for (labels, v) in &f.samples {
            let _ = writeln!(out, "{}{labels} {v}", f.name);
        }
    }
    let name = "holdfast_lock_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} lock requests, from the worker turn that read them to the owner handing their replies back"
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (proto, h) in protos.iter().zip(&s.latency) {
        let label = format!("protocol=\"{proto}\"");
        histogram(&mut out, name, &label, &LATENCY_BOUNDS, h);
    }
    if let Some(c) = &s.cluster {
        cluster_metrics(&mut out, c);
    }
    out
}

/// The samples of one histogram; `labels` (without braces) are put before `le`.
fn histogram(out: &mut String, name: &str, labels: &str, bounds: &[f64], h: &Histogram) {
    let sep = if labels.is_empty() { "" } else { "," };
    let mut cumulative = 0;
    for (bound, n) in bounds.iter().zip(&h.buckets) {
        cumulative += n;
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
        );
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", h.count);
    let braced = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(out, "{name}_sum{braced} {}", h.sum_ns as f64 / 1e9);
    let _ = writeln!(out, "{name}_count{braced} {}", h.count);
}

/// The roles of `holdfast_cluster_role`, one sample each.
const ROLES: [&str; 5] = ["leader", "follower", "candidate", "precandidate", "learner"];

/// Cluster mode's metrics (`holdfast_cluster_*`, listed in `docs/operations.md`).
fn cluster_metrics(out: &mut String, c: &ClusterMetrics) {
    let st = &c.status;
    let mut one = |name: &str, kind: Kind, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {}", kind.name());
        for (labels, v) in samples {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let plain = |v: u64| vec![(String::new(), v)];
    let roles: Vec<(String, u64)> = ROLES
        .iter()
        .map(|r| (format!("{{role=\"{r}\"}}"), u64::from(st.role == *r)))
        .collect();
    one(
        "holdfast_cluster_role",
        Kind::Gauge,
        "1 for this node's Raft role, 0 for the others",
        &roles,
    );
    one(
        "holdfast_cluster_leader_id",
        Kind::Gauge,
        "the leader this node knows (0: none)",
        &plain(st.leader),
    );
    one(
        "holdfast_cluster_term",
        Kind::Gauge,
        "this node's Raft term",
        &plain(st.term),
    );
    one(
        "holdfast_cluster_commit_index",
        Kind::Gauge,
        "the commit index this node knows",
        &plain(st.commit),
    );
    one(
        "holdfast_cluster_applied_index",
        Kind::Gauge,
        "the last log index applied on this node",
        &plain(st.applied),
    );
    one(
        "holdfast_cluster_fenced",
        Kind::Gauge,
        "1 while this node has fenced itself (cut off from a quorum)",
        &plain(u64::from(st.fenced)),
    );
    let peers: Vec<(String, u64)> = st
        .peers
        .iter()
        .filter(|(id, _, _)| *id != st.node)
        .map(|(id, _, _)| {
            (
                format!("{{peer=\"{id}\"}}"),
                u64::from(st.reachable.contains(id)),
            )
        })
        .collect();
    one(
        "holdfast_cluster_peer_reachable",
        Kind::Gauge,
        "1 while this node has heard from that member within one election timeout",
        &peers,
    );
    one(
        "holdfast_cluster_snapshot_bytes",
        Kind::Gauge,
        "size of the latest snapshot made or installed on this node",
        &plain(c.snapshot_bytes),
    );
    one(
        "holdfast_cluster_log_file_bytes",
        Kind::Gauge,
        "size of this node's Raft log file",
        &plain(c.log_file_bytes),
    );
    one(
        "holdfast_cluster_log_cached_bytes",
        Kind::Gauge,
        "bytes of the newest Raft log entries kept in memory (older ones are read back from the log files)",
        &plain(c.log_cached_bytes),
    );
    one(
        "holdfast_cluster_log_entries_read_total",
        Kind::Counter,
        "Raft log entries read back from the log files (a far-behind follower's catch-up, a restart)",
        &plain(c.log_entries_read),
    );
    let sn = &c.snapshots;
    one(
        "holdfast_cluster_snapshots_total",
        Kind::Counter,
        "snapshots this node made (written by a child process), that failed, and that it installed from the leader",
        &[
            ("{result=\"made\"}".to_string(), sn.made),
            ("{result=\"failed\"}".to_string(), sn.failed),
            ("{result=\"installed\"}".to_string(), sn.installed),
        ],
    );
    one(
        "holdfast_cluster_snapshot_in_progress",
        Kind::Gauge,
        "1 while a snapshot is being written (op=\"write\") or a leader's snapshot installed (op=\"install\")",
        &[
            ("{op=\"write\"}".to_string(), u64::from(sn.writing)),
            ("{op=\"install\"}".to_string(), u64::from(sn.installing)),
        ],
    );
    one(
        "holdfast_cluster_quorum_losses_total",
        Kind::Counter,
        "times this node lost contact with a quorum of the voters (reachable within one election timeout)",
        &plain(c.quorum_losses),
    );
    one(
        "holdfast_cluster_fences_total",
        Kind::Counter,
        "times this node fenced itself (closed its clients' connections, cut off from a quorum)",
        &plain(c.fences),
    );
    one(
        "holdfast_cluster_leader_changes_total",
        Kind::Counter,
        "times this node learned of a new leader (another node, or the same one elected for a new term)",
        &plain(c.leader_changes),
    );
    one(
        "holdfast_cluster_no_quorum_answers_total",
        Kind::Counter,
        "requests this node answered no quorum (no quorum within two election timeouts)",
        &plain(c.no_quorum_answers),
    );
    let t = &c.snapshot_transfer;
    let in_flight: Vec<(String, u64)> = t
        .in_flight
        .iter()
        .map(|(id, n)| (format!("{{peer=\"{id}\"}}"), *n))
        .collect();
    one(
        "holdfast_cluster_snapshot_send_bytes_in_flight",
        Kind::Gauge,
        "snapshot bytes sent to that peer and not yet acknowledged",
        &in_flight,
    );
    one(
        "holdfast_cluster_snapshot_bytes_sent_total",
        Kind::Counter,
        "snapshot file bytes sent to peers in chunks (resent ones too)",
        &plain(t.bytes_sent),
    );
    one(
        "holdfast_cluster_snapshot_bytes_received_total",
        Kind::Counter,
        "snapshot file bytes received from peers and written",
        &plain(t.bytes_received),
    );
    let results: Vec<(String, u64)> = [
        ("completed", t.completed),
        ("failed", t.failed),
        ("resumed", t.resumed),
    ]
    .iter()
    .map(|(r, n)| (format!("{{result=\"{r}\"}}"), *n))
    .collect();
    one(
        "holdfast_cluster_snapshot_transfers_total",
        Kind::Counter,
        "snapshot transfers to peers: completed (the snapshot message written after the whole file), failed, and resumed after a reconnection",
        &results,
    );
    for (name, help, h) in [
        (
            "holdfast_cluster_proposal_apply_seconds",
            "from a proposal's first sending to its being applied on this node",
            &c.proposal_apply,
        ),
        (
            "holdfast_cluster_log_sync_seconds",
            "each fdatasync of the Raft log",
            &c.log_sync,
        ),
        (
            "holdfast_cluster_snapshot_fork_seconds",
            "the owner thread's part of each snapshot: the fork of the child that writes it",
            &c.snapshots.fork_times,
        ),
        (
            "holdfast_cluster_snapshot_write_seconds",
            "each snapshot child's run: serialising, writing and syncing the state",
            &c.snapshots.write_times,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        histogram(out, name, "", &CLUSTER_BOUNDS, h);
    }
    let _ = writeln!(
        out,
        "# HELP holdfast_cluster_snapshot_last_seconds the last snapshot's fork (the owner's part), write (the child's run) and install (restore, off the owner's thread)"
    );
    let _ = writeln!(out, "# TYPE holdfast_cluster_snapshot_last_seconds gauge");
    for (op, v) in [
        ("fork", c.snapshots.last_fork_seconds),
        ("write", c.snapshots.last_write_seconds),
        ("install", c.snapshots.last_install_seconds),
    ] {
        let _ = writeln!(
            out,
            "holdfast_cluster_snapshot_last_seconds{{op=\"{op}\"}} {v}"
        );
    }
}

fn who(w: &Who) -> Value {
    json!({
        "session": w.session(),
        "address": w.peer.map(|a| a.to_string()),
        // The node that accepted the session's connection (cluster mode; null on a single node).
        "node": w.node,
    })
}

/// A dlock key's own fields, beside those every table's locks have (which show its first
/// holder).
fn dlock_key(m: &mut Map<String, Value>, d: &DlockKey) {
    let mode = if d.limit > 1 {
        "semaphore"
    } else if d.shared {
        "shared"
    } else {
        "exclusive"
    };
    m.insert("mode".into(), mode.into());
    m.insert("limit".into(), d.limit.into());
    let holders = d.holders.iter().map(|h| {
        let mut o = match who(&h.who) {
            Value::Object(o) => o,
            _ => Map::new(),
        };
        o.insert("fence".into(), h.fence.into());
        o.insert("held_for_ms".into(), h.held_for_ms.into());
        o.insert("expires_in_ms".into(), h.expires_in_ms.into());
        match &h.value {
            None => {
                o.insert("value".into(), Value::Null);
            }
            Some((shown, len)) => {
                match printable(shown, shown.len() < *len) {
                    Some(text) => o.insert("value".into(), text.into()),
                    None => {
                        o.insert("value".into(), Value::Null);
                        o.insert("value_hex".into(), hex(shown).into())
                    }
                };
                o.insert("value_bytes".into(), (*len).into());
                o.insert("value_truncated".into(), (shown.len() < *len).into());
            }
        }
        Value::Object(o)
    });
    m.insert("holders".into(), Value::Array(holders.collect()));
    m.insert("holders_total".into(), d.holders_total.into());
    m.insert("lock_delay_ms".into(), d.lock_delay_ms.into());
    m.insert("watchers".into(), d.watchers.into());
}

/// `bytes` as text if they are UTF-8 without control characters; when `cut` (by the listing's
/// cap), a character cut short at the end is left out.
fn printable(bytes: &[u8], cut: bool) -> Option<&str> {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) if cut && e.error_len().is_none() => {
            std::str::from_utf8(&bytes[..e.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    (!text.chars().any(char::is_control)).then_some(text)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn lock_list(l: &LockList) -> Value {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let locks: Vec<Value> = l
        .locks
        .iter()
        .map(|k| {
            let mut m = Map::new();
            m.insert("name".into(), String::from_utf8_lossy(&k.name).into());
            if std::str::from_utf8(&k.name).is_err() {
                m.insert("name_hex".into(), hex(&k.name).into());
            }
            m.insert("holder".into(), k.holder.as_ref().map_or(Value::Null, who));
            m.insert("orphaned".into(), k.holder.is_none().into());
            let since = k.held_for_ms.map(|ago| now_ms.saturating_sub(ago));
            m.insert("held_since_unix_ms".into(), since.into());
            m.insert("held_for_ms".into(), k.held_for_ms.into());
            m.insert("fence".into(), k.fence.into());
            m.insert("expires_in_ms".into(), k.expires_in_ms.into());
            m.insert(
                "waiters".into(),
                Value::Array(k.waiters.iter().map(who).collect()),
            );
            m.insert("waiters_total".into(), k.waiters_total.into());
            if let Some(n) = k.resources {
                m.insert("resources".into(), n.into());
            }
            if let Some(d) = &k.dlock {
                dlock_key(&mut m, d);
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "table": l.table.name(),
        "matched": l.matched,
        "limit": l.limit,
        "truncated": l.matched > l.locks.len(),
        "locks": locks,
    })
}

/// `/locks`.
pub fn locks(l: &LockList) -> Vec<u8> {
    let mut v = serde_json::to_vec_pretty(&lock_list(l)).unwrap_or_default();
    v.push(b'\n');
    v
}

/// `/status.json`: what the status page shows.
pub fn status(s: &Snapshot, lists: &[LockList], ctx: &Ctx) -> Vec<u8> {
    let protos = ["memcache", "lockd", "dlock", "counter"];
    let listeners: Vec<Value> = ctx
        .listeners
        .iter()
        .map(|(p, a)| json!({"protocol": p.name(), "address": a.to_string(), "open": s.open[p.index()]}))
        .collect();
    let stats: Map<String, Value> = s
        .stats
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect();
    let latency: Map<String, Value> = protos
        .iter()
        .zip(&s.latency)
        .map(|(p, h)| {
            let mean_us = if h.count > 0 {
                (h.sum_ns / u128::from(h.count)) as f64 / 1000.0
            } else {
                0.0
            };
            (p.to_string(), json!({"count": h.count, "mean_us": mean_us}))
        })
        .collect();
    let tables: Map<String, Value> = lists
        .iter()
        .map(|l| (l.table.name().to_string(), lock_list(l)))
        .collect();
    let v = json!({
        "admin": ctx.admin.to_string(),
        "listeners": listeners,
        "stats": stats,
        "latency": latency,
        "tables": tables,
        // This node's view of its cluster, as `/cluster` shows it (null on a single node).
        "cluster": s.cluster.as_ref().map(|c| cluster_json(&c.status)),
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// `/cluster`: this node's view of its cluster, as JSON.
pub fn cluster(c: &ClusterStatus) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(&cluster_json(c)).unwrap_or_default();
    out.push(b'\n');
    out
}

/// `health`: `"ok"` or why the node cannot grant locks (what `/healthz` answers).
fn cluster_json(c: &ClusterStatus) -> Value {
    let peers: Vec<Value> = c
        .peers
        .iter()
        .map(|(id, addr, heard)| {
            json!({
                "id": id,
                "address": addr,
                "last_heard_ms": heard,
                "reachable": *id == c.node || c.reachable.contains(id),
            })
        })
        .collect();
    json!({
        "node": c.node,
        "role": c.role,
        "leader": c.leader,
        "term": c.term,
        "applied": c.applied,
        "log_time_ms": c.log_time_ms,
        "fenced": c.fenced,
        "voters": c.voters,
        "voters_outgoing": c.voters_outgoing,
        "peers": peers,
        "peer_tls": c.peer_tls,
        "peer_refused": c.peer_refused,
        "commit": c.commit,
        "healthy": c.health.is_ok(),
        "health": match &c.health {
            Ok(()) => "ok",
            Err(why) => why.as_str(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn values_show_as_text_only_when_printable() {
        assert_eq!(printable(b"host-a:8080", false), Some("host-a:8080"));
        assert_eq!(printable("grüße".as_bytes(), false), Some("grüße"));
        assert_eq!(printable(b"a\nb", false), None);
        assert_eq!(printable(b"\x00\x01", false), None);
        assert_eq!(printable(b"\xff", false), None);
        // A character cut by the listing's cap is left out; an uncut value ending so is bytes.
        let cut = &"aü".as_bytes()[..2];
        assert_eq!(printable(cut, true), Some("a"));
        assert_eq!(printable(cut, false), None);
    }
}
