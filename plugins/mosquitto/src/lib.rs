//! The state store inside mosquitto 2.0: a broker plugin hosting the same
//! component, through the same host library ([`statestore::store::tenant::Tenant`]:
//! wasmtime, journal, limits), as `statestore serve`.
//!
//! ```text
//! mosquitto.conf:
//!   plugin /path/to/libstatestore_mosquitto.so
//!   plugin_opt_data_dir /var/lib/statestore     (optional: volatile without)
//! ```
//!
//! mosquitto runs one thread, and calls the plugin on it:
//! - `MOSQ_EVT_MESSAGE`: a publish to the request topic goes to the store
//!   (`store.rs`: handled at once, or by the plugin's own thread with
//!   `fsync always`), its sender's client id from the broker, not from
//!   `__srcId`; the message is then sent on to a topic of its own nobody
//!   can subscribe to (so no subscriber of the request topic, `#`
//!   included, sees another client's request). Replies and notifications
//!   go with `mosquitto_broker_publish` to exactly the client they are for,
//!   into its session whether or not it subscribed.
//! - `MOSQ_EVT_ACL_CHECK`: nobody publishes into the store's streams of
//!   another client (`statestore::auth::isolation`), nor subscribes to the
//!   requests' own topic.
//! - `MOSQ_EVT_DISCONNECT`: the client's KEYNOTIFY registrations go.
//! - `MOSQ_EVT_TICK` (every loop of the broker, at least every 100 ms):
//!   expiry and the dedup cache, and what the store's thread finished.
//! - `MOSQ_EVT_RELOAD` (SIGHUP): the authorization and component files.

// The plugin interface is C: every call across it is unsafe.
#![allow(unsafe_code)]

mod ffi;
pub mod options;
mod store;

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::Mutex;

use statestore::{InboundMessage, OutboundMessage};
use statestore_guest::rpc::REQUEST_TOPIC;

pub use options::PluginOptions;
use store::{Action, Store};

/// What the plugin holds between calls (mosquitto's `userdata`): what is
/// fixed at start, read without a lock (an ACL check can come from inside
/// another callback: a log line published to `$SYS/broker/log` is checked
/// for its subscribers), and the store, behind one.
struct Plugin {
    id: *mut ffi::PluginId,
    options: PluginOptions,
    /// Where requests go once handled: a topic nobody can guess, so that no
    /// subscription receives them.
    consumed: CString,
    store: Mutex<Option<Store>>,
}

/// Reports whether this build speaks a version mosquitto offers (5).
///
/// # Safety
/// mosquitto passes `supported_count` versions at `supported`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mosquitto_plugin_version(
    supported_count: c_int,
    supported: *const c_int,
) -> c_int {
    if supported.is_null() || supported_count <= 0 {
        return 5;
    }
    // SAFETY: mosquitto gives `supported_count` ints at `supported`.
    let offered = unsafe {
        std::slice::from_raw_parts(supported, usize::try_from(supported_count).unwrap_or(0))
    };
    if offered.contains(&5) { 5 } else { -1 }
}

/// Starts the store: reads the `plugin_opt_*` lines, opens (or recovers)
/// the store, and registers the callbacks.
///
/// # Safety
/// Called by mosquitto with its plugin id, a place for our data and its
/// `option_count` options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mosquitto_plugin_init(
    identifier: *mut ffi::PluginId,
    userdata: *mut *mut c_void,
    options: *mut ffi::Opt,
    option_count: c_int,
) -> c_int {
    // SAFETY: as mosquitto documents.
    let pairs = unsafe { option_pairs(options, option_count) };
    match start(identifier, &pairs) {
        Ok(plugin) => {
            let raw = Box::into_raw(Box::new(plugin));
            // SAFETY: mosquitto gives a place for one pointer.
            unsafe { *userdata = raw.cast() };
            for (event, cb) in CALLBACKS {
                // SAFETY: a registered callback gets `raw` back until cleanup.
                let rc = unsafe {
                    ffi::mosquitto_callback_register(
                        identifier,
                        event,
                        cb,
                        std::ptr::null(),
                        raw.cast(),
                    )
                };
                if rc != ffi::MOSQ_ERR_SUCCESS {
                    log(
                        ffi::MOSQ_LOG_ERR,
                        &format!("statestore: cannot register callback {event} ({rc})"),
                    );
                    return rc;
                }
            }
            ffi::MOSQ_ERR_SUCCESS
        }
        Err(e) => {
            log(
                ffi::MOSQ_LOG_ERR,
                &format!("statestore: cannot start: {e:#}"),
            );
            ffi::MOSQ_ERR_INVAL
        }
    }
}

