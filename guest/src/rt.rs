//! What the component links in place of parts of wasi-libc, compiled on
//! every target so that it is tested natively (`component.rs` only exports
//! it, on wasm): the allocator, `cabi_realloc`, and `memcmp`.
//!
//! # The allocator
//!
//! Handling a request allocates a handful of small blocks (a reply's
//! payload, property list and timestamp) and frees them when its outputs
//! are encoded; in dlmalloc each such pair costs about as much as the
//! request's own logic (measured in BENCHMARKS.md). Here a block of
//! up to 256 bytes comes from the free list of its size class (multiples of
//! 8 bytes) in a few instructions, and goes back to it on free; an empty
//! list is refilled from 64 KiB regions taken from dlmalloc. Blocks carry no
//! header (the `Layout` passed to `dealloc` gives the class), so a stored
//! key costs no more than in dlmalloc (which adds 4 bytes and rounds to 8).
//! Freed small blocks stay in their class for reuse; they are not returned
//! to dlmalloc. The 64 KiB granules a region touches (two at most) are
//! marked in a bitmap of the 32-bit address space (8 KiB), so a small block
//! that did not come from a region (one `cabi_realloc` made, below) goes
//! back to dlmalloc when it is freed rather than into a class, unless it
//! shares a granule with a region: filed into a class, the 10,000 journal
//! records of a `replay` call stayed there, unused, and replaying a journal
//! cost about 55 bytes a key for good (BENCHMARKS.md). Regions are not
//! aligned to their granule: dlmalloc's aligned allocation cost more (15
//! bytes a key at 100 k keys) than the few blocks the shared granules keep.
//!
//! # `cabi_realloc`
//!
//! The canonical ABI allocates through the component's `cabi_realloc`: the
//! arguments of our exports (which Rust frees through the global allocator)
//! and the results of our imports (the environment strings a panic reads
//! through wasi-libc, which wasi-libc frees with `free`). The standard
//! library's `cabi_realloc` uses the global allocator, so a string from the
//! pool reached dlmalloc's `free` and a panic under a host with real WASI
//! became an out-of-bounds trap. Ours takes memory from [`System`]
//! (dlmalloc, what `free` expects), rounded up to a multiple of the pool's
//! step. When Rust frees such a block the pool sees it is not in a region
//! and hands it back to dlmalloc, unless it shares a granule with a region
//! (or, natively, where addresses pass 4 GiB and the bitmap is indexed
//! modulo its size, a region's granule modulo 4 GiB): then it is taken into
//! a class, which is sound: it is real memory of at least the class's size
//! (the rounding) and alignment (8 or more). A region's block is never
//! mistaken for a system block: every granule a region touches is marked.
#![allow(unsafe_code)]
// an allocator and C-ABI functions; each block says why it is sound
// Natively only the tests use it; the component exports it.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;

const STEP: usize = 8;
const CLASSES: usize = 32;
/// Largest block served from the classes.
const MAX: usize = STEP * CLASSES;
const REGION: usize = 64 * 1024;

/// 64 KiB granules of the 32-bit address space, one bit each.
const GRANULES: usize = 1 << 16;

struct State {
    /// Head of each class's free list; a free block holds the next.
    free: [*mut u8; CLASSES],
    /// Which 64 KiB granules a region touches (see the module documentation).
    regions: [u64; GRANULES / 64],
    /// The unused rest of the current region.
    next: *mut u8,
    left: usize,
}

/// The allocator: see the module documentation.
pub struct Pool(UnsafeCell<State>);

// SAFETY: the component is single-threaded wasm (no `atomics` target
// feature: `component.rs` refuses to build with it), so the state is never
// shared between threads. Native tests use a pool from one thread only.
unsafe impl Sync for Pool {}

impl Pool {
    /// An empty pool (it takes regions from [`System`] as it needs them).
    pub const fn new() -> Pool {
        Pool(UnsafeCell::new(State {
            free: [ptr::null_mut(); CLASSES],
            regions: [0; GRANULES / 64],
            next: ptr::null_mut(),
            left: 0,
        }))
    }
}

/// The bit of the granule `p` is in.
fn granule(p: *mut u8) -> (usize, u64) {
    let g = (p.addr() / REGION) % GRANULES;
    (g / 64, 1 << (g % 64))
}

impl State {
    /// Whether `block` is in one of our regions.
    fn owns(&self, block: *mut u8) -> bool {
        let (word, bit) = granule(block);
        self.regions[word] & bit != 0
    }
}

/// The class of a layout the pool serves.
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size();
    (size != 0 && size <= MAX && layout.align() <= STEP).then(|| (size - 1) / STEP)
}

