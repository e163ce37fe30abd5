//! memcached text and binary requests applied to the item store, answered with typed effects
//! ([`McReply`]; the worker encodes them).
//!
//! Reply texts are memcached's (doc/protocol.txt) and yrmcds's (yrmcds-locking.md);
//! `docs/protocol.md` settles the rest. With `--compat yrmcds` the cases where yrmcds answers
//! otherwise answer as yrmcds does (`docs/compat.md`).
//! Also yrmcds's extensions: the key dump (`keys`, opcode 0x50), a few thousand slots per step,
//! and the `stats ops` counters ([`super::state::McState`]).

use super::state::KeyDump;
use super::wire::binary::{self, opcode as opc, status as st};
use super::wire::text::Keys;
use super::{BinHead, McCmd, McForm, McOp, McReply, Memcache};
use crate::config::Compat;
use crate::core::store::{
    Arith, ArithOutcome, DeleteOutcome, ItemView, LockOutcome, RauOutcome, StoreMode, StoreOutcome,
    UnlockOutcome, Write,
};
use crate::core::{Now, Session};
use crate::protocol::Execute;
use crate::server::effect::{self, Body, Effects};
use crate::server::msg::Span;
use crate::server::owner::Tables;
use crate::server::{Live, Shared};

/// Largest reply to one text get/gets/gat/gats (a 64 KiB line names up to ~32,000 keys, each
/// perhaps a whole item): past it the request fails and the connection closes.
const GET_REPLY_CAP: usize = crate::server::REPLY_BUDGET;

/// Store slots one step of a key dump looks at: a few thousand keys at most, a few hundred
/// microseconds of the owner, so other connections' requests wait for no more than that; the
/// next step comes when the worker asks for it ([`McCmd::KeysNext`](super::McCmd::KeysNext)).
pub const KEYS_SLOTS_PER_STEP: usize = 4096;

/// The [`TEXT_OPS`] entry a text request counts under (an index, so that counting is one
/// increment; `text_ops_are_counted_under_their_yrmcds_names` checks the numbers). yrmcds has no
/// gat/gats: they count as get/gets.
fn text_op_index(cmd: &McCmd) -> Option<usize> {
    Some(match cmd {
        McCmd::Store { mode, cas, .. } => match (mode, cas) {
            (StoreMode::Set, None) => 0,
            (StoreMode::Add, _) => 1,
            (StoreMode::Replace, _) => 2,
            (StoreMode::Append, _) => 3,
            (StoreMode::Prepend, _) => 4,
            (StoreMode::Set, Some(_)) => 5,
        },
        McCmd::Get { cas: false, .. } => 6,
        McCmd::Get { cas: true, .. } => 7,
        McCmd::Delete { .. } => 8,
        McCmd::Arith { incr: true, .. } => 9,
        McCmd::Arith { incr: false, .. } => 10,
        McCmd::Touch { .. } => 11,
        McCmd::Lock { .. } => 12,
        McCmd::Unlock { .. } => 13,
        McCmd::UnlockAll => 14,
        McCmd::Stats { .. } => 16,
        McCmd::Flush { .. } => 17,
        McCmd::Keys { .. } => 21,
        McCmd::KeysNext
        | McCmd::LockToken { .. }
        | McCmd::LockAndGet { .. }
        | McCmd::ReplaceAndUnlock { .. }
        | McCmd::Noop
        | McCmd::Version
        | McCmd::Verbosity
        | McCmd::Quit => return None,
    })
}

/// One step of `session`'s dump: up to [`KEYS_SLOTS_PER_STEP`] slots listed into one effect.
/// The last step ends the listing (`END`, or binary's empty response) and completes the
/// request; the others complete nothing and the worker asks for the next once this one went out.
fn dump_step(t: &mut Tables, fx: &mut Effects, session: Session, now: Now) {
    let Some(d) = t.mc.dumps.get_mut(&session) else {
        // No dump (a `KeysNext` after the connection's dump ended): nothing to answer.
        return;
    };
    let mark = fx.mark();
    let arena = &mut fx.arena;
    let next = t
        .store
        .keys_step(d.next, &d.prefix, KEYS_SLOTS_PER_STEP, now, |key| {
            effect::put_entry(arena, key)
        });
    let keys = fx.since(mark);
    let body = |end| {
        Body::Mc(McReply::Keys {
            binary: d.binary,
            keys,
            end,
        })
    };
    match next {
        Some(slot) => {
            fx.push(session, 0, false, body(false));
            d.next = slot;
        }
        None => {
            // The last step ends the request: it completes it.
            fx.push(session, 1, false, body(true));
            t.mc.dumps.remove(&session);
        }
    }
}

