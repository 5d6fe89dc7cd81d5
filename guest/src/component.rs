//! wit-bindgen glue: the only place that knows the WIT bindings. Compiled for
//! wasm only.

#![allow(unsafe_code, missing_docs)] // generated bindings

use std::cell::RefCell;

use crate::SnapshotCursor;
use crate::machine::StateMachine;
use crate::snapshot::SnapshotScope;
use crate::types;

wit_bindgen::generate!({
    world: "guest",
    path: "../wit",
});

use exports::statestore::core::store as wit;

/// Small blocks from size-class free lists, the rest from wasi-libc's
/// dlmalloc: [`crate::rt::Pool`].
#[global_allocator]
static ALLOCATOR: crate::rt::Pool = crate::rt::Pool::new();

#[cfg(target_feature = "atomics")]
compile_error!("the pool allocator assumes single-threaded wasm");

/// The component's `cabi_realloc`, overriding the standard library's weak
/// one: see [`crate::rt::cabi_realloc`].
///
/// # Safety
///
/// The canonical ABI's contract for `realloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cabi_realloc(
    old_ptr: *mut u8,
    old_len: usize,
    align: usize,
    new_len: usize,
) -> *mut u8 {
    // SAFETY: the same contract.
    unsafe { crate::rt::cabi_realloc(old_ptr, old_len, align, new_len) }
}

struct Component;

impl wit::Guest for Component {
    type Store = Store;
    type Restoring = Restoring;

    fn formats() -> wit::FormatVersions {
        let f = crate::formats();
        wit::FormatVersions {
            batch_versions: f.batch_versions.to_vec(),
            outputs_version: f.outputs_version,
            snapshot_version: f.snapshot_version,
            record_version: f.record_version,
        }
    }

    fn reads(batch: Vec<u8>) -> Result<Vec<u32>, wit::Error> {
        StateMachine::reads(&batch).map_err(error_out)
    }
}

struct Store {
    machine: RefCell<StateMachine>,
    /// A snapshot being taken in parts; dropped by any call that can
    /// change the state.
    snapshot: RefCell<Option<SnapshotCursor>>,
}

impl Store {
    fn of(machine: StateMachine) -> Store {
        Store {
            machine: RefCell::new(machine),
            snapshot: RefCell::new(None),
        }
    }

    /// The machine, to change it: a snapshot in parts ends.
    fn changing(&self) -> std::cell::RefMut<'_, StateMachine> {
        *self.snapshot.borrow_mut() = None;
        self.machine.borrow_mut()
    }
}

fn scope_in(scope: wit::SnapshotScope) -> SnapshotScope {
    match scope {
        wit::SnapshotScope::Everything => SnapshotScope::Everything,
        wit::SnapshotScope::Durable => SnapshotScope::Durable,
    }
}

struct Restoring(RefCell<crate::Restoring>);

impl wit::GuestRestoring for Restoring {
    fn begin(config: wit::Config) -> Result<wit::Restoring, wit::Error> {
        let r = crate::Restoring::new(config_in(config)).map_err(error_out)?;
        Ok(wit::Restoring::new(Restoring(RefCell::new(r))))
    }

    fn feed(&self, part: Vec<u8>) -> Result<(), wit::Error> {
        self.0.borrow_mut().feed(&part).map_err(error_out)
    }

    fn finish(this: wit::Restoring) -> Result<wit::Store, wit::Error> {
        let r = this.into_inner::<Restoring>().0.into_inner();
        let machine = r.finish().map_err(error_out)?;
        Ok(wit::Store::new(Store::of(machine)))
    }
}

impl wit::GuestStore for Store {
    fn new(config: wit::Config) -> Store {
        match StateMachine::new(config_in(config)) {
            Ok(m) => Store::of(m),
            // Documented in the WIT: callers check with validate-config first.
            Err(e) => panic!("{e}"),
        }
    }

    fn validate_config(config: wit::Config) -> Result<(), wit::Error> {
        StateMachine::validate_config(&config_in(config)).map_err(error_out)
    }

    fn restore(config: wit::Config, snapshot: Vec<u8>) -> Result<wit::Store, wit::Error> {
        let machine = StateMachine::restore(config_in(config), &snapshot).map_err(error_out)?;
        Ok(wit::Store::new(Store::of(machine)))
    }

    fn handle_wire(&self, batch: Vec<u8>, now: u64) -> Result<Vec<u8>, wit::Error> {
        self.changing()
            .handle_wire_owned(batch, now)
            .map_err(error_out)
    }

    fn query_wire(&self, batch: Vec<u8>, now: u64) -> Result<Vec<u8>, wit::Error> {
        // Changes nothing: a snapshot in parts goes on.
        self.machine
            .borrow_mut()
            .query_wire(&batch, now)
            .map_err(error_out)
    }

    fn handle(&self, inputs: Vec<wit::Input>, now: u64) -> Vec<wit::Output> {
        let owned: Vec<Owned> = inputs.into_iter().map(input_in).collect();
        let inputs: Vec<types::Input<'_>> = owned.iter().map(Owned::as_input).collect();
        // The same path as `handle-wire`: encoded, handled, decoded.
        let outputs = self.changing().step(&inputs, now);
        outputs.into_iter().filter_map(output_out).collect()
    }

    fn next_deadline(&self) -> Option<u64> {
        self.machine.borrow().next_deadline()
    }

    fn snapshot(&self, scope: wit::SnapshotScope) -> Vec<u8> {
        self.machine.borrow().snapshot_with(scope_in(scope))
    }

