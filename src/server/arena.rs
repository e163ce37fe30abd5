//! Byte arenas: a batch's or a reply's variable bytes in one buffer, named by [`Span`]s.

/// A byte range in a batch arena.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub len: u32,
}

impl Span {
    pub const EMPTY: Span = Span { start: 0, len: 0 };

    #[inline]
    pub fn get<'a>(&self, arena: &'a [u8]) -> &'a [u8] {
        let start = self.start as usize;
        &arena[start..start + self.len as usize]
    }
}

/// A byte arena that hands out [`Span`]s.
#[derive(Debug, Default)]
pub struct Arena {
    pub bytes: Vec<u8>,
}

impl Arena {
    #[inline]
    pub fn push(&mut self, data: &[u8]) -> Span {
        let start = self.bytes.len() as u32;
        self.bytes.extend_from_slice(data);
        Span {
            start,
            len: data.len() as u32,
        }
    }
}