/// Start a key dump for `session` (a second one replaces a stale first; the worker sends none
/// while one runs).
fn dump_start(
    t: &mut Tables,
    fx: &mut Effects,
    session: Session,
    prefix: &[u8],
    binary: Option<u32>,
    now: Now,
) {
    let d = KeyDump {
        prefix: prefix.to_vec(),
        next: 0,
        binary,
    };
    t.mc.dumps.insert(session, d);
    dump_step(t, fx, session, now);
}

/// Apply one memcached command and answer it in the form it came in.
impl Execute for Memcache {
    fn apply(
        t: &mut Tables,
        fx: &mut Effects,
        shared: &Shared,
        session: Session,
        op: McOp,
        arena: &[u8],
        now: Now,
    ) {
        let McOp { cmd, form } = op;
        if let McCmd::KeysNext = cmd {
            return dump_step(t, fx, session, now);
        }
        match form {
            McForm::Text { .. } => {
                if let Some(i) = text_op_index(&cmd) {
                    t.mc.text_ops[i] += 1;
                }
            }
            // Every opcode counts; `stats ops` shows those yrmcds names.
            McForm::Binary { opcode, .. } => t.mc.binary_ops[usize::from(opcode)] += 1,
        }
        let yrmcds = shared.config.compat == Compat::Yrmcds;
        let r = Reply {
            fx,
            session,
            form,
            yrmcds,
        };
        let text = matches!(form, McForm::Text { .. });
        let s = &mut t.store;
        match cmd {
            // yrmcds has no gat/gats.
            McCmd::Get { touch: Some(_), .. } if text && yrmcds => r.text(b"ERROR\r\n"),
            McCmd::Get { keys, cas, touch } if text => {
                text_get(t, r.fx, session, keys.get(arena), cas, touch, now)
            }
            McCmd::Get { keys, touch, .. } => {
                let key = keys.get(arena);
                t.counters.cmd_get += 1;
                let item = match touch {
                    Some(e) => {
                        t.counters.cmd_touch += 1;
                        s.get_and_touch(key, e, now)
                    }
                    None => s.get(key, now),
                };
                match item {
                    Some(item) => r.hit(&item),
                    None => r.miss(key),
                }
            }
            McCmd::Store {
                mode,
                key,
                flags,
                exptime,
                value,
                cas,
            } => {
                t.counters.cmd_set += 1;
                let res = s.store(
                    session,
                    mode,
                    Write {
                        key: key.get(arena),
                        flags,
                        exptime,
                        value: value.get(arena),
                    },
                    cas,
                    now,
                );
                let bin = match store_status(res) {
                    // memcached: add of an existing key answers "exists"; replace of a missing one
                    // "not found"; yrmcds: so does append or prepend to a missing item.
                    Err(st::ITEM_NOT_STORED) => match mode {
                        StoreMode::Add => Err(st::KEY_EXISTS),
                        StoreMode::Replace => Err(st::KEY_NOT_FOUND),
                        StoreMode::Append | StoreMode::Prepend if yrmcds => Err(st::KEY_NOT_FOUND),
                        _ => Err(st::ITEM_NOT_STORED),
                    },
                    other => other,
                };
                let words: &[u8] = match res {
                    StoreOutcome::Stored { .. } => b"STORED\r\n",
                    StoreOutcome::NotStored => b"NOT_STORED\r\n",
                    StoreOutcome::Exists => b"EXISTS\r\n",
                    StoreOutcome::NotFound => b"NOT_FOUND\r\n",
                    StoreOutcome::Locked => b"LOCKED\r\n",
                    StoreOutcome::TooLarge => b"SERVER_ERROR object too large for cache\r\n",
                    StoreOutcome::OutOfMemory => b"SERVER_ERROR out of memory storing object\r\n",
                };
                r.answer(words, bin);
            }
            McCmd::Delete { key, cas } => match s.delete(session, key.get(arena), cas, now) {
                DeleteOutcome::Deleted => r.answer(b"DELETED\r\n", Ok(0)),
                // yrmcds: a DeleteQ of a missing key is silent.
                DeleteOutcome::NotFound if yrmcds && r.quiet() => {
                    r.fx.reply(session, Body::Nothing)
                }
                DeleteOutcome::NotFound => r.answer(b"NOT_FOUND\r\n", Err(st::KEY_NOT_FOUND)),
                DeleteOutcome::Exists => r.answer(b"EXISTS\r\n", Err(st::KEY_EXISTS)),
                DeleteOutcome::Locked => r.answer(b"LOCKED\r\n", Err(st::LOCKED)),
            },
            McCmd::Arith {
                key,
                incr,
                delta,
                create,
                cas,
            } => {
                let res = s.incr_decr(
                    session,
                    key.get(arena),
                    Arith {
                        incr,
                        delta,
                        create,
                        cas,
                    },
                    now,
                );
                if let ArithOutcome::Value { value, cas } = res {
                    return r.number(value, cas);
                }
                let (words, status): (&[u8], u16) = match res {
                    ArithOutcome::Value { .. } => unreachable!("answered above"),
                    ArithOutcome::NotFound => (b"NOT_FOUND\r\n", st::KEY_NOT_FOUND),
                    ArithOutcome::NonNumeric => (
                        b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
                        st::NON_NUMERIC,
                    ),
                    ArithOutcome::Exists => (b"EXISTS\r\n", st::KEY_EXISTS),
                    ArithOutcome::Locked => (b"LOCKED\r\n", st::LOCKED),
                    ArithOutcome::OutOfMemory => {
                        (b"SERVER_ERROR out of memory\r\n", st::OUT_OF_MEMORY)
                    }
                };
                r.answer(words, Err(status));
            }
            McCmd::Touch { key, exptime } => {
                t.counters.cmd_touch += 1;
                let key = key.get(arena);
                if s.touch(key, exptime, now) {
                    // yrmcds answers a binary touch with the item's CAS.
                    let cas = if yrmcds && !text {
                        s.peek(key, now).map_or(0, |item| item.cas)
                    } else {
                        0
                    };
                    r.answer(b"TOUCHED\r\n", Ok(cas));
                } else {
                    r.answer(b"NOT_FOUND\r\n", Err(st::KEY_NOT_FOUND));
                }
            }
            McCmd::Flush { delay } => {
                t.counters.cmd_flush += 1;
                s.flush_all(delay, now);
                r.answer(b"OK\r\n", Ok(0));
            }
            // yrmcds has no `stats slabs` nor `stats conns`.
            McCmd::Stats { arg, .. }
                if text
                    && yrmcds
                    && matches!(arg.map(|a| a.get(arena)), Some(b"slabs" | b"conns")) =>
            {
                r.text(b"ERROR\r\n")
            }
            McCmd::Stats { arg, live } => {
                // The counters whoever applies the batch stamped beside the request (the owner
                // loop, the cluster loop, a replayer): apply reads no live counter.
                let live = Live::read(live, arena).unwrap_or_default();
                stats(t, r, shared, live, arg.map(|a| a.get(arena)), now)
            }
            // The CAS field of a successful binary Lock carries its fencing token
            // (`docs/protocol.md`, "Fencing tokens"); memcached clients ignore a Lock reply's CAS.
            McCmd::Lock { key } => match s.lock_for_token(session, key.get(arena), now) {
                Ok(token) => r.answer(b"OK\r\n", Ok(token)),
                Err(LockOutcome::Locked) => r.answer(b"LOCKED\r\n", Err(st::LOCKED)),
                Err(_) => r.answer(b"NOT_FOUND\r\n", Err(st::KEY_NOT_FOUND)),
            },
            McCmd::Unlock { key } => {
                const NOT_LOCKED: &[u8] = b"CLIENT_ERROR object is not locked or not found\r\n";
                match s.unlock(session, key.get(arena), now) {
                    UnlockOutcome::Ok => r.answer(b"OK\r\n", Ok(0)),
                    UnlockOutcome::NotFound => r.answer(NOT_LOCKED, Err(st::KEY_NOT_FOUND)),
                    UnlockOutcome::NotLocked => r.answer(NOT_LOCKED, Err(st::NOT_LOCKED)),
                }
            }
            McCmd::UnlockAll => {
                s.unlock_all(session, now);
                r.answer(b"OK\r\n", Ok(0));
            }
            McCmd::LockToken { key } => {
                let reply = match s.lock_token(session, key.get(arena), now) {
                    Some(token) => McReply::Token(token),
                    None => McReply::Words(b"CLIENT_ERROR object is not locked by you\r\n"),
                };
                r.fx.reply(session, Body::Mc(reply));
            }
            McCmd::LockAndGet { key, touch } => {
                let key = key.get(arena);
                t.counters.cmd_get += 1;
                match s.lock_and_get(session, key, touch, now) {
                    Ok(item) => r.hit(&item),
                    Err(LockOutcome::NotFound) => r.miss(key),
                    Err(_) => r.answer(b"LOCKED\r\n", Err(st::LOCKED)),
                }
            }
            McCmd::ReplaceAndUnlock {
                key,
                flags,
                exptime,
                value,
                cas,
            } => {
                t.counters.cmd_set += 1;
                let (key, value) = (key.get(arena), value.get(arena));
                let status = match s.replace_and_unlock(
                    session,
                    Write {
                        key,
                        flags,
                        exptime,
                        value,
                    },
                    cas,
                    now,
                ) {
                    RauOutcome::Stored { cas } => return r.answer(b"STORED\r\n", Ok(cas)),
                    RauOutcome::NotFound => st::KEY_NOT_FOUND,
                    RauOutcome::NotLocked => st::NOT_LOCKED,
                    RauOutcome::Exists => st::KEY_EXISTS,
                    RauOutcome::TooLarge => st::VALUE_TOO_LARGE,
                    RauOutcome::OutOfMemory => st::OUT_OF_MEMORY,
                };
                r.answer(b"ERROR\r\n", Err(status));
            }
            McCmd::Keys { prefix } => {
                let binary = match form {
                    McForm::Text { .. } => None,
                    McForm::Binary { opaque, .. } => Some(opaque),
                };
                dump_start(t, r.fx, session, prefix.get(arena), binary, now)
            }
            McCmd::Noop | McCmd::Verbosity => r.answer(b"OK\r\n", Ok(0)),
            McCmd::Version => {
                let v = super::VERSION_REPLY;
                r.ok(0, &v[b"VERSION ".len()..v.len() - 2]);
            }
            McCmd::Quit => {
                let body = match (r.form, r.quiet()) {
                    (McForm::Binary { opcode, opaque }, false) => {
                        bin(opcode, st::NO_ERROR, opaque, 0, &[])
                    }
                    _ => Body::Nothing,
                };
                r.fx.push(session, 1, true, body);
            }
            McCmd::KeysNext => unreachable!("continued above"),
        }
    }
}