/// Stops the store: unregisters the callbacks, flushes and closes the
/// journal.
///
/// # Safety
/// Called by mosquitto once, with the `userdata` init set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mosquitto_plugin_cleanup(
    userdata: *mut c_void,
    _options: *mut ffi::Opt,
    _option_count: c_int,
) -> c_int {
    if userdata.is_null() {
        return ffi::MOSQ_ERR_SUCCESS;
    }
    // SAFETY: init made it from a Box, and mosquitto calls cleanup once.
    let plugin = unsafe { Box::from_raw(userdata.cast::<Plugin>()) };
    for (event, cb) in CALLBACKS {
        // SAFETY: registered by init with this id.
        unsafe { ffi::mosquitto_callback_unregister(plugin.id, event, cb, std::ptr::null()) };
    }
    let store = plugin.store.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some(store) = store {
        store.shutdown();
    }
    log(ffi::MOSQ_LOG_INFO, "statestore: stopped");
    ffi::MOSQ_ERR_SUCCESS
}

const CALLBACKS: [(c_int, ffi::Callback); 5] = [
    (ffi::MOSQ_EVT_MESSAGE, on_message),
    (ffi::MOSQ_EVT_ACL_CHECK, on_acl_check),
    (ffi::MOSQ_EVT_DISCONNECT, on_disconnect),
    (ffi::MOSQ_EVT_TICK, on_tick),
    (ffi::MOSQ_EVT_RELOAD, on_reload),
];

/// The `(key, value)` of mosquitto's options.
unsafe fn option_pairs(options: *mut ffi::Opt, count: c_int) -> Vec<(String, String)> {
    if options.is_null() || count <= 0 {
        return Vec::new();
    }
    // SAFETY: mosquitto gives `count` options.
    let opts = unsafe { std::slice::from_raw_parts(options, usize::try_from(count).unwrap_or(0)) };
    opts.iter()
        .map(|o| {
            // SAFETY: NUL-terminated strings of mosquitto's (or null).
            unsafe {
                (
                    text(o.key).unwrap_or_default(),
                    text(o.value).unwrap_or_default(),
                )
            }
        })
        .collect()
}

/// A C string as Rust's (`None` for null).
unsafe fn text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn start(id: *mut ffi::PluginId, pairs: &[(String, String)]) -> anyhow::Result<Plugin> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let options = PluginOptions::parse(pairs)?;
    let store = Store::open(options.clone())?;
    let consumed = CString::new(format!(
        "$statestore/consumed/{:032x}",
        unguessable(statestore::store::clock::now_ms())
    ))?;
    let kind = match (&options.data_dir, matches!(store, Store::Worker(_))) {
        (None, _) => "volatile".to_string(),
        (Some(d), false) => format!("durable in {}", d.display()),
        (Some(d), true) => format!(
            "durable in {}, every write synced before its reply (on the store's own thread)",
            d.display()
        ),
    };
    log(
        ffi::MOSQ_LOG_INFO,
        &format!(
            "statestore: serving {REQUEST_TOPIC} ({kind}; node id {})",
            options.node_id
        ),
    );
    Ok(Plugin {
        id,
        options,
        consumed,
        store: Mutex::new(Some(store)),
    })
}

/// 128 bits nobody can guess (the process's randomised hasher keys).
fn unguessable(now: u64) -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut parts = [0u64; 2];
    for (i, part) in parts.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(now);
        h.write_usize(i);
        *part = h.finish();
    }
    (u128::from(parts[0]) << 64) | u128::from(parts[1])
}

/// A line in mosquitto's log.
fn log(level: c_int, message: &str) {
    let Ok(message) = CString::new(message.replace('\0', " ")) else {
        return;
    };
    // SAFETY: a "%s" format with one NUL-terminated string.
    unsafe { ffi::mosquitto_log_printf(level, c"%s".as_ptr(), message.as_ptr()) };
}

