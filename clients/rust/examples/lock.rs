//! Take a lock with a lease, use its fencing token, and release it.
use std::time::Duration;

use holdfast_client::{Client, Error};

fn main() -> Result<(), Error> {
    let server = std::env::args().nth(1).unwrap_or("127.0.0.1:2627".into());
    let client = Client::connect([server])?;
    let guard = client
        .lock("nightly-report")
        .lease(Duration::from_secs(30)) // renewed every 10 s while the guard lives
        .wait(Duration::from_secs(10)) // Error::AcquireTimeout after 10 s
        .value("host-a")
        .acquire()?;
    println!("locked, fencing token {}", guard.fence());
    // Whatever the lock protects is written with the token; the store refuses older ones.
    assert!(client.check_fence("nightly-report", guard.fence())?);
    let info = client.get("nightly-report")?;
    assert_eq!(info.holders[0].value.as_deref(), Some(&b"host-a"[..]));
    // Try once: someone holds it.
    match client.lock("nightly-report").wait(Duration::ZERO).acquire() {
        Err(Error::AcquireTimeout { busy }) => println!("busy: {} key(s)", busy.len()),
        other => panic!("{other:?}"),
    }
    if guard.is_lost() {
        return Err(Error::Invalid("lost the lock: stop writing"));
    }
    guard.unlock() // dropping the guard unlocks too
}
