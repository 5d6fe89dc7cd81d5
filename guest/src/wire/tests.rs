use super::*;

#[test]
fn a_batch_splits_into_batches_of_one_that_decode_alike() {
    let m = |key: &str| InboundMessage {
        topic: "t".into(),
        payload: key.as_bytes().to_vec(),
        qos: 1,
        ..InboundMessage::default()
    };
    let (a, b) = (m("a"), m("bb"));
    let batch = encode_batch(&[
        Input::Message(&a),
        Input::Disconnected("c"),
        Input::Message(&b),
    ]);
    let singles = batch_singles(&batch).expect("split");
    assert_eq!(singles.len(), 3);
    for (one, want) in singles.iter().zip([
        encode_batch(&[Input::Message(&a)]),
        encode_batch(&[Input::Disconnected("c")]),
        encode_batch(&[Input::Message(&b)]),
    ]) {
        assert_eq!(one, &want);
    }
    assert!(batch_singles(&batch[..batch.len() - 1]).is_err());
    assert!(batch_singles(&[batch.clone(), vec![0]].concat()).is_err());
}

#[test]
fn the_rest_of_a_batch_decodes_as_its_tail() {
    let mut a = message();
    a.payload = b"first".to_vec();
    let mut b = message();
    b.payload = b"second".to_vec();
    let inputs = [
        Input::Message(&a),
        Input::Disconnected("gone"),
        Input::Message(&b),
    ];
    let batch = encode_batch(&inputs);
    assert_eq!(batch_count(&batch), 3);
    let rest = batch_after(&batch, 1).expect("rest");
    assert_eq!(batch_count(&rest), 2);
    assert_eq!(rest, encode_batch(&inputs[1..]));
    assert_eq!(batch_after(&batch, 3).expect("none"), encode_batch(&[]));
    assert_eq!(batch_after(&batch, 9).expect("none"), encode_batch(&[]));
    assert!(batch_after(&batch[..batch.len() - 1], 3).is_err());
}

#[test]
fn utf8_agrees_with_core() {
    let base = b"clients/c1/services/statestore/v1/response".to_vec();
    let inserts: [&[u8]; 6] = [
        b"\xc3\xa9",
        b"\xe2\x82\xac",
        b"\xff",
        b"\xc3",
        b"\x80",
        b"\x7f",
    ];
    for len in 0..base.len() {
        let ascii = &base[..len];
        assert_eq!(utf8(ascii).ok(), core::str::from_utf8(ascii).ok());
        for pos in 0..=len {
            for insert in inserts {
                let mut t = ascii.to_vec();
                t.splice(pos..pos, insert.iter().copied());
                assert_eq!(utf8(&t).ok(), core::str::from_utf8(&t).ok(), "{t:?}");
            }
        }
    }
}

fn message() -> InboundMessage {
    InboundMessage {
        topic: "t".into(),
        payload: b"*1\r\n$3\r\nGET\r\n".to_vec(),
        qos: 1,
        response_topic: Some("r".into()),
        correlation_data: Some(vec![1, 2]),
        message_expiry_interval: Some(10),
        content_type: Some("application/octet-stream".into()),
        payload_format_indicator: Some(0),
        user_properties: vec![
            ("__ts".into(), "x".into()),
            ("__ts".into(), "second".into()),
            ("__srcId".into(), "me".into()),
        ],
        client_id: Some("c".into()),
        received_at: Some(7),
        username: Some("alice".into()),
        attributes: vec![("city".into(), "seattle".into())],
        via: Some(Via {
            replica: 3,
            started: u64::MAX - 1,
        }),
    }
}

fn decoded(wire: &[u8]) -> Vec<MessageRef<'_>> {
    decode_batch(wire)
        .expect("decodes")
        .into_iter()
        .filter_map(|i| match i {
            InputRef::Message(m) => Some(m),
            _ => None,
        })
        .collect()
}

#[test]
fn batch_round_trips_into_refs() {
    let m = message();
    let empty = InboundMessage::default();
    let wire = encode_batch(&[
        Input::Message(&m),
        Input::Disconnected("gone"),
        Input::Message(&empty),
    ]);
    let all = decode_batch(&wire).expect("decodes");
    assert!(matches!(all[1], InputRef::Disconnected("gone")));
    let seen = decoded(&wire);
    assert_eq!(seen.len(), 2);
    let direct = MessageRef::of(&m);
    assert_eq!(seen[0].props.timestamp, direct.props.timestamp);
    assert_eq!(seen[0].props.timestamp, Some("x"), "the first __ts wins");
    assert_eq!(seen[0].props.source_id, Some("me"));
    assert_eq!(seen[0].topic, m.topic);
    assert_eq!(seen[0].payload, &m.payload[..]);
    assert_eq!(seen[0].response_topic, Some("r"));
    assert_eq!(seen[0].correlation_data, Some(&[1u8, 2][..]));
    assert_eq!(seen[0].message_expiry_interval, Some(10));
    assert_eq!(seen[0].client_id, Some("c"));
    assert_eq!(seen[0].received_at, Some(7));
    assert_eq!(seen[0].username, Some("alice"));
    assert_eq!(seen[0].attributes.get("city"), Some("seattle"));
    assert_eq!(seen[1].topic, "");
    assert_eq!(seen[1].username, None);
    assert_eq!(seen[1].attributes.iter().count(), 0);
    assert_eq!(seen[0].via, m.via);
    assert_eq!(seen[1].via, None);
}