/// The plugin behind mosquitto's `userdata`.
///
/// # Safety
/// `userdata` is what init registered the callbacks with.
unsafe fn plugin<'a>(userdata: *mut c_void) -> &'a Plugin {
    // SAFETY: init leaked the Box; it lives until cleanup unregisters us.
    unsafe { &*userdata.cast::<Plugin>() }
}

impl Plugin {
    /// Runs `f` on the store, then carries out what it asks of the broker
    /// with the store free again (a publish, a kick or a log line can call
    /// the plugin back).
    fn with_store(&self, f: impl FnOnce(&mut Store) -> Vec<Action>) {
        let actions = {
            let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            match store.as_mut() {
                Some(s) => f(s),
                None => Vec::new(),
            }
        };
        for action in actions {
            match action {
                Action::Publish { to, message } => publish(&to, *message),
                Action::Kick(client) => {
                    if let Ok(id) = CString::new(client) {
                        // SAFETY: a NUL-terminated client id, on mosquitto's thread.
                        unsafe { ffi::mosquitto_kick_client_by_clientid(id.as_ptr(), false) };
                    }
                }
                Action::Log { error, line } => {
                    let level = if error {
                        ffi::MOSQ_LOG_ERR
                    } else {
                        ffi::MOSQ_LOG_INFO
                    };
                    log(level, &line);
                }
            }
        }
    }
}

unsafe extern "C" fn on_message(_event: c_int, data: *mut c_void, userdata: *mut c_void) -> c_int {
    // SAFETY: mosquitto passes a `mosquitto_evt_message` for this event.
    let evt = unsafe { &mut *data.cast::<ffi::EvtMessage>() };
    // SAFETY: its topic is a NUL-terminated string.
    if evt.topic.is_null()
        || unsafe { CStr::from_ptr(evt.topic) }.to_bytes() != REQUEST_TOPIC.as_bytes()
    {
        return ffi::MOSQ_ERR_SUCCESS;
    }
    // SAFETY: the publisher of this event.
    let Some(client_id) = (unsafe { text(ffi::mosquitto_client_id(evt.client)) }) else {
        return ffi::MOSQ_ERR_SUCCESS;
    };
    // SAFETY: see `plugin`.
    let plugin = unsafe { plugin(userdata) };
    // SAFETY: the event's fields, as mosquitto gives them.
    let username = unsafe { text(ffi::mosquitto_client_username(evt.client)) };
    let payload = if evt.payload.is_null() || evt.payloadlen == 0 {
        Vec::new()
    } else {
        // SAFETY: `payloadlen` bytes at `payload`.
        unsafe { std::slice::from_raw_parts(evt.payload.cast::<u8>(), evt.payloadlen as usize) }
            .to_vec()
    };
    // SAFETY: the event's property list.
    let mut message = unsafe { inbound(evt.properties) };
    message.topic = REQUEST_TOPIC.to_string();
    message.payload = payload;
    message.qos = evt.qos;
    message.client_id = Some(client_id.clone());
    // mosquitto 2.0 keeps a message's expiry out of what it shows plugins:
    // the request is taken to expire after the configured time.
    message.message_expiry_interval = message
        .message_expiry_interval
        .or(Some(plugin.options.request_expiry_secs));
    plugin.with_store(|s| s.request(message, client_id, username));
    // On to a topic no subscription reaches; never retained.
    // SAFETY: mosquitto owns the old topic and frees what we put instead
    // with its allocator.
    unsafe {
        let topic = ffi::mosquitto_strdup(plugin.consumed.as_ptr());
        if !topic.is_null() {
            ffi::mosquitto_free(evt.topic.cast());
            evt.topic = topic;
        }
    }
    evt.retain = false;
    ffi::MOSQ_ERR_SUCCESS
}

