//! STUB (API fixed, body to be written): the memcached item store with yrmcds server-side locks.

use super::{ConnId, Now};

/// Sizes the store is built with (`--memory`, `--max-item-size`).
#[derive(Clone, Copy, Debug)]
pub struct StoreConfig {
    pub memory_limit: usize,
    pub max_item_size: usize,
}

/// A borrowed view of one item, valid until the next mutation of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemView<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    pub cas: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreOutcome {
    Stored { cas: u64 },
    NotStored,
    Exists,
    NotFound,
    Locked,
    TooLarge,
    OutOfMemory,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DeleteOutcome {
    Deleted,
    NotFound,
    Exists,
    Locked,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ArithOutcome {
    Value { value: u64, cas: u64 },
    NotFound,
    NonNumeric,
    Exists,
    Locked,
    OutOfMemory,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LockOutcome {
    Ok,
    Locked,
    NotFound,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum UnlockOutcome {
    Ok,
    NotFound,
    NotLocked,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RauOutcome {
    Stored { cas: u64 },
    NotFound,
    NotLocked,
    Exists,
    TooLarge,
    OutOfMemory,
}

/// Counters reported by memcached `stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub curr_items: u64,
    pub total_items: u64,
    pub bytes: u64,
    pub evictions: u64,
    pub expired_unfetched: u64,
    pub reclaimed: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub get_expired: u64,
    pub touch_hits: u64,
    pub touch_misses: u64,
    pub delete_hits: u64,
    pub delete_misses: u64,
    pub incr_hits: u64,
    pub incr_misses: u64,
    pub decr_hits: u64,
    pub decr_misses: u64,
    pub cas_hits: u64,
    pub cas_misses: u64,
    pub cas_badval: u64,
    pub locks_held: u64,
    pub lock_grants: u64,
    pub lock_conflicts: u64,
}

pub struct Store {
    _config: StoreConfig,
}

#[allow(unused_variables)]
impl Store {
    pub fn new(config: StoreConfig, now: Now) -> Self {
        unimplemented!()
    }
    pub fn config(&self) -> StoreConfig {
        unimplemented!()
    }
    pub fn get(&mut self, key: &[u8], now: Now) -> Option<ItemView<'_>> {
        unimplemented!()
    }
    pub fn get_and_touch(&mut self, key: &[u8], exptime: i64, now: Now) -> Option<ItemView<'_>> {
        unimplemented!()
    }
    pub fn touch(&mut self, key: &[u8], exptime: i64, now: Now) -> bool {
        unimplemented!()
    }
    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &mut self,
        conn: ConnId,
        mode: StoreMode,
        key: &[u8],
        flags: u32,
        exptime: i64,
        value: &[u8],
        cas: Option<u64>,
        now: Now,
    ) -> StoreOutcome {
        unimplemented!()
    }
    pub fn delete(
        &mut self,
        conn: ConnId,
        key: &[u8],
        cas: Option<u64>,
        now: Now,
    ) -> DeleteOutcome {
        unimplemented!()
    }
    #[allow(clippy::too_many_arguments)]
    pub fn incr_decr(
        &mut self,
        conn: ConnId,
        key: &[u8],
        incr: bool,
        delta: u64,
        initial: Option<(u64, i64)>,
        cas: Option<u64>,
        now: Now,
    ) -> ArithOutcome {
        unimplemented!()
    }
    pub fn flush_all(&mut self, delay: i64, now: Now) {
        unimplemented!()
    }
    pub fn lock(&mut self, conn: ConnId, key: &[u8], now: Now) -> LockOutcome {
        unimplemented!()
    }
    pub fn unlock(&mut self, conn: ConnId, key: &[u8], now: Now) -> UnlockOutcome {
        unimplemented!()
    }
    pub fn unlock_all(&mut self, conn: ConnId, now: Now) -> usize {
        unimplemented!()
    }
    pub fn lock_and_get(
        &mut self,
        conn: ConnId,
        key: &[u8],
        exptime: Option<i64>,
        now: Now,
    ) -> Result<ItemView<'_>, LockOutcome> {
        unimplemented!()
    }
    #[allow(clippy::too_many_arguments)]
    pub fn replace_and_unlock(
        &mut self,
        conn: ConnId,
        key: &[u8],
        flags: u32,
        exptime: i64,
        value: &[u8],
        cas: Option<u64>,
        now: Now,
    ) -> RauOutcome {
        unimplemented!()
    }
    pub fn disconnect(&mut self, conn: ConnId, now: Now) -> usize {
        unimplemented!()
    }
    pub fn next_deadline(&self) -> Option<u64> {
        unimplemented!()
    }
    pub fn advance(&mut self, now: Now) {
        unimplemented!()
    }
    pub fn stats(&self) -> StoreStats {
        unimplemented!()
    }
}
