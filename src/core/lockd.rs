//! STUB (API fixed, body to be written): the old lock-daemon lock table.

use super::ConnId;

#[derive(Clone, Copy, Debug)]
pub struct LockdConfig {
    pub orphan_timeout_ms: u64,
}

/// An asynchronous grant: `conn` now holds the lock it queued for with ACQ; the daemon answers
/// ACQUIRED echoing `payload` (the queued request's payload, byte for byte).
#[derive(Debug, PartialEq, Eq)]
pub struct Grant {
    pub conn: ConnId,
    pub payload: Box<[u8]>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AcquireOutcome {
    Acquired,
    Queued,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockdStats {
    pub held: u64,
    pub orphaned: u64,
    pub waiting: u64,
    pub grants: u64,
    pub orphan_expiries: u64,
    pub adoptions: u64,
}

pub struct LockdTable {
    _config: LockdConfig,
}

#[allow(unused_variables)]
impl LockdTable {
    pub fn new(config: LockdConfig, now_ms: u64) -> Self {
        unimplemented!()
    }
    pub fn acquire(
        &mut self,
        conn: ConnId,
        name: &[u8],
        payload: &[u8],
        now_ms: u64,
    ) -> AcquireOutcome {
        unimplemented!()
    }
    pub fn try_lock(&mut self, conn: ConnId, name: &[u8], now_ms: u64) -> bool {
        unimplemented!()
    }
    pub fn release(
        &mut self,
        conn: ConnId,
        name: &[u8],
        now_ms: u64,
        grants: &mut Vec<Grant>,
    ) -> bool {
        unimplemented!()
    }
    pub fn adopt(&mut self, conn: ConnId, name: &[u8], now_ms: u64) -> bool {
        unimplemented!()
    }
    pub fn disconnect(&mut self, conn: ConnId, now_ms: u64) {
        unimplemented!()
    }
    pub fn advance(&mut self, now_ms: u64, grants: &mut Vec<Grant>) {
        unimplemented!()
    }
    pub fn next_deadline(&self) -> Option<u64> {
        unimplemented!()
    }
    pub fn for_each_locked(&self, mut f: impl FnMut(&[u8])) {
        unimplemented!()
    }
    pub fn stats(&self) -> LockdStats {
        unimplemented!()
    }
}