unsafe extern "C" fn on_acl_check(
    _event: c_int,
    data: *mut c_void,
    userdata: *mut c_void,
) -> c_int {
    // SAFETY: mosquitto passes a `mosquitto_evt_acl_check` for this event.
    let evt = unsafe { &*data.cast::<ffi::EvtAclCheck>() };
    // SAFETY: see `plugin`.
    let p = unsafe { plugin(userdata) };
    let allowed = if p.options.other_acl {
        ffi::MOSQ_ERR_PLUGIN_DEFER
    } else {
        ffi::MOSQ_ERR_SUCCESS
    };
    // SAFETY: the event's strings.
    let (Some(topic), Some(client)) = (unsafe { text(evt.topic) }, unsafe {
        text(ffi::mosquitto_client_id(evt.client))
    }) else {
        return allowed;
    };
    let consumed = p.consumed.to_str().unwrap_or_default();
    let refused = match evt.access {
        ffi::MOSQ_ACL_WRITE => {
            !statestore::auth::isolation::may_publish(&client, &topic, p.options.client_topics)
        }
        ffi::MOSQ_ACL_SUBSCRIBE => {
            topic.starts_with("$statestore/")
                || !statestore::auth::isolation::may_subscribe(
                    &client,
                    &topic,
                    p.options.client_topics,
                )
        }
        ffi::MOSQ_ACL_READ => topic == consumed || topic.starts_with("$statestore/"),
        _ => false,
    };
    if refused {
        ffi::MOSQ_ERR_ACL_DENIED
    } else {
        allowed
    }
}

unsafe extern "C" fn on_disconnect(
    _event: c_int,
    data: *mut c_void,
    userdata: *mut c_void,
) -> c_int {
    // SAFETY: mosquitto passes a `mosquitto_evt_disconnect` for this event.
    let evt = unsafe { &*data.cast::<ffi::EvtDisconnect>() };
    // SAFETY: the client going away.
    let Some(client_id) = (unsafe { text(ffi::mosquitto_client_id(evt.client)) }) else {
        return ffi::MOSQ_ERR_SUCCESS;
    };
    // SAFETY: see `plugin`.
    let plugin = unsafe { plugin(userdata) };
    plugin.with_store(|s| s.gone(client_id));
    ffi::MOSQ_ERR_SUCCESS
}

unsafe extern "C" fn on_tick(_event: c_int, _data: *mut c_void, userdata: *mut c_void) -> c_int {
    // SAFETY: see `plugin`.
    let plugin = unsafe { plugin(userdata) };
    plugin.with_store(Store::tick);
    ffi::MOSQ_ERR_SUCCESS
}

/// SIGHUP: the authorization file and the component file (if either is
/// given) are read again; the component is upgraded with the state carried
/// over. What does not load leaves what is in force.
unsafe extern "C" fn on_reload(_event: c_int, _data: *mut c_void, userdata: *mut c_void) -> c_int {
    // SAFETY: see `plugin`.
    let plugin = unsafe { plugin(userdata) };
    plugin.with_store(Store::reload);
    ffi::MOSQ_ERR_SUCCESS
}

/// `mosquitto_broker_publish` of `m` into `client`'s session alone.
fn publish(client: &str, m: OutboundMessage) {
    let (Ok(client), Ok(topic)) = (CString::new(client), CString::new(m.topic.to_string())) else {
        return;
    };
    let Ok(len) = c_int::try_from(m.payload.len()) else {
        log(
            ffi::MOSQ_LOG_WARNING,
            "statestore: a reply too large for mosquitto was dropped",
        );
        return;
    };
    let mut props: *mut ffi::Property = std::ptr::null_mut();
    // SAFETY: each call appends to the list (mosquitto copies the values);
    // the list and the payload (from mosquitto's allocator) are the
    // broker's once published.
    unsafe {
        if let Some(c) = &m.correlation_data
            && let Ok(n) = u16::try_from(c.len())
        {
            ffi::mosquitto_property_add_binary(
                &mut props,
                ffi::PROP_CORRELATION_DATA,
                c.as_ptr().cast(),
                n,
            );
        }
        if let Some(secs) = m.message_expiry_interval.filter(|&s| s > 0) {
            ffi::mosquitto_property_add_int32(&mut props, ffi::PROP_MESSAGE_EXPIRY_INTERVAL, secs);
        }
        if let Some(ct) = m.content_type.as_deref().and_then(|c| CString::new(c).ok()) {
            ffi::mosquitto_property_add_string(&mut props, ffi::PROP_CONTENT_TYPE, ct.as_ptr());
        }
        if let Some(pfi) = m.payload_format_indicator {
            ffi::mosquitto_property_add_byte(&mut props, ffi::PROP_PAYLOAD_FORMAT_INDICATOR, pfi);
        }
        if let Some(rt) = m
            .response_topic
            .as_deref()
            .and_then(|t| CString::new(t).ok())
        {
            ffi::mosquitto_property_add_string(&mut props, ffi::PROP_RESPONSE_TOPIC, rt.as_ptr());
        }
        for (name, value) in &m.user_properties {
            if let (Ok(n), Ok(v)) = (CString::new(&**name), CString::new(&**value)) {
                ffi::mosquitto_property_add_string_pair(
                    &mut props,
                    ffi::PROP_USER_PROPERTY,
                    n.as_ptr(),
                    v.as_ptr(),
                );
            }
        }
        let payload = if m.payload.is_empty() {
            std::ptr::null_mut()
        } else {
            let p = ffi::mosquitto_malloc(m.payload.len());
            if p.is_null() {
                ffi::mosquitto_property_free_all(&mut props);
                return;
            }
            std::ptr::copy_nonoverlapping(m.payload.as_ptr(), p.cast::<u8>(), m.payload.len());
            p
        };
        let rc = ffi::mosquitto_broker_publish(
            client.as_ptr(),
            topic.as_ptr(),
            len,
            payload,
            c_int::from(m.qos),
            false,
            props,
        );
        if rc != ffi::MOSQ_ERR_SUCCESS {
            log(
                ffi::MOSQ_LOG_WARNING,
                &format!("statestore: publish refused ({rc})"),
            );
        }
    }
}

