//! wit-bindgen glue: the only place that knows the WIT bindings. Compiled for
//! wasm only.

#![allow(unsafe_code, missing_docs)] // generated bindings

use std::cell::RefCell;

use crate::machine::StateMachine;
use crate::snapshot::SnapshotScope;
use crate::types;

wit_bindgen::generate!({
    world: "guest",
    path: "../wit",
});

use exports::statestore::core::store as wit;

/// Small blocks from size-class free lists, the rest from wasi-libc's
/// dlmalloc. See [`pool`].
#[global_allocator]
static ALLOCATOR: pool::Pool = pool::Pool::new();

/// A size-class front end for the component's allocator.
///
/// Handling a request allocates a handful of small blocks (a reply's
/// payload, property list and timestamp) and frees them when its outputs
/// are encoded; in dlmalloc each such pair costs about as much as the
/// request's own logic (measured: issue 7, BENCHMARKS.md). Here a block of
/// up to 256 bytes comes from the free list of its size class (multiples of
/// 8 bytes) in a few instructions, and goes back to it on free; an empty
/// list is refilled from 64 KiB regions taken from dlmalloc. Blocks carry no
/// header (the `Layout` passed to `dealloc` gives the class), so a stored
/// key costs no more than in dlmalloc (which adds 4 bytes and rounds to 8).
/// Freed small blocks stay in their class for reuse; they are not returned
/// to dlmalloc.
mod pool {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::UnsafeCell;
    use std::ptr;

    const STEP: usize = 8;
    const CLASSES: usize = 32;
    /// Largest block served from the classes.
    const MAX: usize = STEP * CLASSES;
    const REGION: usize = 64 * 1024;

    struct State {
        /// Head of each class's free list; a free block holds the next.
        free: [*mut u8; CLASSES],
        /// The unused rest of the current region.
        next: *mut u8,
        left: usize,
    }

    pub struct Pool(UnsafeCell<State>);

    // SAFETY: the component is single-threaded wasm (no `atomics` target
    // feature: checked below), so the state is never shared between threads.
    unsafe impl Sync for Pool {}

    #[cfg(target_feature = "atomics")]
    compile_error!("the pool allocator assumes single-threaded wasm");

    impl Pool {
        pub const fn new() -> Pool {
            Pool(UnsafeCell::new(State {
                free: [ptr::null_mut(); CLASSES],
                next: ptr::null_mut(),
                left: 0,
            }))
        }
    }

    /// The class of a layout the pool serves.
    fn class(layout: Layout) -> Option<usize> {
        let size = layout.size();
        (size != 0 && size <= MAX && layout.align() <= STEP).then(|| (size - 1) / STEP)
    }

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
                let region =
                    unsafe { System.alloc(Layout::from_size_align_unchecked(REGION, STEP)) };
                if region.is_null() {
                    return region;
                }
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
                    // SAFETY: as in `alloc`; the block is at least 8 bytes and
                    // 8-aligned (its class's size and the regions' alignment).
                    let st = unsafe { &mut *self.0.get() };
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
}

struct Component;

impl wit::Guest for Component {
    type Store = Store;
}

struct Store(RefCell<StateMachine>);

impl wit::GuestStore for Store {
    fn new(config: wit::Config) -> Store {
        match StateMachine::new(config_in(config)) {
            Ok(m) => Store(RefCell::new(m)),
            // Documented in the WIT: callers check with validate-config first.
            Err(e) => panic!("{e}"),
        }
    }

    fn validate_config(config: wit::Config) -> Result<(), wit::Error> {
        config_in(config).validate().map_err(error_out)
    }

    fn restore(config: wit::Config, snapshot: Vec<u8>) -> Result<wit::Store, wit::Error> {
        let machine = StateMachine::restore(config_in(config), &snapshot).map_err(error_out)?;
        Ok(wit::Store::new(Store(RefCell::new(machine))))
    }

    fn handle(&self, message: wit::InboundMessage, now: u64) {
        self.0.borrow_mut().handle(&message_in(message), now);
    }

    fn handle_batch(&self, messages: Vec<wit::InboundMessage>, now: u64) -> Vec<wit::Output> {
        let mut m = self.0.borrow_mut();
        for message in messages {
            m.handle(&message_in(message), now);
        }
        m.take_outputs().into_iter().map(output_out).collect()
    }

    fn handle_wire(&self, batch: Vec<u8>, now: u64) -> Result<Vec<u8>, wit::Error> {
        self.0
            .borrow_mut()
            .handle_wire(&batch, now)
            .map_err(error_out)
    }

    fn poll_wire(&self) -> Vec<u8> {
        self.0.borrow_mut().poll_wire()
    }

    fn client_disconnected(&self, client_id: String, now: u64) {
        self.0.borrow_mut().client_disconnected(&client_id, now);
    }