/// get/gets/gat/gats in text: every key's item, then `END` (one effect for the whole request).
fn text_get(
    t: &mut Tables,
    fx: &mut Effects,
    session: Session,
    keys: &[u8],
    cas: bool,
    touch: Option<i64>,
    now: Now,
) {
    let s = &mut t.store;
    let counters = &mut t.counters;
    let mark = fx.mark();
    // The reply's size on the wire, counted as the items are listed.
    let mut wire = 0;
    for key in (Keys { raw: keys }) {
        counters.cmd_get += 1;
        let item = match touch {
            Some(e) => {
                counters.cmd_touch += 1;
                s.get_and_touch(key, e, now)
            }
            None => s.get(key, now),
        };
        if let Some(item) = item {
            let c = cas.then_some(item.cas);
            wire += super::text_value_len(item.key.len(), item.flags, item.value.len(), c);
            super::put_item(&mut fx.arena, item.key, item.flags, item.cas, item.value);
        }
        if wire > GET_REPLY_CAP {
            // As memcached does when a multi-get outgrows its buffers: say so and close,
            // rather than build a reply of unbounded size.
            fx.arena.bytes.truncate(mark);
            let words = b"SERVER_ERROR out of memory writing get response\r\n";
            return fx.push(session, 1, true, Body::Mc(McReply::Words(words)));
        }
    }
    let items = fx.since(mark);
    fx.reply(session, Body::Mc(McReply::Items { items, cas }));
}

