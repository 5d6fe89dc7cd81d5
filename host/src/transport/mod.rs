//! How requests reach a store and replies leave it: the embedded MQTT 5
//! broker ([`embedded`], rmqtt in process, with its admission, queue and
//! retained-message bounds), an external broker as one client
//! ([`external`]), and what both share about MQTT ([`mqtt`]: properties,
//! broker URLs, TLS options).

pub mod embedded;
pub mod external;
pub mod mqtt;