/// The request properties the guest reads, from mosquitto's list.
///
/// # Safety
/// `props` is a property list of mosquitto's (or null).
unsafe fn inbound(props: *const ffi::Property) -> InboundMessage {
    let mut m = InboundMessage::default();
    if props.is_null() {
        return m;
    }
    // SAFETY: reads of a valid list; every value read is mosquitto's
    // allocation, freed here with its allocator.
    unsafe {
        let mut s: *mut c_char = std::ptr::null_mut();
        if !ffi::mosquitto_property_read_string(props, ffi::PROP_RESPONSE_TOPIC, &mut s, false)
            .is_null()
        {
            m.response_topic = take_string(s);
        }
        let mut s: *mut c_char = std::ptr::null_mut();
        if !ffi::mosquitto_property_read_string(props, ffi::PROP_CONTENT_TYPE, &mut s, false)
            .is_null()
        {
            m.content_type = take_string(s);
        }
        let mut b: *mut c_void = std::ptr::null_mut();
        let mut len = 0u16;
        if !ffi::mosquitto_property_read_binary(
            props,
            ffi::PROP_CORRELATION_DATA,
            &mut b,
            &mut len,
            false,
        )
        .is_null()
        {
            m.correlation_data = Some(if b.is_null() {
                Vec::new()
            } else {
                let v = std::slice::from_raw_parts(b.cast::<u8>(), usize::from(len)).to_vec();
                ffi::mosquitto_free(b);
                v
            });
        }
        let mut byte = 0u8;
        if !ffi::mosquitto_property_read_byte(
            props,
            ffi::PROP_PAYLOAD_FORMAT_INDICATOR,
            &mut byte,
            false,
        )
        .is_null()
        {
            m.payload_format_indicator = Some(byte);
        }
        let mut secs = 0u32;
        if !ffi::mosquitto_property_read_int32(
            props,
            ffi::PROP_MESSAGE_EXPIRY_INTERVAL,
            &mut secs,
            false,
        )
        .is_null()
        {
            m.message_expiry_interval = Some(secs);
        }
        let mut at = props;
        let mut skip_first = false;
        loop {
            let (mut name, mut value): (*mut c_char, *mut c_char) =
                (std::ptr::null_mut(), std::ptr::null_mut());
            let found = ffi::mosquitto_property_read_string_pair(
                at,
                ffi::PROP_USER_PROPERTY,
                &mut name,
                &mut value,
                skip_first,
            );
            if found.is_null() {
                break;
            }
            if let (Some(n), Some(v)) = (take_string(name), take_string(value)) {
                m.user_properties.push((n, v));
            }
            at = found;
            skip_first = true;
        }
    }
    m
}

/// A string mosquitto allocated, copied and freed.
unsafe fn take_string(s: *mut c_char) -> Option<String> {
    if s.is_null() {
        return None;
    }
    // SAFETY: NUL-terminated, mosquitto's allocation.
    unsafe {
        let out = CStr::from_ptr(s).to_string_lossy().into_owned();
        ffi::mosquitto_free(s.cast());
        Some(out)
    }
}
