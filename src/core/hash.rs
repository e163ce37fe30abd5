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

/// An index of ids (slots of a slab) by hash, split into [`SHARDS`] tables that grow one at a
/// time, each entry carrying its hash. Growing one table of a million entries rehashes all of
/// them at once, reading each entry's key at random: hundreds of milliseconds on the owner's
/// thread. Here a growth moves a 256th of the entries, from their stored hashes alone.
/// Never iterated (no order to leak); a lookup costs a shift more, and compares stored hashes
/// before it reads a key.
pub struct Sharded {
    shards: Box<[hashbrown::HashTable<Indexed>; SHARDS]>,
    len: usize,
}

/// Shards of a [`Sharded`] index.
pub const SHARDS: usize = 256;

/// An id and the low half of its hash.
#[derive(Clone, Copy)]
struct Indexed {
    id: u32,
    hash: u32,
}

impl Indexed {
    /// The hash a shard's table files an entry under, from the stored half alone: its low bits
    /// place it, its top seven are the table's control byte.
    #[inline]
    fn table_hash(low: u32) -> u64 {
        (u64::from(low) << 32) | u64::from(low)
    }
}

impl Default for Sharded {
    fn default() -> Self {
        Sharded {
            shards: Box::new(std::array::from_fn(|_| hashbrown::HashTable::new())),
            len: 0,
        }
    }
}

impl Sharded {
    /// The shard of a hash: bits of its high half, which the stored low half does not hold.
    #[inline]
    fn shard(hash: u64) -> usize {
        (hash >> 48) as usize % SHARDS
    }

    /// The id filed under `hash` that `eq` accepts.
    #[inline]
    pub fn find(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let low = hash as u32;
        self.shards[Self::shard(hash)]
            .find(Indexed::table_hash(low), |e| e.hash == low && eq(e.id))
            .map(|e| e.id)
    }

    /// Files `id` under `hash` (no entry for the same key may be there).
    #[inline]
    pub fn insert_unique(&mut self, hash: u64, id: u32) {
        let low = hash as u32;
        self.shards[Self::shard(hash)].insert_unique(
            Indexed::table_hash(low),
            Indexed { id, hash: low },
            |e| Indexed::table_hash(e.hash),
        );
        self.len += 1;
    }

    /// Removes `id`, filed under `hash`; whether it was there.
    #[inline]
    pub fn remove(&mut self, hash: u64, id: u32) -> bool {
        let low = hash as u32;
        match self.shards[Self::shard(hash)].find_entry(Indexed::table_hash(low), |e| e.id == id) {
            Ok(entry) => {
                entry.remove();
                self.len -= 1;
                true
            }
            Err(_) => false,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids filed under equal hashes, equal low halves or equal shards are told apart by their
    /// ids and keys; what is removed is gone and the rest stays, through every shard's growth.
    #[test]
    fn a_sharded_index_finds_what_it_holds_through_growth() {
        let mut t = Sharded::default();
        let hash = |i: u32| -> u64 {
            match i % 3 {
                0 => u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                // The same low half as i - 1's, another high half.
                1 => (u64::from(i - 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) & 0xffff_ffff) | 1 << 50,
                // The very hash of i - 2.
                _ => u64::from(i - 2).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            }
        };
        let n = 200_000u32;
        for i in 0..n {
            t.insert_unique(hash(i), i);
        }
        assert_eq!(t.len(), n as usize);
        for i in 0..n {
            assert_eq!(t.find(hash(i), |id| id == i), Some(i));
        }
        for i in (0..n).filter(|i| i % 2 == 0) {
            assert!(t.remove(hash(i), i));
            assert!(!t.remove(hash(i), i));
        }
        assert_eq!(t.len(), n as usize / 2);
        for i in 0..n {
            let want = (i % 2 == 1).then_some(i);
            assert_eq!(t.find(hash(i), |id| id == i), want, "id {i}");
        }
        assert_eq!(t.find(hash(7), |_| false), None);
    }

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
