//! STUB (API fixed, body to be written): the dlock multi-key lock table.

use super::ConnId;

#[derive(Clone, Copy, Debug)]
pub struct DlockConfig {
    pub idle_timeout_ms: u64,
}

/// What happened to a connection later than the request that caused it.
#[derive(Debug, PartialEq, Eq)]
pub enum DlockEvent {
    /// The waiting Lock of `conn` (tagged `token`) now holds all its keys.
    Granted { conn: ConnId, token: u64 },
    /// The waiting Lock of `conn` hit its wait deadline: nothing is held; `busy` lists the keys
    /// that were still busy.
    TimedOut {
        conn: ConnId,
        token: u64,
        busy: Vec<Box<[u8]>>,
    },
    /// `conn` sent nothing for the idle timeout and has no pending Lock: the table has already
    /// released its connection-bound locks; the daemon must close the connection.
    Idle { conn: ConnId },
}

#[derive(Debug, PartialEq, Eq)]
pub enum LockResult {
    Granted,
    Waiting,
    Timeout { busy: Vec<Box<[u8]>> },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DlockStats {
    pub held_keys: u64,
    pub leases: u64,
    pub waiting: u64,
    pub grants: u64,
    pub timeouts: u64,
    pub lease_expiries: u64,
    pub idle_disconnects: u64,
}

pub struct DlockTable {
    _config: DlockConfig,
}

#[allow(unused_variables)]
impl DlockTable {
    pub fn new(config: DlockConfig, now_ms: u64) -> Self {
        DlockTable { _config: config }
    }
    pub fn connect(&mut self, conn: ConnId, now_ms: u64) {}
    pub fn touch(&mut self, conn: ConnId, now_ms: u64) {}
    #[allow(clippy::too_many_arguments)]
    pub fn lock(
        &mut self,
        conn: ConnId,
        token: u64,
        keys: &[&[u8]],
        wait_us: Option<u64>,
        lease_us: Option<u64>,
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) -> LockResult {
        unimplemented!()
    }
    pub fn unlock(
        &mut self,
        conn: ConnId,
        keys: &[&[u8]],
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) -> Result<(), Vec<Box<[u8]>>> {
        unimplemented!()
    }
    pub fn disconnect(&mut self, conn: ConnId, now_ms: u64, events: &mut Vec<DlockEvent>) {}
    pub fn advance(&mut self, now_ms: u64, events: &mut Vec<DlockEvent>) {}
    pub fn next_deadline(&self) -> Option<u64> {
        None
    }
    pub fn stats(&self) -> DlockStats {
        Default::default()
    }
}