// SAFETY: every block handed out is either a fresh `System` block of the
// layout, or a carved or recycled block of the layout's size class (at least
// the layout's size, 8-aligned, and `class` refuses larger alignments), and no
// block is handed out twice before it is freed.
unsafe impl GlobalAlloc for Pool {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class(layout) else {
            // SAFETY: forwarded as is.
            return unsafe { System.alloc(layout) };
        };
        // SAFETY: single-threaded, and no other borrow of the state is
        // live (the pool never calls itself).
        let st = unsafe { &mut *self.0.get() };
        let head = st.free[c];
        if !head.is_null() {
            // SAFETY: a free block of this class holds the next pointer.
            st.free[c] = unsafe { head.cast::<*mut u8>().read() };
            return head;
        }
        let size = (c + 1) * STEP;
        if st.left < size {
            // SAFETY: a non-zero size with a valid alignment.
            let region = unsafe { System.alloc(Layout::from_size_align_unchecked(REGION, STEP)) };
            if region.is_null() {
                return region;
            }
            let (word, bit) = granule(region);
            st.regions[word] |= bit;
            let (word, bit) = granule(region.wrapping_add(REGION - 1));
            st.regions[word] |= bit;
            st.next = region;
            st.left = REGION;
        }
        let block = st.next;
        // SAFETY: `size <= left`: still inside the region.
        st.next = unsafe { block.add(size) };
        st.left -= size;
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        match class(layout) {
            Some(c) => {
                // SAFETY: as in `alloc`.
                let st = unsafe { &mut *self.0.get() };
                if !st.owns(block) {
                    // SAFETY: not from a region, so from System (a fresh
                    // block of a class layout is always carved from one).
                    return unsafe { System.dealloc(block, layout) };
                }
                // SAFETY: the block is at least 8 bytes and 8-aligned (its
                // class's size and the regions' alignment).
                unsafe { block.cast::<*mut u8>().write(st.free[c]) };
                st.free[c] = block;
            }
            // SAFETY: it came from System.alloc with this layout.
            None => unsafe { System.dealloc(block, layout) },
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `GlobalAlloc::realloc`'s contract makes this layout valid.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class(layout), class(new)) {
            // Both large: dlmalloc may grow in place.
            // SAFETY: it came from System.alloc with `layout`.
            (None, None) => unsafe { System.realloc(block, layout, new_size) },
            // The same class: nothing to do.
            (Some(a), Some(b)) if a == b => block,
            _ => {
                // SAFETY: as the default `GlobalAlloc::realloc`.
                unsafe {
                    let moved = self.alloc(new);
                    if !moved.is_null() {
                        ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                        self.dealloc(block, layout);
                    }
                    moved
                }
            }
        }
    }
}

/// `cabi_realloc` of the canonical ABI, from [`System`] (see the module
/// documentation): allocate `new_len` bytes aligned to `align` (when
/// `old_len` is 0), or grow `old_ptr` to `new_len`.
///
/// # Safety
///
/// `align` is a power of two; `old_ptr` is null or came from this function
/// with `old_len` and `align`; `new_len` is not 0 when `old_len` is not.
pub unsafe fn cabi_realloc(
    old_ptr: *mut u8,
    old_len: usize,
    align: usize,
    new_len: usize,
) -> *mut u8 {
    if old_len == 0 && new_len == 0 {
        return ptr::without_provenance_mut(align);
    }
    // Whole steps, so that the block fills the size class the pool files it
    // under if Rust frees it (a dlmalloc block of 100 bytes has no room for
    // the 104 of its class).
    let (Some(old_len), Some(new_len)) = (
        old_len.checked_next_multiple_of(STEP),
        new_len.checked_next_multiple_of(STEP),
    ) else {
        std::process::abort();
    };
    let ptr = if old_len == 0 {
        // SAFETY: `align` is a power of two (the caller's contract) and the
        // size is not zero.
        unsafe { System.alloc(Layout::from_size_align_unchecked(new_len, align)) }
    } else {
        // SAFETY: `old_ptr` came from `System` with this layout, and
        // `new_len` is not zero (the caller's contract).
        unsafe {
            System.realloc(
                old_ptr,
                Layout::from_size_align_unchecked(old_len, align),
                new_len,
            )
        }
    };
    if ptr.is_null() {
        std::process::abort();
    }
    ptr
}

