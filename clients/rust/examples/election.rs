//! Leader election: two candidates, one observer; the leader resigns and the other takes over.
use std::time::Duration;

use holdfast_client::{Client, Error};

fn main() -> Result<(), Error> {
    let server = std::env::args().nth(1).unwrap_or("127.0.0.1:2627".into());
    let lease = Duration::from_secs(10);
    let (a, b) = (Client::connect([&server])?, Client::connect([&server])?);
    let leader = a.campaign("election/billing", "10.0.0.5:8080", lease)?;
    println!("10.0.0.5 leads, term {}", leader.fence());

    let observer = Client::connect([&server])?;
    let mut changes = observer.observe("election/billing")?;
    let now = changes.next().flatten().expect("a leader");
    assert_eq!(now.value.as_deref(), Some(&b"10.0.0.5:8080"[..]));

    std::thread::scope(|s| {
        let standby = s.spawn(|| b.campaign("election/billing", "10.0.0.6:8080", lease));
        std::thread::sleep(Duration::from_millis(100));
        leader.resign()?; // the standby is granted at once
        let next = standby.join().expect("standby thread")?;
        // The observer sees the old leader go, then the new one.
        assert_eq!(changes.next(), Some(None));
        let new = changes.next().flatten().expect("a new leader");
        assert_eq!(new.fence, next.fence());
        println!("10.0.0.6 leads, term {}", next.fence());
        Ok(())
    })
}
