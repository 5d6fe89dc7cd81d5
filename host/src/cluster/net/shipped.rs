//! What replicas hand each other for the clients of groups not all of
//! them hold: a replica's clients' requests for a replica holding the group
//! (link frame kind 12, [`encode_requests`]), and what it sends back (kind
//! 13): replies and notifications, each an MQTT 5 publish as the guest made
//! it, or a violation (the client to disconnect).
//!
//! ```text
//!   kind 12 body after its group: u8 0 | requests, or u8 1 | a guest batch
//!   requests = u32 count | count x (str topic | bytes payload | u8 qos
//!            | opt str response topic | opt bytes correlation | opt u32 expiry
//!            | opt str content type | opt u8 payload format
//!            | u32 n | n x (str | str) user properties | opt str client
//!            | opt u64 received at | opt str user name
//!            | u32 n | n x (str | str) attributes | opt (u64 replica | u64 started) via)
//! ```
//!
//! ```text
//!   u32 count | count x output
//!   output = u8 0 (publish) | the publish as snapshots keep it
//!            (`statestore_guest::wire::encode_message`)
//!          | u8 1 (violation) | opt str client | str reason
//!   str, bytes = u32 length | bytes;  opt x = u8 0 | u8 1, x
//! ```

use anyhow::{Result, bail};
use statestore_guest::types::Str;

use crate::{InboundMessage, Output};

/// `messages` (requests), for a replica holding their group.
pub fn encode_requests(messages: &[InboundMessage]) -> Vec<u8> {
    let mut out = vec![0];
    put_u32(&mut out, messages.len());
    for m in messages {
        put_str(&mut out, &m.topic);
        put_bytes(&mut out, &m.payload);
        out.push(m.qos);
        put_opt(&mut out, m.response_topic.as_deref(), put_str);
        put_opt(&mut out, m.correlation_data.as_deref(), put_bytes);
        put_opt(&mut out, m.message_expiry_interval, |o, v| {
            o.extend_from_slice(&v.to_le_bytes());
        });
        put_opt(&mut out, m.content_type.as_deref(), put_str);
        put_opt(&mut out, m.payload_format_indicator, |o, v| o.push(v));
        put_pairs(&mut out, &m.user_properties);
        put_opt(&mut out, m.client_id.as_deref(), put_str);
        put_opt(&mut out, m.received_at, |o, v| {
            o.extend_from_slice(&v.to_le_bytes())
        });
        put_opt(&mut out, m.username.as_deref(), put_str);
        put_pairs(&mut out, &m.attributes);
        put_opt(&mut out, m.via, |o, v| {
            o.extend_from_slice(&v.replica.to_le_bytes());
            o.extend_from_slice(&v.started.to_le_bytes());
        });
    }
    out
}

/// A guest batch (disconnects, a new life), for a replica holding their
/// group.
pub fn encode_inputs(batch: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + batch.len());
    out.push(1);
    out.extend_from_slice(batch);
    out
}

/// What a kind 12 frame carries.
#[derive(Debug, PartialEq, Eq)]
pub enum Served {
    /// Requests.
    Requests(Vec<InboundMessage>),
    /// A guest batch of other inputs.
    Inputs(Vec<u8>),
}

