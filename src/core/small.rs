//! Short byte strings stored inline: a lock name of up to [`SmallBytes::INLINE`] bytes lives in
//! the record that owns it, so taking and releasing such a lock allocates nothing; longer names
//! go to the heap as before.
//!
//! Owns: the representation only. Must not: be compared or hashed by representation (equal
//! bytes are equal whether inline or not: everything goes through `Deref<Target = [u8]>`).

use std::ops::Deref;

#[derive(Clone)]
pub enum SmallBytes {
    Inline {
        len: u8,
        bytes: [u8; SmallBytes::INLINE],
    },
    Heap(Box<[u8]>),
}

impl SmallBytes {
    /// Inline capacity: with the length byte and the tag the value is 24 bytes, 8 more than a
    /// `Box<[u8]>`, and saves the allocation (16+ bytes of malloc overhead) of every short name.
    pub const INLINE: usize = 22;
}

impl From<&[u8]> for SmallBytes {
    #[inline]
    fn from(b: &[u8]) -> Self {
        if b.len() <= Self::INLINE {
            let mut bytes = [0u8; Self::INLINE];
            bytes[..b.len()].copy_from_slice(b);
            SmallBytes::Inline {
                len: b.len() as u8,
                bytes,
            }
        } else {
            SmallBytes::Heap(b.into())
        }
    }
}

impl Deref for SmallBytes {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            SmallBytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            SmallBytes::Heap(b) => b,
        }
    }
}

impl std::fmt::Debug for SmallBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_strings_read_back_the_same_bytes() {
        for n in [
            0,
            1,
            SmallBytes::INLINE - 1,
            SmallBytes::INLINE,
            SmallBytes::INLINE + 1,
            1000,
        ] {
            let src: Vec<u8> = (0..n).map(|i| i as u8 ^ 0x5a).collect();
            let s = SmallBytes::from(&src[..]);
            assert_eq!(&*s, &src[..], "{n} bytes");
            assert_eq!(
                matches!(s, SmallBytes::Inline { .. }),
                n <= SmallBytes::INLINE
            );
        }
        assert_eq!(std::mem::size_of::<SmallBytes>(), 24);
    }
}
