//! The part of mosquitto 2.0's plugin interface this plugin uses, declared
//! by hand from `mosquitto_broker.h` and `mosquitto_plugin.h` (Debian's
//! `mosquitto-dev` 2.0.11; plugin interface version 5). The functions are
//! the broker executable's own exports, resolved when mosquitto loads the
//! plugin.

use std::ffi::{c_char, c_int, c_void};

/// `MOSQ_ERR_SUCCESS`.
pub const MOSQ_ERR_SUCCESS: c_int = 0;
/// `MOSQ_ERR_INVAL`.
pub const MOSQ_ERR_INVAL: c_int = 3;
/// `MOSQ_ERR_ACL_DENIED`.
pub const MOSQ_ERR_ACL_DENIED: c_int = 12;
/// `MOSQ_ERR_PLUGIN_DEFER`: leave the decision to the other checks.
pub const MOSQ_ERR_PLUGIN_DEFER: c_int = 17;

/// `MOSQ_EVT_RELOAD`.
pub const MOSQ_EVT_RELOAD: c_int = 1;
/// `MOSQ_EVT_ACL_CHECK`.
pub const MOSQ_EVT_ACL_CHECK: c_int = 2;
/// `MOSQ_EVT_MESSAGE`.
pub const MOSQ_EVT_MESSAGE: c_int = 7;
/// `MOSQ_EVT_TICK`.
pub const MOSQ_EVT_TICK: c_int = 9;
/// `MOSQ_EVT_DISCONNECT`.
pub const MOSQ_EVT_DISCONNECT: c_int = 10;

/// `MOSQ_ACL_READ`: a message is about to be delivered.
pub const MOSQ_ACL_READ: c_int = 0x01;
/// `MOSQ_ACL_WRITE`: a client publishes.
pub const MOSQ_ACL_WRITE: c_int = 0x02;
/// `MOSQ_ACL_SUBSCRIBE`: a client subscribes.
pub const MOSQ_ACL_SUBSCRIBE: c_int = 0x04;

/// `MOSQ_LOG_INFO`.
pub const MOSQ_LOG_INFO: c_int = 0x01;
/// `MOSQ_LOG_WARNING`.
pub const MOSQ_LOG_WARNING: c_int = 0x04;
/// `MOSQ_LOG_ERR`.
pub const MOSQ_LOG_ERR: c_int = 0x08;

/// MQTT 5 property identifiers.
pub const PROP_PAYLOAD_FORMAT_INDICATOR: c_int = 1;
/// Message Expiry Interval.
pub const PROP_MESSAGE_EXPIRY_INTERVAL: c_int = 2;
/// Content Type.
pub const PROP_CONTENT_TYPE: c_int = 3;
/// Response Topic.
pub const PROP_RESPONSE_TOPIC: c_int = 8;
/// Correlation Data.
pub const PROP_CORRELATION_DATA: c_int = 9;
/// User Property.
pub const PROP_USER_PROPERTY: c_int = 38;

/// `struct mosquitto` (opaque).
#[repr(C)]
pub struct Mosquitto {
    _private: [u8; 0],
}

/// `mosquitto_property` (opaque).
#[repr(C)]
pub struct Property {
    _private: [u8; 0],
}

/// `mosquitto_plugin_id_t` (opaque).
#[repr(C)]
pub struct PluginId {
    _private: [u8; 0],
}

/// `struct mosquitto_opt`: one `plugin_opt_<key> <value>` line.
#[repr(C)]
pub struct Opt {
    /// After `plugin_opt_`.
    pub key: *mut c_char,
    /// The rest of the line.
    pub value: *mut c_char,
}

/// `struct mosquitto_evt_message`.
#[repr(C)]
pub struct EvtMessage {
    /// Reserved.
    pub future: *mut c_void,
    /// The publisher.
    pub client: *mut Mosquitto,
    /// The topic (a plugin that replaces it frees the old one).
    pub topic: *mut c_char,
    /// The payload.
    pub payload: *mut c_void,
    /// The message's properties.
    pub properties: *mut Property,
    /// Reason string (unused here).
    pub reason_string: *mut c_char,
    /// Payload length.
    pub payloadlen: u32,
    /// QoS.
    pub qos: u8,
    /// Reason code (unused here).
    pub reason_code: u8,
    /// Retain flag.
    pub retain: bool,
    /// Reserved.
    pub future2: [*mut c_void; 4],
}