/// The inputs of version 4: `disconnected-via` and `replica-started`;
/// a version 3 batch has neither (nor a message's `via`).
#[test]
fn version_4_inputs_round_trip() {
    let via = Via {
        replica: 5,
        started: 1_700_000_000_000,
    };
    let wire = encode_batch(&[
        Input::DisconnectedVia("gone", via),
        Input::ReplicaStarted(via),
    ]);
    let all = decode_batch(&wire).expect("decodes");
    assert!(matches!(all[0], InputRef::DisconnectedVia("gone", v) if v == via));
    assert!(matches!(all[1], InputRef::ReplicaStarted(v) if v == via));
    let mut v3 = wire.clone();
    v3[0] = 3;
    assert!(decode_batch(&v3).is_err(), "tags 2 and 3 are version 4's");
    assert_eq!(
        batch_after(&wire, 1).expect("skips"),
        encode_batch(&[Input::ReplicaStarted(via)])
    );
}

/// Batches of versions 1 (messages only, no input tags), 2 (no user
/// name or attributes) and 3 (no via) still decode.
#[test]
fn version_1_2_and_3_batches_decode() {
    let m = InboundMessage {
        username: None,
        attributes: Vec::new(),
        via: None,
        ..message()
    };
    let mut v2 = encode_batch(&[Input::Message(&m)]);
    // Version 3 is version 4 without the via (`u8 0` here).
    assert_eq!(v2[v2.len() - 1], 0);
    v2.truncate(v2.len() - 1);
    v2[0] = 3;
    assert_eq!(decoded(&v2)[0].received_at, Some(7));
    // Version 2 is version 3 without the user name and attributes
    // (`u8 0` and `u32 0` here).
    assert_eq!(v2[v2.len() - 5..], [0, 0, 0, 0, 0]);
    v2.truncate(v2.len() - 5);
    v2[0] = 2;
    let seen = decoded(&v2);
    assert_eq!(seen[0].received_at, Some(7));
    assert_eq!(seen[0].username, None);
    // Version 1 is version 2 without the tag byte of each message.
    let mut v1 = v2.clone();
    v1.remove(5);
    v1[0] = 1;
    let seen = decoded(&v1);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].topic, m.topic);
    assert_eq!(seen[0].received_at, Some(7));
    // A version 2 batch with version 3's fields has bytes left over.
    let mut long = encode_batch(&[Input::Message(&message())]);
    long[0] = 2;
    assert!(decode_batch(&long).is_err());
}

#[test]
fn outputs_round_trip_through_the_message_builders() {
    let mut w = OutputWriter::new(0);
    w.begin_input();
    w.violation(None, "no");
    let reply = Reply::status(
        Status::BadRequest,
        "why".into(),
        &[(rpc::prop::PROPERTY_NAME, "Message Expiry".into())],
    );
    let to = ReplyTo {
        topic: "r/t",
        correlation: Some(&[7, 7]),
        expiry: Some(3),
        node: "n",
        source_id: Some("me"),
    };
    w.reply(&to, &reply);
    // A journal record written last comes first: it is of the same input.
    w.journal(&[1, 2, 3]);
    w.begin_input();
    let ok = Reply::ok(
        &b"+OK\r\n"[..],
        Some(Version {
            wall: 5,
            counter: 1,
        }),
    );
    w.reply(&to, &ok);
    w.journal(&[4]);
    let outputs = decode_outputs(&w.finish(), &[]).expect("decodes");
    let expected = vec![
        Output::Journal(vec![1, 2, 3]),
        Output::Violation {
            client_id: None,
            reason: "no".into(),
        },
        Output::Publish(reply.message(
            "r/t".into(),
            Some(Bytes::from_static(&[7, 7])),
            Some(3),
            "n",
            Some("me".into()),
        )),
        Output::Journal(vec![4]),
        Output::Publish(ok.message(
            "r/t".into(),
            Some(Bytes::from_static(&[7, 7])),
            Some(3),
            "n",
            Some("me".into()),
        )),
    ];
    assert_eq!(outputs, expected);
    let Output::Publish(m) = &outputs[2] else {
        unreachable!()
    };
    assert_eq!(Reply::of_message(m), Some(reply));
}

#[test]
fn every_truncation_and_corruption_is_an_error_not_a_panic() {
    let (a, b) = (message(), message());
    let wire = encode_batch(&[
        Input::Message(&a),
        Input::Disconnected("x"),
        Input::DisconnectedVia(
            "y",
            Via {
                replica: 2,
                started: 3,
            },
        ),
        Input::ReplicaStarted(Via {
            replica: 2,
            started: 4,
        }),
        Input::Message(&b),
    ]);
    for cut in 0..wire.len() {
        assert!(decode_batch(&wire[..cut]).is_err(), "cut at {cut}");
    }
    for i in 0..wire.len() {
        let mut w = wire.clone();
        w[i] ^= 0xff;
        let _ = decode_batch(&w);
    }
    let mut longer = wire.clone();
    longer.push(0);
    assert!(decode_batch(&longer).is_err());
    assert_eq!(
        decode_batch(&[5, 0, 0, 0, 0]).map(|v| v.len()),
        Err(Error::UnsupportedVersion(5))
    );
    assert!(decode_batch(&[2, 255, 255, 255, 255]).is_err());
    assert!(
        decode_outputs(&[2, 0, 0, 0, 0], &[]).is_err(),
        "version 2 lists are not read"
    );
}
