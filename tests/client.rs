//! `holdfast-client` (clients/rust) against the real daemon: every primitive, leases kept alive
//! for several lease lengths, losses (the server gone, the hold taken away, a lease not
//! renewed), wait timeouts, guards dropped after a loss, and the README's examples. The
//! three-node cluster cases are in tests/cluster.rs.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::Daemon;
use holdfast_client::{Client, Error, EventKind, Leader, Loss};

fn client(d: &Daemon) -> Client {
    Client::connect([d.dlock.expect("dlock listener").to_string()]).expect("connect")
}

#[test]
fn an_exclusive_lock_excludes_and_is_free_again_after_unlock() {
    let d = Daemon::start(&[]);
    let (a, b) = (client(&d), client(&d));
    let g = a.lock("job").acquire().expect("granted");
    assert!(g.fence() > 0);
    match b.lock("job").wait(Duration::ZERO).acquire() {
        Err(Error::AcquireTimeout { busy }) => assert_eq!(busy, vec![b"job".to_vec()]),
        other => panic!("expected AcquireTimeout, got {other:?}"),
    }
    // Two locks of one client are two grants: the second waits like anyone else.
    assert!(matches!(
        a.lock("job").wait(Duration::from_millis(50)).acquire(),
        Err(Error::AcquireTimeout { .. })
    ));
    let first = g.fence();
    g.unlock().expect("unlocked");
    let g2 = b.lock("job").wait(Duration::ZERO).acquire().expect("free");
    assert!(g2.fence() > first);
    drop(g2);
    assert!(
        a.get("job").expect("get").holders.is_empty(),
        "drop unlocked"
    );
}

#[test]
fn a_wait_times_out_after_its_length_and_a_waiter_is_granted_on_release() {
    let d = Daemon::start(&[]);
    let (a, b) = (client(&d), client(&d));
    let g = a.lock("w").acquire().unwrap();
    let start = Instant::now();
    let r = b.lock("w").wait(Duration::from_millis(300)).acquire();
    assert!(matches!(r, Err(Error::AcquireTimeout { .. })), "{r:?}");
    assert!(start.elapsed() >= Duration::from_millis(290));
    std::thread::scope(|s| {
        let waiter = s.spawn(|| b.lock("w").wait(Duration::from_secs(10)).acquire());
        std::thread::sleep(Duration::from_millis(100));
        drop(g);
        let g2 = waiter.join().unwrap().expect("granted on release");
        assert!(!g2.is_lost());
    });
}

#[test]
fn shared_locks_coexist_semaphores_cap_and_values_show_in_get() {
    let d = Daemon::start(&[]);
    let (a, b) = (client(&d), client(&d));
    let r1 = a.lock("data").shared().acquire().unwrap();
    let r2 = b.lock("data").shared().acquire().unwrap();
    assert_ne!(r1.fence(), r2.fence());
    assert!(matches!(
        b.lock("data").wait(Duration::ZERO).acquire(),
        Err(Error::AcquireTimeout { .. })
    ));
    let info = a.get("data").unwrap();
    assert!(info.shared);
    assert_eq!(info.holders.len(), 2);
    drop((r1, r2));

    let s1 = a.lock("pool").limit(2).value("one").acquire().unwrap();
    let s2 = b.lock("pool").limit(2).value("two").acquire().unwrap();
    assert!(matches!(
        a.lock("pool").limit(2).wait(Duration::ZERO).acquire(),
        Err(Error::AcquireTimeout { .. })
    ));
    // Another limit while the key is in use: refused.
    assert!(matches!(
        a.lock("pool").limit(3).wait(Duration::ZERO).acquire(),
        Err(Error::Refused { .. })
    ));
    let info = b.get("pool").unwrap();
    assert_eq!(info.limit, Some(2));
    let values: Vec<_> = info.holders.iter().map(|h| h.value.clone()).collect();
    assert_eq!(values, [Some(b"one".to_vec()), Some(b"two".to_vec())]);
    assert_eq!(info.holders[0].fence, s1.fence());
    assert_eq!(info.holders[1].fence, s2.fence());
}

#[test]
fn several_keys_are_taken_together_and_released_together() {
    let d = Daemon::start(&[]);
    let (a, b) = (client(&d), client(&d));
    let g = a
        .lock_many(["x", "y"])
        .lease(Duration::from_secs(5))
        .acquire()
        .unwrap();
    for k in ["x", "y"] {
        assert!(a.check_fence(k, g.fence()).unwrap(), "{k}");
    }
    drop(g);
    let g = b
        .lock_many(["y", "x"])
        .wait(Duration::ZERO)
        .acquire()
        .unwrap();
    assert!(!g.is_lost());
}

