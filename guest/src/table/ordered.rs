//! The key table's ordered index: slot positions sorted by their keys, for
//! SCAN and snapshots.
//!
//! The positions are `u32`s in runs ("chunks") of at most [`CHUNK`], each
//! sorted, every key of a chunk below every key of the next: a two-level
//! sorted vector. An insert or removal moves at most one chunk's positions,
//! a lookup is a binary search over the chunks' last keys and then inside
//! one chunk. It costs about 5 bytes a key (a `u32` and the chunks' slack),
//! where an ordered map of keys would copy every key. The keys themselves
//! stay in the table's slots: every operation takes `key_of`, which reads
//! the key at a position.

/// Most positions in one chunk: an insert moves at most 2 KiB.
pub const CHUNK: usize = 512;

/// Slot positions in key order. See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Ordered {
    chunks: Vec<Vec<u32>>,
}

/// Where a key is, or would go.
struct Place {
    chunk: usize,
    at: Result<usize, usize>,
}

impl Ordered {
    /// An empty index.
    pub fn new() -> Ordered {
        Ordered::default()
    }

    /// Finds `key`: the chunk that holds it or would (the first whose last
    /// key is not below it, else the last chunk), and the position in it.
    fn place<'s>(&self, key: &[u8], key_of: impl Fn(u32) -> &'s [u8]) -> Option<Place> {
        let last = self.chunks.len().checked_sub(1)?;
        let chunk = self
            .chunks
            .partition_point(|c| c.last().is_some_and(|&p| key_of(p) < key))
            .min(last);
        let at = self.chunks[chunk].binary_search_by(|&p| key_of(p).cmp(key));
        Some(Place { chunk, at })
    }

    /// Adds position `pos`, whose key is `key` (not already present).
    pub fn insert<'s>(&mut self, key: &[u8], pos: u32, key_of: impl Fn(u32) -> &'s [u8]) {
        let Some(Place { chunk, at }) = self.place(key, key_of) else {
            let mut first = Vec::with_capacity(CHUNK);
            first.push(pos);
            self.chunks.push(first);
            return;
        };
        let at = at.unwrap_or_else(|i| i);
        let is_last = chunk + 1 == self.chunks.len();
        let run = &mut self.chunks[chunk];
        if run.len() < CHUNK {
            run.insert(at, pos); // Within its capacity: no reallocation.
            return;
        }
        // Full. Keys arriving in order (at the very end) start a new chunk,
        // so that ascending inserts leave full chunks behind; anything else
        // splits the chunk in two halves.
        let mut next = Vec::with_capacity(CHUNK);
        if at == CHUNK && is_last {
            next.push(pos);
        } else {
            next.extend_from_slice(&run[CHUNK / 2..]);
            run.truncate(CHUNK / 2);
            if at <= CHUNK / 2 {
                run.insert(at, pos);
            } else {
                next.insert(at - CHUNK / 2, pos);
            }
        }
        self.chunks.insert(chunk + 1, next);
    }

    /// Removes `key`; returns its position if it was there.
    pub fn remove<'s>(&mut self, key: &[u8], key_of: impl Fn(u32) -> &'s [u8]) -> Option<u32> {
        let Place { chunk, at } = self.place(key, key_of)?;
        let at = at.ok()?;
        let pos = self.chunks[chunk].remove(at);
        let left = self.chunks[chunk].len();
        if left == 0 {
            self.chunks.remove(chunk);
        } else if left < CHUNK / 4 {
            // Mostly empty: merge with a neighbour that has room, so that a
            // table that shrank does not keep a chunk per few keys.
            let merge = [chunk.checked_sub(1), Some(chunk + 1)]
                .into_iter()
                .flatten()
                .find(|&n| self.chunks.get(n).is_some_and(|c| c.len() + left <= CHUNK));
            if let Some(n) = merge {
                let (low, high) = (chunk.min(n), chunk.max(n));
                let moved = self.chunks.remove(high);
                self.chunks[low].extend_from_slice(&moved);
            }
        }
        Some(pos)
    }

    /// Changes the position of `key` (present) to `pos`.
    pub fn repoint<'s>(&mut self, key: &[u8], pos: u32, key_of: impl Fn(u32) -> &'s [u8]) {
        if let Some(Place { chunk, at: Ok(at) }) = self.place(key, key_of) {
            self.chunks[chunk][at] = pos;
        }
    }

    /// Positions in key order, from the first key above `after` (from the
    /// first key when `None`).
    pub fn after<'s>(
        &self,
        after: Option<&[u8]>,
        key_of: impl Fn(u32) -> &'s [u8],
    ) -> impl Iterator<Item = u32> + '_ {
        let (chunk, at) = match after.and_then(|key| self.place(key, key_of)) {
            None => (0, 0),
            Some(Place { chunk, at }) => (chunk, at.map_or_else(|i| i, |i| i + 1)),
        };
        self.chunks
            .iter()
            .skip(chunk)
            .enumerate()
            .flat_map(move |(n, c)| c[if n == 0 { at } else { 0 }..].iter().copied())
    }

    /// Number of positions.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Bytes the index holds (its chunks' capacity and their headers).
    pub fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * core::mem::size_of::<Vec<u32>>()
            + self
                .chunks
                .iter()
                .map(|c| c.capacity() * core::mem::size_of::<u32>())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A table stand-in: keys at positions, with the index over them.
    #[derive(Default)]
    struct Keys {
        keys: Vec<Vec<u8>>,
        index: Ordered,
    }

    impl Keys {
        fn put(&mut self, key: &[u8]) {
            if self.keys.iter().any(|k| k == key) {
                return;
            }
            let pos = self.keys.len() as u32;
            self.keys.push(key.to_vec());
            let keys = &self.keys;
            self.index.insert(key, pos, |p| &keys[p as usize]);
        }

        /// Removes as the table does: the last key moves into the hole.
        fn del(&mut self, key: &[u8]) {
            let keys = &self.keys;
            let Some(pos) = self.index.remove(key, |p| &keys[p as usize]) else {
                return;
            };
            let last = self.keys.len() - 1;
            if pos as usize != last {
                let moved = self.keys[last].clone();
                let keys = &self.keys;
                self.index.repoint(&moved, pos, |p| &keys[p as usize]);
            }
            self.keys.swap_remove(pos as usize);
        }

        fn after(&self, key: Option<&[u8]>) -> Vec<Vec<u8>> {
            let keys = &self.keys;
            self.index
                .after(key, |p| &keys[p as usize])
                .map(|p| keys[p as usize].clone())
                .collect()
        }
    }

    #[test]
    fn ascending_inserts_fill_whole_chunks() {
        let mut k = Keys::default();
        for i in 0..(CHUNK * 4) as u32 {
            k.put(&i.to_be_bytes());
        }
        assert_eq!(k.index.chunks.len(), 4);
        assert!(k.index.chunks.iter().all(|c| c.len() == CHUNK));
        assert!(k.index.heap_bytes() < CHUNK * 4 * 5);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn matches_a_sorted_map(ops in prop::collection::vec((any::<bool>(), 0u16..3000, any::<u16>()), 1..4000)) {
            let mut k = Keys::default();
            let mut model = BTreeMap::new();
            for (put, n, probe) in ops {
                let key = n.to_be_bytes()[..1 + usize::from(n % 2)].to_vec();
                let key = [key, n.to_string().into_bytes()].concat();
                if put {
                    k.put(&key);
                    model.insert(key, ());
                } else {
                    k.del(&key);
                    model.remove(&key);
                }
                if probe % 97 == 0 {
                    let from = probe.to_be_bytes();
                    let want: Vec<Vec<u8>> = model
                        .range::<[u8], _>((std::ops::Bound::Excluded(&from[..]), std::ops::Bound::Unbounded))
                        .map(|(k, _)| k.clone())
                        .collect();
                    prop_assert_eq!(k.after(Some(&from)), want);
                }
            }
            prop_assert_eq!(k.index.len(), model.len());
            let all: Vec<Vec<u8>> = model.keys().cloned().collect();
            prop_assert_eq!(k.after(None), all.clone());
            // After each present key: everything above it, exactly.
            for (i, key) in all.iter().enumerate().step_by(37) {
                prop_assert_eq!(k.after(Some(key)), all[i + 1..].to_vec());
            }
            prop_assert!(k.index.chunks.iter().all(|c| !c.is_empty() && c.len() <= CHUNK));
        }
    }
}
