//! Short byte strings stored inline: a lock name of up to [`SmallBytes::INLINE`] bytes lives in
//! the record that owns it, so taking and releasing such a lock allocates nothing, and a copy is
//! a 24-byte copy; longer names go to the heap once and copies share them.
//!
//! Owns: the representation only. Must not: be compared, hashed or ordered by representation
//! (equal bytes are equal whether inline or not: everything goes through the `[u8]` they hold,
//! so a map keyed by `SmallBytes` is looked up with a `&[u8]`).

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

#[derive(Clone)]
pub enum SmallBytes {
    Inline {
        len: u8,
        bytes: [u8; SmallBytes::INLINE],
    },
    /// Arc rather than Rc only so that a table may move to the owner thread; never shared
    /// across threads.
    Heap(Arc<[u8]>),
}

impl SmallBytes {
    /// Inline capacity: with the length byte and the tag the value is 24 bytes, 8 more than a
    /// pointer to the heap, and saves the allocation (16+ bytes of malloc overhead) of every
    /// short name.
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

impl AsRef<[u8]> for SmallBytes {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Borrow<[u8]> for SmallBytes {
    #[inline]
    fn borrow(&self) -> &[u8] {
        self
    }
}

impl PartialEq for SmallBytes {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SmallBytes {}

impl Hash for SmallBytes {
    /// As the `[u8]` hashes (`Borrow` requires it).
    #[inline]
    fn hash<H: Hasher>(&self, h: &mut H) {
        (**self).hash(h)
    }
}

impl PartialOrd for SmallBytes {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SmallBytes {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (**self).cmp(&**other)
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

    #[test]
    fn equal_bytes_are_equal_and_hash_alike_whatever_the_representation() {
        use std::hash::BuildHasher;
        let long = [7u8; 40];
        let a = SmallBytes::from(&long[..]);
        let b = a.clone();
        assert!(
            matches!((&a, &b), (SmallBytes::Heap(x), SmallBytes::Heap(y)) if Arc::ptr_eq(x, y))
        );
        let s = std::collections::hash_map::RandomState::new();
        for bytes in [&b"k"[..], &long[..]] {
            let x = SmallBytes::from(bytes);
            assert_eq!(s.hash_one(&x), s.hash_one(bytes), "hashes as its bytes");
            assert_eq!(x, SmallBytes::from(bytes));
        }
        // Byte order, inline against heap both ways.
        assert!(SmallBytes::from(&b"\x01"[..]) < SmallBytes::from(&long[..]));
        assert!(SmallBytes::from(&long[..]) < SmallBytes::from(&b"\x08"[..]));
        let mut m: std::collections::HashMap<SmallBytes, u8> = Default::default();
        m.insert(SmallBytes::from(&b"name"[..]), 1);
        assert_eq!(m.get(&b"name"[..]), Some(&1));
    }
}