/// `stats [group]` and binary Stat: one `STAT` line or one response per statistic, then the end
/// (or the error for an unknown group).
fn stats(t: &Tables, r: Reply<'_>, shared: &Shared, live: Live, arg: Option<&[u8]>, now: Now) {
    let Reply {
        fx, session, form, ..
    } = r;
    let mark = fx.mark();
    let arena = &mut fx.arena;
    let known =
        crate::server::owner::stats::write(t, shared, live, now, arg, &mut |name, value| {
            effect::put_entry(arena, name.as_bytes());
            effect::put_entry(arena, value);
        });
    let pairs = fx.since(mark);
    fx.reply(session, Body::Mc(McReply::Stats { form, pairs, known }));
}

fn store_status(r: StoreOutcome) -> Result<u64, u16> {
    match r {
        StoreOutcome::Stored { cas } => Ok(cas),
        StoreOutcome::NotStored => Err(st::ITEM_NOT_STORED),
        StoreOutcome::Exists => Err(st::KEY_EXISTS),
        StoreOutcome::NotFound => Err(st::KEY_NOT_FOUND),
        StoreOutcome::Locked => Err(st::LOCKED),
        StoreOutcome::TooLarge => Err(st::VALUE_TOO_LARGE),
        StoreOutcome::OutOfMemory => Err(st::OUT_OF_MEMORY),
    }
}