/// What [`encode_requests`] or [`encode_inputs`] wrote; an error (never a
/// panic) for anything else.
pub fn decode_served(buf: &[u8]) -> Result<Served> {
    match buf.first() {
        Some(0) => {}
        Some(1) => return Ok(Served::Inputs(buf[1..].to_vec())),
        Some(k) => bail!("served inputs of kind {k}"),
        None => bail!("no served inputs"),
    }
    let mut r = Reader { buf, at: 1 };
    let count = r.u32()? as usize;
    if count > buf.len() / 8 {
        bail!("{count} requests in {} bytes", buf.len());
    }
    let mut messages = Vec::with_capacity(count);
    for _ in 0..count {
        let topic = r.str()?.to_string();
        let payload = r.bytes()?.to_vec();
        let qos = r.u8()?;
        let response_topic = r.opt(|r| Ok(r.str()?.to_string()))?;
        let correlation_data = r.opt(|r| Ok(r.bytes()?.to_vec()))?;
        let message_expiry_interval = r.opt(Reader::u32)?;
        let content_type = r.opt(|r| Ok(r.str()?.to_string()))?;
        let payload_format_indicator = r.opt(Reader::u8)?;
        let user_properties = r.pairs()?;
        let client_id = r.opt(|r| Ok(r.str()?.to_string()))?;
        let received_at = r.opt(Reader::u64)?;
        let username = r.opt(|r| Ok(r.str()?.to_string()))?;
        let attributes = r.pairs()?;
        let via = r.opt(|r| {
            Ok(statestore_guest::Via {
                replica: r.u64()?,
                started: r.u64()?,
            })
        })?;
        messages.push(InboundMessage {
            topic,
            payload,
            qos,
            response_topic,
            correlation_data,
            message_expiry_interval,
            content_type,
            payload_format_indicator,
            user_properties,
            client_id,
            received_at,
            username,
            attributes,
            via,
        });
    }
    if r.at != buf.len() {
        bail!("{} bytes after the requests", buf.len() - r.at);
    }
    Ok(Served::Requests(messages))
}

fn put_pairs(out: &mut Vec<u8>, pairs: &[(String, String)]) {
    put_u32(out, pairs.len());
    for (k, v) in pairs {
        put_str(out, k);
        put_str(out, v);
    }
}

/// `outputs`' publishes and violations (the rest is not for clients), in
/// order.
pub fn encode(outputs: &[Output]) -> Vec<u8> {
    let mut out = Vec::new();
    let mine: Vec<&Output> = outputs
        .iter()
        .filter(|o| matches!(o, Output::Publish(_) | Output::Violation { .. }))
        .collect();
    put_u32(&mut out, mine.len());
    for o in mine {
        match o {
            Output::Publish(m) => {
                out.push(0);
                statestore_guest::wire::encode_message(m, &mut out);
            }
            Output::Violation { client_id, reason } => {
                out.push(1);
                put_opt(&mut out, client_id.as_deref(), put_str);
                put_str(&mut out, reason);
            }
            Output::Journal(_) | Output::More(_) => unreachable!("filtered above"),
        }
    }
    out
}

/// The outputs [`encode`] wrote; an error (never a panic) for anything else.
pub fn decode(buf: &[u8]) -> Result<Vec<Output>> {
    let mut r = Reader { buf, at: 0 };
    let count = r.u32()? as usize;
    // Each output takes at least 2 bytes: a count past that is a lie.
    if count > buf.len() / 2 {
        bail!("{count} outputs in {} bytes", buf.len());
    }
    let mut outputs = Vec::with_capacity(count);
    for _ in 0..count {
        match r.u8()? {
            0 => {
                let (m, used) = statestore_guest::wire::decode_message(&buf[r.at..])
                    .map_err(|e| anyhow::anyhow!("a publish: {e}"))?;
                r.at += used;
                outputs.push(Output::Publish(m));
            }
            1 => {
                let client_id = r.opt(|r| Ok(r.str()?.to_string()))?;
                let reason = r.str()?.to_string();
                outputs.push(Output::Violation { client_id, reason });
            }
            t => bail!("an output of type {t}"),
        }
    }
    if r.at != buf.len() {
        bail!("{} bytes after the outputs", buf.len() - r.at);
    }
    Ok(outputs)
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len());
    out.extend_from_slice(b);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