/// `memcmp`, eight bytes per step (wasi-libc's goes byte by byte). Every
/// slice and string comparison in the component goes through it (topics of
/// ~100 bytes on every request, keys, the dedup cache), and in wasm it was
/// the single largest item of a request's profile.
///
/// # Safety
///
/// The C contract: `a` and `b` are valid for reads of `n` bytes.
pub unsafe fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, and both pointers are valid for n bytes;
        // unaligned reads are allowed.
        let (x, y) = unsafe {
            (
                ptr::read_unaligned(a.add(i).cast::<[u8; 8]>()),
                ptr::read_unaligned(b.add(i).cast::<[u8; 8]>()),
            )
        };
        if x != y {
            // Big-endian: the first differing byte decides.
            return if u64::from_be_bytes(x) < u64::from_be_bytes(y) {
                -1
            } else {
                1
            };
        }
        i += 8;
    }
    while i < n {
        // SAFETY: i < n.
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator (the tests need no crate for it).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn memcmp_agrees_with_slice_ordering() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let n = rng.below(40) as usize;
            let a: Vec<u8> = (0..n).map(|_| rng.below(4) as u8 * 60).collect();
            let mut b = a.clone();
            if n > 0 && rng.below(3) > 0 {
                let at = rng.below(n as u64) as usize;
                b[at] = rng.below(256) as u8;
            }
            // SAFETY: both slices hold n bytes.
            let got = unsafe { memcmp(a.as_ptr(), b.as_ptr(), n) };
            assert_eq!(got.signum(), a.cmp(&b) as i32, "{a:?} {b:?}");
        }
        // SAFETY: zero bytes are read.
        assert_eq!(unsafe { memcmp(ptr::null(), ptr::null(), 0) }, 0);
    }

    /// Random allocations, reallocations and frees through one pool, each
    /// block filled with its own pattern: no block overlaps another, and
    /// none loses its contents.
    #[test]
    fn pool_blocks_keep_their_contents() {
        let pool = Pool::new();
        let mut rng = Rng(42);
        let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
        let fill = |p: *mut u8, len: usize, tag: u8| {
            // SAFETY: `p` is a live block of at least `len` bytes.
            unsafe { ptr::write_bytes(p, tag, len) }
        };
        let check = |p: *mut u8, len: usize, tag: u8| {
            // SAFETY: as in `fill`.
            let s = unsafe { std::slice::from_raw_parts(p, len) };
            assert!(
                s.iter().all(|&b| b == tag),
                "block {p:?} of {len} lost its contents"
            );
        };
        for step in 0..50_000u32 {
            let tag = (step % 251) as u8 + 1;
            match rng.below(4) {
                0 | 1 => {
                    let limit = if rng.below(8) == 0 { 5_000 } else { 300 };
                    let size = 1 + rng.below(limit) as usize;
                    let align = [1, 2, 4, 8, 16][rng.below(5) as usize];
                    let layout = Layout::from_size_align(size, align).expect("layout");
                    // SAFETY: a non-zero size.
                    let p = unsafe { pool.alloc(layout) };
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "aligned");
                    fill(p, size, tag);
                    live.push((p, layout, tag));
                }
                2 if !live.is_empty() => {
                    let i = rng.below(live.len() as u64) as usize;
                    let (p, layout, t) = live.swap_remove(i);
                    check(p, layout.size(), t);
                    // SAFETY: allocated by this pool with this layout.
                    unsafe { pool.dealloc(p, layout) };
                }
                _ if !live.is_empty() => {
                    let i = rng.below(live.len() as u64) as usize;
                    let (p, layout, t) = live[i];
                    let new = 1 + rng.below(600) as usize;
                    // SAFETY: allocated by this pool with this layout; a non-zero size.
                    let q = unsafe { pool.realloc(p, layout, new) };
                    assert!(!q.is_null());
                    check(q, layout.size().min(new), t);
                    let layout = Layout::from_size_align(new, layout.align()).expect("layout");
                    fill(q, new, tag);
                    live[i] = (q, layout, tag);
                }
                _ => {}
            }
        }
        for (p, layout, t) in live {
            check(p, layout.size(), t);
            // SAFETY: as above.
            unsafe { pool.dealloc(p, layout) };
        }
    }

    /// A block `cabi_realloc` made (from the system allocator) may be freed
    /// by the pool (what Rust does with an export's arguments) and by the
    /// system allocator (what wasi-libc does with an import's results).
    #[test]
    fn cabi_realloc_blocks_are_the_system_allocators() {
        let pool = Pool::new();
        for size in [1, 8, 100, 256, 257, 4096] {
            // SAFETY: align 8, no old block.
            let p = unsafe { cabi_realloc(ptr::null_mut(), 0, 8, size) };
            // SAFETY: grown from the same allocator.
            let p = unsafe { cabi_realloc(p, size, 8, size * 2) };
            // SAFETY: `System` made it with this layout.
            unsafe { System.dealloc(p, Layout::from_size_align_unchecked(size * 2, 8)) };
            // SAFETY: as above.
            let q = unsafe { cabi_realloc(ptr::null_mut(), 0, 8, size) };
            let layout = Layout::from_size_align(size, 8).expect("layout");
            // SAFETY: the pool's state, from this thread alone.
            let foreign = !unsafe { &*pool.0.get() }.owns(q);
            // SAFETY: a block of this layout: the pool hands it back to
            // `System`, which made it (or, when it shares a granule with a
            // region, keeps it in its class, which is sound: see `cabi_realloc`).
            unsafe { pool.dealloc(q, layout) };
            if size <= MAX {
                // SAFETY: a non-zero size.
                let r = unsafe { pool.alloc(layout) };
                // SAFETY: the pool's state, from this thread alone.
                assert!(unsafe { &*pool.0.get() }.owns(r), "a region's block");
                if foreign {
                    assert_ne!(r, q, "a system block went back to the system");
                }
                // SAFETY: the pool made it with this layout.
                unsafe { pool.dealloc(r, layout) };
            }
        }
        // SAFETY: zero-sized: a dangling, aligned pointer.
        assert_eq!(
            unsafe { cabi_realloc(ptr::null_mut(), 0, 16, 0) } as usize,
            16
        );
    }
}