#[test]
fn check_fence_is_true_for_the_current_grant_only() {
    let d = Daemon::start(&[]);
    let a = client(&d);
    let g = a.lock("store").acquire().unwrap();
    let f = g.fence();
    assert!(a.check_fence("store", f).unwrap());
    assert!(!a.check_fence("store", f + 1).unwrap());
    drop(g);
    assert!(!a.check_fence("store", f).unwrap());
}

#[test]
fn a_watch_sees_the_state_then_every_grant_and_release() {
    let d = Daemon::start(&[]);
    let (a, b) = (client(&d), client(&d));
    let held = a.lock("k").value("v1").acquire().unwrap();
    let mut w = b.watch(["k"]).unwrap();
    assert_eq!(w.initial()[0].holders[0].fence, held.fence());
    let f1 = held.fence();
    drop(held);
    let ev = w
        .next_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("an event");
    assert_eq!((ev.kind, ev.fence), (EventKind::Released, f1));
    let g = a.lock("k").value("v2").acquire().unwrap();
    let ev = w.next().unwrap().unwrap();
    assert_eq!(ev.kind, EventKind::Acquired);
    assert_eq!(
        (ev.fence, ev.value.as_deref()),
        (g.fence(), Some(&b"v2"[..]))
    );
    assert_eq!(ev.key, b"k");
    // Dropping the watch unwatches: nothing more arrives for it, and the client goes on.
    drop(w);
    drop(g);
    b.ping().unwrap();
}

#[test]
fn an_unlock_by_fence_from_another_client_is_a_loss_signalled_to_the_holder() {
    let d = Daemon::start(&[]);
    let (a, b) = (client(&d), client(&d));
    // Connection-bound, and a short lease renewed a few times first (its notices then come
    // under the id of the last renewal).
    for lease in [None, Some(Duration::from_millis(300))] {
        let mut req = a.lock("taken");
        if let Some(l) = lease {
            req = req.lease(l);
        }
        let g = req.acquire().unwrap();
        let signal = g.loss_signal();
        let (tx, rx) = std::sync::mpsc::channel();
        g.on_lost(move |why| tx.send(why).unwrap());
        let wait = if lease.is_some() { 1000 } else { 50 };
        assert_eq!(g.wait_lost(Some(Duration::from_millis(wait))), None);
        b.unlock_fence("taken", g.fence()).unwrap();
        assert_eq!(signal.wait(Some(Duration::from_secs(5))), Some(Loss::Taken));
        assert!(g.is_lost());
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(1)).unwrap(),
            Loss::Taken
        );
        // Unlocking after the loss returns at once, with nothing to do.
        let start = Instant::now();
        g.unlock().unwrap();
        assert!(start.elapsed() < Duration::from_secs(1));
    }
    assert!(matches!(
        b.unlock_fence("taken", 1),
        Err(Error::NotHeld { .. })
    ));
}

#[test]
fn leases_are_renewed_for_three_times_their_length() {
    let d = Daemon::start(&[]);
    let a = client(&d);
    let leases = [300, 1000, 2000].map(Duration::from_millis);
    std::thread::scope(|s| {
        for (i, lease) in leases.into_iter().enumerate() {
            let a = &a;
            s.spawn(move || {
                let key = format!("lease{i}");
                let g = a.lock(&key).lease(lease).acquire().unwrap();
                let until = Instant::now() + lease * 3;
                while Instant::now() < until {
                    assert!(!g.is_lost(), "{lease:?}: lost: {:?}", g.loss());
                    let info = a.get(&key).unwrap();
                    assert_eq!(info.holders.len(), 1, "{lease:?}: {info:?}");
                    assert_eq!(info.holders[0].fence, g.fence(), "{lease:?}: same grant");
                    assert!(info.holders[0].lease_left_micro > 0);
                    std::thread::sleep(lease / 7);
                }
                assert!(a.check_fence(&key, g.fence()).unwrap());
                g.unlock().unwrap();
            });
        }
    });
}