fn put_opt<T>(out: &mut Vec<u8>, v: Option<T>, put: impl FnOnce(&mut Vec<u8>, T)) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            put(out, v);
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() - self.at < n {
            bail!("outputs cut short");
        }
        let b = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }

    fn pairs(&mut self) -> Result<Vec<(String, String)>> {
        let n = self.u32()? as usize;
        if n > self.buf.len() / 8 {
            bail!("{n} pairs in {} bytes", self.buf.len());
        }
        let mut pairs = Vec::with_capacity(n);
        for _ in 0..n {
            pairs.push((self.str()?.to_string(), self.str()?.to_string()));
        }
        Ok(pairs)
    }

    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn str(&mut self) -> Result<Str> {
        let b = self.bytes()?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(Str::from(s)),
            Err(_) => bail!("a string that is not UTF-8"),
        }
    }

    fn opt<T>(&mut self, read: impl FnOnce(&mut Self) -> Result<T>) -> Result<Option<T>> {
        match self.u8()? {
            0 => Ok(None),
            1 => read(self).map(Some),
            f => bail!("an option flagged {f}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OutboundMessage, PublishKind};
    use bytes::Bytes;

    fn sample() -> Vec<Output> {
        vec![
            Output::Publish(OutboundMessage {
                kind: PublishKind::Response,
                topic: Str::from("clients/c1/reply"),
                payload: Bytes::from_static(b"+OK\r\n"),
                qos: 1,
                retain: false,
                correlation_data: Some(Bytes::from_static(&[1, 2, 3])),
                message_expiry_interval: Some(10),
                content_type: Some(Str::from("application/octet-stream")),
                payload_format_indicator: Some(0),
                response_topic: None,
                user_properties: vec![(Str::from("__stat"), Str::from("200"))],
                target_client: None,
            }),
            Output::Journal(vec![9, 9]),
            Output::Publish(OutboundMessage {
                kind: PublishKind::Notification,
                topic: Str::from("clients/statestore/v1/x/c2/command/notify/6b"),
                payload: Bytes::from_static(b"*2\r\n"),
                qos: 1,
                retain: false,
                correlation_data: None,
                message_expiry_interval: None,
                content_type: None,
                payload_format_indicator: None,
                response_topic: Some(Str::from("r")),
                user_properties: Vec::new(),
                target_client: Some(Str::from("c2")),
            }),
            Output::Violation {
                client_id: Some("c3".into()),
                reason: "not its topic".into(),
            },
        ]
    }

    #[test]
    fn outputs_round_trip_without_what_is_not_for_clients() {
        let all = sample();
        let back = decode(&encode(&all)).expect("decodes");
        let want: Vec<Output> = all
            .into_iter()
            .filter(|o| !matches!(o, Output::Journal(_)))
            .collect();
        assert_eq!(back, want);
        assert_eq!(decode(&encode(&[])).expect("none"), Vec::new());
    }

    #[test]
    fn requests_and_inputs_round_trip_and_cuts_are_errors() {
        let m = InboundMessage {
            topic: "statestore/v1/x/command/invoke".into(),
            payload: b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n".to_vec(),
            qos: 1,
            response_topic: Some("clients/c/reply".into()),
            correlation_data: Some(vec![1, 2]),
            message_expiry_interval: Some(10),
            content_type: None,
            payload_format_indicator: Some(1),
            user_properties: vec![("__ft".into(), "1:0:n".into())],
            client_id: Some("c".into()),
            received_at: Some(5),
            username: Some("u".into()),
            attributes: vec![("site".into(), "a".into())],
            via: Some(statestore_guest::Via {
                replica: 4,
                started: 9,
            }),
        };
        let both = vec![m.clone(), InboundMessage::default()];
        let wire = encode_requests(&both);
        assert_eq!(
            decode_served(&wire).expect("decodes"),
            Served::Requests(both)
        );
        for n in 0..wire.len() {
            assert!(decode_served(&wire[..n]).is_err(), "cut at {n}");
        }
        for i in 0..wire.len() {
            let mut bad = wire.clone();
            bad[i] ^= 0x80;
            let _ = decode_served(&bad);
        }
        assert_eq!(
            decode_served(&encode_inputs(&[7, 7])).expect("inputs"),
            Served::Inputs(vec![7, 7])
        );
    }

    #[test]
    fn every_cut_and_flip_is_an_error_or_other_outputs_never_a_panic() {
        let wire = encode(&sample());
        for n in 0..wire.len() {
            assert!(decode(&wire[..n]).is_err(), "cut at {n}");
        }
        for i in 0..wire.len() {
            for bit in [0x01, 0x80] {
                let mut bad = wire.clone();
                bad[i] ^= bit;
                let _ = decode(&bad);
            }
        }
        assert!(decode(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }
}
