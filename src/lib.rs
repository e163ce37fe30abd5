//! holdfast: a lock server that speaks memcached (with yrmcds locks), old and dlock.
//! (Thread-model overview to be written with the server.)

pub mod core;
pub mod proto;