    fn snapshot_part(
        &self,
        scope: wit::SnapshotScope,
        start: bool,
        max_bytes: u32,
    ) -> Result<Vec<u8>, wit::Error> {
        let mut cursor = self.snapshot.borrow_mut();
        if start {
            *cursor = Some(SnapshotCursor::new(scope_in(scope)));
        }
        let Some(c) = cursor.as_mut() else {
            return Err(wit::Error::Other(
                "no snapshot in progress (start one; a change to the store ends it)".into(),
            ));
        };
        let part = self
            .machine
            .borrow()
            .snapshot_part(c, usize::try_from(max_bytes).unwrap_or(usize::MAX).max(1));
        if part.is_empty() {
            *cursor = None;
        }
        Ok(part)
    }

    fn stats(&self) -> wit::StoreStats {
        let s = self.machine.borrow().stats();
        wit::StoreStats {
            keys: s.keys,
            bytes: s.bytes,
            registrations: s.registrations,
            dedup_entries: s.dedup_entries,
            dedup_bytes: s.dedup_bytes,
            dedup_hits: s.dedup_hits,
            expired: s.expired,
        }
    }

    fn set_authorization(&self, rules: Option<Vec<wit::AuthRule>>) -> Result<(), wit::Error> {
        self.machine
            .borrow_mut()
            .set_authorization(rules.map(rules_in))
            .map_err(error_out)
    }

    fn replay(&self, records: Vec<Vec<u8>>) -> Result<(), wit::Error> {
        let mut m = self.changing();
        for r in records {
            m.replay_owned(r).map_err(error_out)?;
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
            wit::PersistMode::Custom => types::Persist::Custom,
        },
        hash_seed: c.hash_seed,
        quota: types::Quota {
            max_keys: c.quota.max_keys,
            max_bytes: c.quota.max_bytes,
            max_key_bytes: c.quota.max_key_bytes,
            max_value_bytes: c.quota.max_value_bytes,
        },
        persist_keys: c
            .persist_keys
            .into_iter()
            .map(|m| match m {
                wit::KeyMatch::Pattern(p) => types::KeyMatch::Pattern(p),
                wit::KeyMatch::Exact(k) => types::KeyMatch::Exact(k),
            })
            .collect(),
        scan_page: types::ScanPage {
            max_keys: c.scan_page.max_keys,
            max_bytes: c.scan_page.max_bytes,
        },
        sdk_response_topics: c.sdk_response_topics,
        authorization: c.authorization.map(rules_in),
    }
}

fn pairs_in(p: Vec<wit::UserProperty>) -> Vec<(String, String)> {
    p.into_iter().map(|p| (p.name, p.value)).collect()
}

fn rules_in(rules: Vec<wit::AuthRule>) -> Vec<types::AuthRule> {
    rules
        .into_iter()
        .map(|r| types::AuthRule {
            principals: types::Principals {
                client_ids: r.principals.client_ids,
                usernames: r.principals.usernames,
                attributes: r.principals.attributes.into_iter().map(pairs_in).collect(),
            },
            grants: r
                .grants
                .into_iter()
                .map(|g| types::KeyGrant {
                    method: match g.method {
                        wit::KeyMethod::Read => types::KeyMethod::Read,
                        wit::KeyMethod::Write => types::KeyMethod::Write,
                        wit::KeyMethod::ReadWrite => types::KeyMethod::ReadWrite,
                    },
                    keys: g
                        .keys
                        .into_iter()
                        .map(|k| match k {
                            wit::KeySpec::Pattern(p) => types::KeySpec::Pattern(p),
                            wit::KeySpec::Text(t) => types::KeySpec::Text(t),
                            wit::KeySpec::Binary(b) => types::KeySpec::Binary(b),
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect()
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

/// A typed input, owned.
enum Owned {
    Message(types::InboundMessage),
    Disconnected(String),
    DisconnectedVia(String, types::Via),
    ReplicaStarted(types::Via),
}

impl Owned {
    fn as_input(&self) -> types::Input<'_> {
        match self {
            Owned::Message(m) => types::Input::Message(m),
            Owned::Disconnected(id) => types::Input::Disconnected(id),
            Owned::DisconnectedVia(id, via) => types::Input::DisconnectedVia(id, *via),
            Owned::ReplicaStarted(via) => types::Input::ReplicaStarted(*via),
        }
    }
}

fn input_in(i: wit::Input) -> Owned {
    match i {
        wit::Input::Message(m) => Owned::Message(message_in(m)),
        wit::Input::Disconnected(id) => Owned::Disconnected(id),
        wit::Input::DisconnectedVia(d) => Owned::DisconnectedVia(d.client_id, via_in(d.via)),
        wit::Input::ReplicaStarted(via) => Owned::ReplicaStarted(via_in(via)),
    }
}

fn via_in(v: wit::Via) -> types::Via {
    types::Via {
        replica: v.replica,
        started: v.started,
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
        username: m.username,
        attributes: pairs_in(m.attributes),
        via: m.via.map(via_in),
    }
}

fn output_out(o: types::Output) -> Option<wit::Output> {
    Some(match o {
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
        // `step` ends a list with it only after a call with no inputs;
        // `next-deadline` tells the typed door's host the same.
        types::Output::More(_) => return None,
        types::Output::Violation { client_id, reason } => {
            wit::Output::Violation(wit::Violation { client_id, reason })
        }
    })
}

export!(Component);

/// `memcmp` for the component, replacing wasi-libc's byte-at-a-time loop:
/// [`crate::rt::memcmp`].
///
/// # Safety
///
/// The C contract: `a` and `b` are valid for reads of `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the same contract.
    unsafe { crate::rt::memcmp(a, b, n) }
}

/// `bcmp` (equality only), which LLVM emits for `memcmp(..) == 0`.
///
/// # Safety
///
/// As [`memcmp`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the same contract.
    unsafe { crate::rt::memcmp(a, b, n) }
}