/// `struct mosquitto_evt_acl_check`.
#[repr(C)]
pub struct EvtAclCheck {
    /// Reserved.
    pub future: *mut c_void,
    /// The client.
    pub client: *mut Mosquitto,
    /// A topic (publish, read) or a filter (subscribe).
    pub topic: *const c_char,
    /// The payload, if a message.
    pub payload: *const c_void,
    /// Its properties.
    pub properties: *mut Property,
    /// `MOSQ_ACL_*`.
    pub access: c_int,
    /// Payload length.
    pub payloadlen: u32,
    /// QoS.
    pub qos: u8,
    /// Retain flag.
    pub retain: bool,
    /// Reserved.
    pub future2: [*mut c_void; 4],
}

/// `struct mosquitto_evt_disconnect`.
#[repr(C)]
pub struct EvtDisconnect {
    /// Reserved.
    pub future: *mut c_void,
    /// The client going away.
    pub client: *mut Mosquitto,
    /// Why.
    pub reason: c_int,
    /// Reserved.
    pub future2: [*mut c_void; 4],
}

/// `MOSQ_FUNC_generic_callback`.
pub type Callback =
    unsafe extern "C" fn(event: c_int, event_data: *mut c_void, userdata: *mut c_void) -> c_int;

unsafe extern "C" {
    pub fn mosquitto_callback_register(
        identifier: *mut PluginId,
        event: c_int,
        cb_func: Callback,
        event_data: *const c_void,
        userdata: *mut c_void,
    ) -> c_int;
    pub fn mosquitto_callback_unregister(
        identifier: *mut PluginId,
        event: c_int,
        cb_func: Callback,
        event_data: *const c_void,
    ) -> c_int;
    pub fn mosquitto_malloc(size: usize) -> *mut c_void;
    pub fn mosquitto_free(mem: *mut c_void);
    pub fn mosquitto_strdup(s: *const c_char) -> *mut c_char;
    pub fn mosquitto_log_printf(level: c_int, fmt: *const c_char, ...);
    pub fn mosquitto_client_id(client: *const Mosquitto) -> *const c_char;
    pub fn mosquitto_client_username(client: *const Mosquitto) -> *const c_char;
    pub fn mosquitto_kick_client_by_clientid(clientid: *const c_char, with_will: bool) -> c_int;
    pub fn mosquitto_broker_publish(
        clientid: *const c_char,
        topic: *const c_char,
        payloadlen: c_int,
        payload: *mut c_void,
        qos: c_int,
        retain: bool,
        properties: *mut Property,
    ) -> c_int;
    pub fn mosquitto_property_add_binary(
        proplist: *mut *mut Property,
        identifier: c_int,
        value: *const c_void,
        len: u16,
    ) -> c_int;
    pub fn mosquitto_property_add_byte(
        proplist: *mut *mut Property,
        identifier: c_int,
        value: u8,
    ) -> c_int;
    pub fn mosquitto_property_add_int32(
        proplist: *mut *mut Property,
        identifier: c_int,
        value: u32,
    ) -> c_int;
    pub fn mosquitto_property_add_string(
        proplist: *mut *mut Property,
        identifier: c_int,
        value: *const c_char,
    ) -> c_int;
    pub fn mosquitto_property_add_string_pair(
        proplist: *mut *mut Property,
        identifier: c_int,
        name: *const c_char,
        value: *const c_char,
    ) -> c_int;
    pub fn mosquitto_property_free_all(properties: *mut *mut Property);
    pub fn mosquitto_property_read_binary(
        proplist: *const Property,
        identifier: c_int,
        value: *mut *mut c_void,
        len: *mut u16,
        skip_first: bool,
    ) -> *const Property;
    pub fn mosquitto_property_read_byte(
        proplist: *const Property,
        identifier: c_int,
        value: *mut u8,
        skip_first: bool,
    ) -> *const Property;
    pub fn mosquitto_property_read_int32(
        proplist: *const Property,
        identifier: c_int,
        value: *mut u32,
        skip_first: bool,
    ) -> *const Property;
    pub fn mosquitto_property_read_string(
        proplist: *const Property,
        identifier: c_int,
        value: *mut *mut c_char,
        skip_first: bool,
    ) -> *const Property;
    pub fn mosquitto_property_read_string_pair(
        proplist: *const Property,
        identifier: c_int,
        name: *mut *mut c_char,
        value: *mut *mut c_char,
        skip_first: bool,
    ) -> *const Property;
}