#[test]
fn a_lease_not_renewed_runs_out_and_is_reported_before_its_end() {
    let d = Daemon::start(&[]);
    let a = client(&d);
    let start = Instant::now();
    let g = a
        .lock("fixed")
        .lease(Duration::from_millis(400))
        .renew(false)
        .acquire()
        .unwrap();
    let why = g.wait_lost(Some(Duration::from_secs(5))).expect("lost");
    let at = start.elapsed();
    assert_eq!(why, Loss::LeaseNotKept);
    assert!(at < Duration::from_millis(400), "reported at {at:?}");
    assert!(at >= Duration::from_millis(300), "reported at {at:?}");
}

#[test]
fn every_server_gone_is_a_loss_for_every_hold_and_dropping_guards_does_not_hang() {
    let d = Daemon::start(&[]);
    let a = Client::builder([d.dlock.unwrap().to_string()])
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .unwrap();
    let bound = a.lock("bound").acquire().unwrap();
    let leased = a
        .lock("leased")
        .lease(Duration::from_secs(1))
        .acquire()
        .unwrap();
    let leased_at = Instant::now();
    let status = d.terminate();
    assert!(status.success());
    assert_eq!(
        bound.wait_lost(Some(Duration::from_secs(5))),
        Some(Loss::ConnectionLost)
    );
    // The lease is kept while the client looks for a server, and given up before its end.
    assert_eq!(
        leased.wait_lost(Some(Duration::from_secs(5))),
        Some(Loss::LeaseNotKept)
    );
    // Renewed at most 1/3 s before the kill: reported lost by then + the lease.
    assert!(leased_at.elapsed() < Duration::from_secs(3));
    let start = Instant::now();
    drop(bound);
    drop(leased);
    let r = a.lock("again").wait(Duration::ZERO).acquire();
    assert!(r.is_err(), "{r:?}");
    drop(a);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_pending_wait_fails_with_a_clear_error_when_the_connection_breaks() {
    let d = Daemon::start(&[]);
    let (a, b) = (client(&d), client(&d));
    let _g = a.lock("p").acquire().unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| b.lock("p").acquire());
        std::thread::sleep(Duration::from_millis(200));
        let _ = d.terminate();
        let r = waiter.join().unwrap();
        assert_eq!(r.unwrap_err(), Error::ConnectionLost);
    });
}

#[test]
fn an_unreachable_server_is_an_error_and_a_dead_one_is_skipped() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = format!("127.0.0.1:{port}");
    assert!(matches!(
        Client::connect([dead.clone()]),
        Err(Error::Unreachable(_))
    ));
    let d = Daemon::start(&[]);
    let c = Client::connect([dead, d.dlock.unwrap().to_string()]).unwrap();
    c.lock("k").acquire().unwrap().unlock().unwrap();
}

#[test]
fn the_access_token_is_sent_and_a_wrong_one_refused() {
    let d = Daemon::start(&["--dlock-token", "s3cret"]);
    let addr = d.dlock.unwrap().to_string();
    let good = Client::builder([addr.clone()])
        .token("s3cret")
        .connect()
        .unwrap();
    good.lock("t").acquire().unwrap().unlock().unwrap();
    let bad = Client::builder([addr]).token("nope").connect().unwrap();
    let r = bad.lock("t").wait(Duration::ZERO).acquire();
    assert!(r.is_err(), "{r:?}");
}

