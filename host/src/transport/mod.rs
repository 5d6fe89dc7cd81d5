//! How requests reach a store and replies leave it: the embedded MQTT 5
//! broker ([`embedded`], rmqtt in process, with its admission, queue and
//! retained-message bounds), an external broker as one client
//! ([`external`]). What they share about MQTT (properties, broker URLs,
//! TLS options) is [`crate::mqtt`].

pub mod embedded;
pub mod external;
