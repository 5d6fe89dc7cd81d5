//! What the guest's integration tests share.

use statestore_guest::InboundMessage;
use statestore_guest::rpc::REQUEST_TOPIC;

/// Simulated time at the start of a test (ms since the epoch).
pub const T0: u64 = 1_700_000_000_000;

/// Request `n` of `client` (its correlation data), QoS 1, answered on
/// `clients/<client>/resp`.
pub fn request(n: u64, parts: &[&[u8]], client: &str) -> InboundMessage {
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload: statestore_guest::resp3::request(parts),
        qos: 1,
        response_topic: Some(format!("clients/{client}/resp")),
        correlation_data: Some(n.to_be_bytes().to_vec()),
        message_expiry_interval: Some(10),
        user_properties: vec![("__ts".into(), format!("{T0}:0:{client}"))],
        client_id: Some(client.into()),
        ..Default::default()
    }
}
