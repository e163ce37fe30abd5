//! The hasher of every hash map in the state machine: seeded per state, so that a test can give
//! two replicas different seeds and prove that nothing depends on hash order.
//!
//! Owns: the choice of hash function (foldhash, hashbrown's own default, fast on short keys) and
//! where its seed comes from. Must not: be used to decide an order that reaches an effect or a
//! snapshot. Tables iterate hash maps only to look things up or to count; wherever an order
//! matters (releases on a disconnect, timers due at one instant, snapshots) they sort by a
//! value that every replica shares (a name, an arrival number, a session id).
//!
//! Why not a fixed seed: keys come from clients, and a seed they cannot know keeps a flood of
//! colliding keys from turning the tables' O(1) into O(n). Each process draws its own seed at
//! first use; tests pin one with [`with_seed`].

use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

use foldhash::fast::FixedState;

/// A `BuildHasher` with the process's seed (or the one pinned on this thread by [`with_seed`]
/// when it was made).
#[derive(Clone, Debug)]
pub struct Seeded(FixedState);

impl Default for Seeded {
    fn default() -> Self {
        Seeded(FixedState::with_seed(seed()))
    }
}

impl BuildHasher for Seeded {
    type Hasher = <FixedState as BuildHasher>::Hasher;

    #[inline]
    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}

/// A hash map of the state machine.
pub type HashMap<K, V> = hashbrown::HashMap<K, V, Seeded>;
/// A hash set of the state machine.
pub type HashSet<K> = hashbrown::HashSet<K, Seeded>;

thread_local! {
    static PINNED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The seed for a new map: the one pinned on this thread, else the process's.
pub fn seed() -> u64 {
    static PROCESS: OnceLock<u64> = OnceLock::new();
    PINNED
        .with(Cell::get)
        .unwrap_or_else(|| *PROCESS.get_or_init(|| RandomState::new().hash_one(0x686f_6c64_u64)))
}

/// Run `f` with every map it creates on this thread seeded with `seed` (tests: two replicas with
/// different seeds must still agree byte for byte).
pub fn with_seed<R>(seed: u64, f: impl FnOnce() -> R) -> R {
    let old = PINNED.with(|p| p.replace(Some(seed)));
    let r = f();
    PINNED.with(|p| p.set(old));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_seeds_change_the_hash_and_restore_the_previous_seed() {
        let a = with_seed(1, || Seeded::default().hash_one(b"key"));
        let b = with_seed(2, || Seeded::default().hash_one(b"key"));
        let a2 = with_seed(1, || Seeded::default().hash_one(b"key"));
        assert_ne!(a, b);
        assert_eq!(a, a2);
        let outer = seed();
        with_seed(7, || assert_eq!(seed(), 7));
        assert_eq!(seed(), outer);
    }
}
