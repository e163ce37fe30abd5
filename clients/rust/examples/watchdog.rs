//! Work while a lock is held, stopping as soon as it is lost (another client takes it away).
use std::time::Duration;

use holdfast_client::{Client, Error, Loss};

fn main() -> Result<(), Error> {
    let server = std::env::args().nth(1).unwrap_or("127.0.0.1:2627".into());
    let client = Client::connect([server.clone()])?;
    let guard = client
        .lock("migration")
        .lease(Duration::from_secs(5))
        .acquire()?;
    let lost = guard.loss_signal();

    // An operator removes the stuck holder by its token, from another connection.
    let operator = Client::connect([server])?;
    operator.unlock_fence("migration", guard.fence())?;

    // The worker checks the flag between steps, or blocks on the signal in a watchdog thread.
    let mut steps = 0;
    while !lost.is_lost() && steps < 1000 {
        steps += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(lost.wait(Some(Duration::from_secs(5))), Some(Loss::Taken));
    println!("lost after {steps} steps: {}", guard.loss().unwrap());
    drop(guard); // returns at once: nothing left to unlock
    Ok(())
}