    fn timeout(&self, now: u64) {
        self.0.borrow_mut().timeout(now);
    }

    fn poll_outputs(&self) -> Vec<wit::Output> {
        let outputs = self.0.borrow_mut().take_outputs();
        outputs.into_iter().map(output_out).collect()
    }

    fn next_deadline(&self) -> Option<u64> {
        self.0.borrow().next_deadline()
    }

    fn snapshot(&self, scope: wit::SnapshotScope) -> Vec<u8> {
        let scope = match scope {
            wit::SnapshotScope::Everything => SnapshotScope::Everything,
            wit::SnapshotScope::Durable => SnapshotScope::Durable,
        };
        self.0.borrow().snapshot_with(scope)
    }

    fn replay(&self, records: Vec<Vec<u8>>) -> Result<(), wit::Error> {
        let mut m = self.0.borrow_mut();
        for r in &records {
            m.replay(r).map_err(error_out)?;
        }
        Ok(())
    }
}

fn config_in(c: wit::Config) -> types::Config {
    types::Config {
        node_id: c.node_id,
        server_client_id: c.server_client_id,
        persist: match c.persist {
            wit::PersistMode::None => types::Persist::None,
            wit::PersistMode::All => types::Persist::All,
            wit::PersistMode::Flagged => types::Persist::Flagged,
        },
        hash_seed: c.hash_seed,
        quota: types::Quota {
            max_keys: c.quota.max_keys,
            max_bytes: c.quota.max_bytes,
            max_key_bytes: c.quota.max_key_bytes,
            max_value_bytes: c.quota.max_value_bytes,
        },
    }
}

fn error_out(e: types::Error) -> wit::Error {
    match e {
        types::Error::InvalidConfig(m) => wit::Error::InvalidConfig(m),
        types::Error::BadSnapshot(m) => wit::Error::BadSnapshot(m),
        types::Error::UnsupportedVersion(v) => wit::Error::UnsupportedVersion(v),
        types::Error::BadRecord(m) => wit::Error::BadRecord(m),
        types::Error::Other(m) => wit::Error::Other(m),
    }
}

fn message_in(m: wit::InboundMessage) -> types::InboundMessage {
    types::InboundMessage {
        topic: m.topic,
        payload: m.payload,
        qos: m.qos,
        response_topic: m.response_topic,
        correlation_data: m.correlation_data,
        message_expiry_interval: m.message_expiry_interval,
        content_type: m.content_type,
        payload_format_indicator: m.payload_format_indicator,
        user_properties: m
            .user_properties
            .into_iter()
            .map(|p| (p.name, p.value))
            .collect(),
        client_id: m.client_id,
        received_at: m.received_at,
    }
}

fn output_out(o: types::Output) -> wit::Output {
    match o {
        types::Output::Publish(m) => wit::Output::Publish(wit::OutboundMessage {
            kind: match m.kind {
                types::PublishKind::Response => wit::PublishKind::Response,
                types::PublishKind::Notification => wit::PublishKind::Notification,
            },
            topic: m.topic.to_string(),
            payload: m.payload.to_vec(),
            qos: m.qos,
            retain: m.retain,
            correlation_data: m.correlation_data.map(|c| c.to_vec()),
            message_expiry_interval: m.message_expiry_interval,
            content_type: m.content_type.map(|c| c.to_string()),
            payload_format_indicator: m.payload_format_indicator,
            response_topic: m.response_topic.map(|t| t.to_string()),
            user_properties: m
                .user_properties
                .into_iter()
                .map(|(name, value)| wit::UserProperty {
                    name: name.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            target_client: m.target_client.map(|t| t.to_string()),
        }),
        types::Output::Journal(record) => wit::Output::Journal(record),
        types::Output::Violation { client_id, reason } => {
            wit::Output::Violation(wit::Violation { client_id, reason })
        }
    }
}

export!(Component);

/// `memcmp` for the component, replacing wasi-libc's byte-at-a-time loop:
/// eight bytes per step. Every slice and string comparison goes through it
/// (topics of ~100 bytes on every request, keys, the dedup cache), and in
/// wasm it was the single largest item of a request's profile.
///
/// # Safety
///
/// The C contract: `a` and `b` are valid for reads of `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, and both pointers are valid for n bytes;
        // unaligned reads are allowed.
        let (x, y) = unsafe {
            (
                core::ptr::read_unaligned(a.add(i).cast::<[u8; 8]>()),
                core::ptr::read_unaligned(b.add(i).cast::<[u8; 8]>()),
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

/// `bcmp` (equality only), which LLVM emits for `memcmp(..) == 0`.
///
/// # Safety
///
/// As [`memcmp`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the same contract.
    unsafe { memcmp(a, b, n) }
}