#[test]
fn tls_with_the_ca_works_and_another_ca_cannot_connect() {
    use holdfast_testkit::pki;
    let dir = pki::temp_dir("client-tls");
    let ca = pki::Ca::new("client CA");
    let ca_file = ca.write(&dir.join("ca.pem"));
    let other = pki::Ca::new("other CA").write(&dir.join("other.pem"));
    let server = ca.issue(&dir, "server", &["127.0.0.1"]);
    let d = Daemon::start(&[
        "--tls-cert",
        server.cert.to_str().unwrap(),
        "--tls-key",
        server.key.to_str().unwrap(),
    ]);
    let addr = d.dlock.unwrap().to_string();
    let config = holdfast_client::tls::client_config(Some(&ca_file), None).unwrap();
    let c = Client::builder([addr.clone()])
        .tls(config)
        .connect()
        .unwrap();
    let g = c
        .lock("secure")
        .lease(Duration::from_millis(300))
        .acquire()
        .unwrap();
    let mut w = c.watch(["secure"]).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(!g.is_lost(), "renewed over TLS");
    drop(g);
    let ev = w.next_timeout(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(ev.kind, EventKind::Released);
    let wrong = holdfast_client::tls::client_config(Some(&other), None).unwrap();
    assert!(Client::builder([addr]).tls(wrong).connect().is_err());
    drop(d);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_election_has_one_leader_that_observers_follow_and_resign_hands_over() {
    let d = Daemon::start(&[]);
    let (a, b, o) = (client(&d), client(&d), client(&d));
    let lease = Duration::from_secs(2);
    let lead_a = a
        .campaign("election/billing", "10.0.0.5:8080", lease)
        .unwrap();
    let mut obs = o.observe("election/billing").unwrap();
    let first = obs.next().unwrap().expect("a leader");
    assert_eq!(first.fence, lead_a.fence());
    assert_eq!(first.value.as_deref(), Some(&b"10.0.0.5:8080"[..]));
    std::thread::scope(|s| {
        let cand = s.spawn(|| b.campaign("election/billing", "10.0.0.6:8080", lease));
        std::thread::sleep(Duration::from_millis(200));
        assert!(!cand.is_finished(), "a second leader while the first leads");
        let fa = lead_a.fence();
        lead_a.resign().unwrap();
        let lead_b = cand.join().unwrap().unwrap();
        assert!(lead_b.fence() > fa);
        // Observers see the leader gone, then the new one.
        let mut seen = Vec::new();
        while seen.last() != Some(&Some(lead_b.fence())) {
            let l: Option<Leader> = obs.next().unwrap();
            seen.push(l.map(|l| l.fence));
        }
        assert_eq!(seen, [None, Some(lead_b.fence())]);
        let now = o.leader("election/billing").unwrap().unwrap();
        assert_eq!(now.value.as_deref(), Some(&b"10.0.0.6:8080"[..]));
        assert!(!lead_b.is_lost());
    });
}

#[test]
fn lock_delay_keeps_the_key_after_a_loss() {
    let d = Daemon::start(&[]);
    let (a, b) = (client(&d), client(&d));
    let g = a
        .lock("delayed")
        .lease(Duration::from_millis(200))
        .renew(false)
        .lock_delay(Duration::from_secs(2))
        .acquire()
        .unwrap();
    g.wait_lost(Some(Duration::from_secs(5))).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let info = b.get("delayed").unwrap();
    assert!(info.delayed_micro > 0, "{info:?}");
    assert!(matches!(
        b.lock("delayed").wait(Duration::ZERO).acquire(),
        Err(Error::AcquireTimeout { .. })
    ));
}

#[test]
fn many_threads_share_one_client() {
    let d = Daemon::start(&[]);
    let a = client(&d);
    let inside = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..50 {
                    let g = a.lock("shared-counter").acquire().unwrap();
                    assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                    inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    g.unlock().unwrap();
                }
            });
        }
    });
}

/// The README's examples: each is an example program of the crate (clients/rust/examples),
/// quoted whole in the README, run here against a daemon.
#[test]
fn the_readme_examples_are_the_example_programs_and_they_run() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/rust");
    let readme = std::fs::read_to_string(dir.join("README.md")).expect("README");
    let examples: Vec<_> = std::fs::read_dir(dir.join("examples"))
        .expect("examples")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(examples.len() >= 3, "{examples:?}");
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "--quiet", "-p", "holdfast-client", "--examples"]);
    if !cfg!(debug_assertions) {
        // A release run of the tests finds the examples beside it, in target/release.
        build.arg("--release");
    }
    let built = build.status().expect("cargo build --examples");
    assert!(built.success());
    let bin_dir = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .join("examples");
    let d = Daemon::start(&[]);
    for path in examples {
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            readme.contains(text.trim()),
            "{} is not quoted whole in the README",
            path.display()
        );
        let name = path.file_stem().unwrap().to_str().unwrap();
        let out = Command::new(bin_dir.join(name))
            .arg(d.dlock.unwrap().to_string())
            .output()
            .expect("run the example");
        assert!(out.status.success(), "{name}: {out:?}");
    }
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let d = Daemon::start(&[]);
    let a = client(&d);
    let none: [&str; 0] = [];
    assert!(matches!(
        a.lock_many(none).acquire(),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        a.lock("z").lease(Duration::ZERO).acquire(),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(a.watch(none), Err(Error::Invalid(_))));
    // A lease longer than any clock: granted or refused by the server, never a panic here.
    if let Ok(g) = a.lock("forever").lease(Duration::MAX).acquire() {
        assert!(!g.is_lost());
        g.unlock().unwrap();
    }
    // A value over the server's 4096 bytes: refused.
    assert!(matches!(
        a.lock("big").value(vec![b'x'; 5000]).acquire(),
        Err(Error::Refused { .. })
    ));
    a.ping().unwrap();
}
