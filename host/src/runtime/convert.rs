//! Between the guest crate's plain types and the wasmtime bindgen types.

use crate::runtime::bindings::wit;
use statestore_guest::types;

pub(crate) fn config(c: &types::Config) -> wit::Config {
    wit::Config {
        node_id: c.node_id.clone(),
        server_client_id: c.server_client_id.clone(),
        persist: match c.persist {
            types::Persist::None => wit::PersistMode::None,
            types::Persist::All => wit::PersistMode::All,
            types::Persist::Flagged => wit::PersistMode::Flagged,
            types::Persist::Custom => wit::PersistMode::Custom,
        },
        hash_seed: c.hash_seed,
        quota: wit::Quota {
            max_keys: c.quota.max_keys,
            max_bytes: c.quota.max_bytes,
            max_key_bytes: c.quota.max_key_bytes,
            max_value_bytes: c.quota.max_value_bytes,
        },
        persist_keys: c
            .persist_keys
            .iter()
            .map(|m| match m {
                types::KeyMatch::Pattern(p) => wit::KeyMatch::Pattern(p.clone()),
                types::KeyMatch::Exact(k) => wit::KeyMatch::Exact(k.clone()),
            })
            .collect(),
        scan_page: wit::ScanPage {
            max_keys: c.scan_page.max_keys,
            max_bytes: c.scan_page.max_bytes,
        },
        sdk_response_topics: c.sdk_response_topics,
        authorization: c.authorization.as_deref().map(rules),
    }
}

fn pairs(p: &[(String, String)]) -> Vec<wit::UserProperty> {
    p.iter()
        .map(|(name, value)| wit::UserProperty {
            name: name.clone(),
            value: value.clone(),
        })
        .collect()
}

/// Authorization rules.
pub(crate) fn rules(rules: &[types::AuthRule]) -> Vec<wit::AuthRule> {
    rules
        .iter()
        .map(|r| wit::AuthRule {
            principals: wit::Principals {
                client_ids: r.principals.client_ids.clone(),
                usernames: r.principals.usernames.clone(),
                attributes: r.principals.attributes.iter().map(|a| pairs(a)).collect(),
            },
            grants: r
                .grants
                .iter()
                .map(|g| wit::KeyGrant {
                    method: match g.method {
                        types::KeyMethod::Read => wit::KeyMethod::Read,
                        types::KeyMethod::Write => wit::KeyMethod::Write,
                        types::KeyMethod::ReadWrite => wit::KeyMethod::ReadWrite,
                    },
                    keys: g
                        .keys
                        .iter()
                        .map(|k| match k {
                            types::KeySpec::Pattern(p) => wit::KeySpec::Pattern(p.clone()),
                            types::KeySpec::Text(t) => wit::KeySpec::Text(t.clone()),
                            types::KeySpec::Binary(b) => wit::KeySpec::Binary(b.clone()),
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect()
}

pub(crate) fn scope(s: statestore_guest::SnapshotScope) -> wit::SnapshotScope {
    match s {
        statestore_guest::SnapshotScope::Everything => wit::SnapshotScope::Everything,
        statestore_guest::SnapshotScope::Durable => wit::SnapshotScope::Durable,
    }
}

pub(crate) fn message(m: &types::InboundMessage) -> wit::InboundMessage {
    wit::InboundMessage {
        topic: m.topic.clone(),
        payload: m.payload.clone(),
        qos: m.qos,
        response_topic: m.response_topic.clone(),
        correlation_data: m.correlation_data.clone(),
        message_expiry_interval: m.message_expiry_interval,
        content_type: m.content_type.clone(),
        payload_format_indicator: m.payload_format_indicator,
        user_properties: pairs(&m.user_properties),
        client_id: m.client_id.clone(),
        received_at: m.received_at,
        username: m.username.clone(),
        attributes: pairs(&m.attributes),
        via: m.via.map(via),
    }
}

fn via(v: types::Via) -> wit::Via {
    wit::Via {
        replica: v.replica,
        started: v.started,
    }
}

pub(crate) fn input(i: &types::Input<'_>) -> wit::Input {
    match i {
        types::Input::Message(m) => wit::Input::Message(message(m)),
        types::Input::Disconnected(id) => wit::Input::Disconnected(id.to_string()),
        types::Input::DisconnectedVia(id, v) => wit::Input::DisconnectedVia(wit::Departure {
            client_id: id.to_string(),
            via: via(*v),
        }),
        types::Input::ReplicaStarted(v) => wit::Input::ReplicaStarted(via(*v)),
    }
}

pub(crate) fn output(o: wit::Output) -> types::Output {
    match o {
        wit::Output::Publish(m) => types::Output::Publish(types::OutboundMessage {
            kind: match m.kind {
                wit::PublishKind::Response => types::PublishKind::Response,
                wit::PublishKind::Notification => types::PublishKind::Notification,
            },
            topic: m.topic.into(),
            payload: m.payload.into(),
            qos: m.qos,
            retain: m.retain,
            correlation_data: m.correlation_data.map(Into::into),
            message_expiry_interval: m.message_expiry_interval,
            content_type: m.content_type.as_deref().map(types::str_of),
            payload_format_indicator: m.payload_format_indicator,
            response_topic: m.response_topic.map(Into::into),
            user_properties: m
                .user_properties
                .into_iter()
                .map(|p| (types::str_of(&p.name), types::str_of(&p.value)))
                .collect(),
            target_client: m.target_client.map(Into::into),
        }),
        wit::Output::Journal(record) => types::Output::Journal(record),
        wit::Output::Violation(v) => types::Output::Violation {
            client_id: v.client_id,
            reason: v.reason,
        },
    }
}

pub(crate) fn error(e: wit::Error) -> types::Error {
    match e {
        wit::Error::InvalidConfig(m) => types::Error::InvalidConfig(m),
        wit::Error::BadSnapshot(m) => types::Error::BadSnapshot(m),
        wit::Error::UnsupportedVersion(v) => types::Error::UnsupportedVersion(v),
        wit::Error::BadRecord(m) => types::Error::BadRecord(m),
        wit::Error::Other(m) => types::Error::Other(m),
    }
}