/// A binary response without key or extras.
#[inline(always)]
fn bin(opcode: u8, status: u16, opaque: u32, cas: u64, value: &'static [u8]) -> Body {
    let head = BinHead {
        opcode,
        status,
        opaque,
    };
    Body::Mc(McReply::Bin { head, cas, value })
}

/// The answer to one request, in its form: text words or a binary response.
struct Reply<'o> {
    fx: &'o mut Effects,
    session: Session,
    form: McForm,
    yrmcds: bool,
}

impl Reply<'_> {
    /// A binary quiet variant: silent on success (and on a miss for the get family).
    #[inline]
    fn quiet(&self) -> bool {
        matches!(self.form, McForm::Binary { opcode, .. } if opc::is_quiet(opcode))
    }

    #[inline(always)]
    fn send(self, body: Body) {
        self.fx.reply(self.session, body);
    }

    /// Text words (nothing with noreply); only for commands that exist in text alone.
    #[inline(always)]
    fn text(self, words: &'static [u8]) {
        let noreply = matches!(self.form, McForm::Text { noreply: true });
        if noreply {
            self.send(Body::Nothing)
        } else {
            self.send(Body::Mc(McReply::Words(words)))
        }
    }

    /// `words` in text; in binary, success with a CAS (silent when quiet) or an error status.
    #[inline(always)]
    fn answer(self, words: &'static [u8], bin: Result<u64, u16>) {
        match (self.form, bin) {
            (McForm::Text { .. }, _) => self.text(words),
            (McForm::Binary { .. }, Ok(cas)) => self.ok(cas, &[]),
            (McForm::Binary { .. }, Err(status)) => self.err(status),
        }
    }

    /// incr/decr's new value: a line in text, 8 bytes big-endian in binary.
    fn number(self, value: u64, cas: u64) {
        match self.form {
            McForm::Text { noreply: true } => self.send(Body::Nothing),
            McForm::Text { noreply: false } => self.send(Body::Mc(McReply::Number(value))),
            McForm::Binary { opcode, opaque } => {
                let body = if self.quiet() {
                    Body::Nothing
                } else {
                    let head = BinHead {
                        opcode,
                        status: st::NO_ERROR,
                        opaque,
                    };
                    Body::Mc(McReply::BinNumber { head, cas, value })
                };
                self.send(body)
            }
        }
    }

    /// A binary success that a quiet variant suppresses.
    #[inline(always)]
    fn ok(self, cas: u64, value: &'static [u8]) {
        let McForm::Binary { opcode, opaque } = self.form else {
            return self.text(b"OK\r\n");
        };
        if self.quiet() {
            self.send(Body::Nothing)
        } else {
            self.send(bin(opcode, st::NO_ERROR, opaque, cas, value))
        }
    }

    /// A found item (binary get family and LaG): answered even by the quiet variants, which
    /// are silent only on a miss; with its key for the K variants.
    fn hit(self, item: &ItemView<'_>) {
        let McForm::Binary { opcode, opaque } = self.form else {
            return self.text(b"OK\r\n");
        };
        let key = if self.with_key() {
            self.fx.bytes(item.key)
        } else {
            Span::EMPTY
        };
        let value = self.fx.bytes(item.value);
        let head = BinHead {
            opcode,
            status: st::NO_ERROR,
            opaque,
        };
        self.send(Body::Mc(McReply::BinItem {
            head,
            cas: item.cas,
            flags: item.flags,
            key,
            value,
        }))
    }

    fn with_key(&self) -> bool {
        matches!(
            self.form,
            McForm::Binary {
                opcode: opc::GETK | opc::GETKQ | opc::GATK | opc::GATKQ | opc::LAGK | opc::LAGKQ,
                ..
            }
        )
    }

    /// A binary error (quiet variants answer errors too).
    fn err(self, status: u16) {
        let McForm::Binary { opcode, opaque } = self.form else {
            return self.text(b"ERROR\r\n");
        };
        let text = binary::status_text(status, self.yrmcds);
        self.send(bin(opcode, status, opaque, 0, text))
    }

    /// A binary miss, which a quiet get suppresses. yrmcds's miss never carries the key, and
    /// its LaGQ answers a miss (`cmd_bin`: "! cmd.quiet() || cmd.command() == LaGQ").
    fn miss(self, key: &[u8]) {
        let McForm::Binary { opcode, opaque } = self.form else {
            return self.text(b"NOT_FOUND\r\n");
        };
        let yrmcds = self.yrmcds;
        if self.quiet() && !(yrmcds && opcode == opc::LAGQ) {
            return self.send(Body::Nothing);
        }
        let text = binary::status_text(st::KEY_NOT_FOUND, yrmcds);
        if yrmcds || !self.with_key() {
            return self.send(bin(opcode, st::KEY_NOT_FOUND, opaque, 0, text));
        }
        // A K variant's miss carries the key (and the status text as its value).
        let key = self.fx.bytes(key);
        let head = BinHead {
            opcode,
            status: st::KEY_NOT_FOUND,
            opaque,
        };
        self.send(Body::Mc(McReply::BinKeyed {
            head,
            key,
            value: text,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::{BINARY_OPS, TEXT_OPS};
    use super::*;
    use crate::server::msg::Span;

    #[test]
    fn text_ops_are_counted_under_their_yrmcds_names() {
        let k = Span::EMPTY;
        let store = |mode, cas| McCmd::Store {
            mode,
            key: k,
            flags: 0,
            exptime: 0,
            value: k,
            cas,
        };
        let arith = |incr| McCmd::Arith {
            key: k,
            incr,
            delta: 1,
            create: None,
            cas: None,
        };
        let get = |cas, touch| McCmd::Get {
            keys: k,
            cas,
            touch,
        };
        let cases = [
            (store(StoreMode::Set, None), "set"),
            (store(StoreMode::Add, None), "add"),
            (store(StoreMode::Replace, None), "replace"),
            (store(StoreMode::Append, None), "append"),
            (store(StoreMode::Prepend, None), "prepend"),
            (store(StoreMode::Set, Some(0)), "cas"),
            (store(StoreMode::Set, Some(7)), "cas"),
            (get(false, None), "get"),
            (get(true, None), "gets"),
            (get(false, Some(1)), "get"),
            (get(true, Some(1)), "gets"),
            (McCmd::Delete { key: k, cas: None }, "delete"),
            (arith(true), "incr"),
            (arith(false), "decr"),
            (McCmd::Touch { key: k, exptime: 0 }, "touch"),
            (McCmd::Lock { key: k }, "lock"),
            (McCmd::Unlock { key: k }, "unlock"),
            (McCmd::UnlockAll, "unlock_all"),
            (
                McCmd::Stats {
                    arg: None,
                    live: Span::EMPTY,
                },
                "stats",
            ),
            (McCmd::Flush { delay: 0 }, "flush_all"),
            (McCmd::Keys { prefix: k }, "keys"),
        ];
        for (cmd, name) in cases {
            let i = text_op_index(&cmd).expect("counted");
            assert_eq!(TEXT_OPS[i], name, "{cmd:?}");
        }
        assert_eq!(text_op_index(&McCmd::KeysNext), None);
        assert_eq!(text_op_index(&McCmd::LockToken { key: k }), None);
    }

    #[test]
    fn binary_ops_list_yrmcds_opcodes_once_each() {
        let mut seen = [false; 256];
        for (name, op) in BINARY_OPS {
            assert!(!seen[usize::from(op)], "{name} twice");
            seen[usize::from(op)] = true;
        }
        assert_eq!(BINARY_OPS[0], ("Get", 0x00));
        assert_eq!(BINARY_OPS[44], ("Keys", 0x50));
    }
}
