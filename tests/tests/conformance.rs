//! Spec §17 conformance cases in simulated time, with exact bytes and
//! properties. Each scenario is also a golden vector (`vectors/<name>.json`)
//! that `vectors.rs` replays against the native build and the wasm component.

use statestore::{Output, PublishKind};
use statestore_guest::rpc::REQUEST_TOPIC;
use statestore_tests::*;

const SKEW: &[u8] = b"-ERR the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n";
const FT_SKEW: &[u8] = b"-ERR the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n";
const FT_REQUIRED: &[u8] = b"-ERR a fencing token is required for this request\r\n";
const FT_LOWER: &[u8] =
    b"-ERR the request fencing token is a lower version than the fencing token protecting the resource\r\n";

#[test]
fn s17_01_to_04_set_get_nx() {
    let mut sim = Sim::new(
        "s17_01_set_get_nx",
        "§17 #1-#4: SET, GET hit and miss, SET NX on an existing key",
    );
    let (m, out) = sim.call(&[b"SET", b"k1", b"v1"]);
    // #30 rule: request __ts T0:0 equals the server's now, so L = (T0, 1).
    let v1 = version(T0, 1);
    assert_reply(&out, &m, b"+OK\r\n", Some(&v1));
    assert!(v1.as_str() > format!("{T0:015}:00000:c1").as_str());
    sim.advance(5);
    let (m, out) = sim.call(&[b"GET", b"k1"]);
    assert_reply(&out, &m, b"$2\r\nv1\r\n", Some(&v1));
    let (m, out) = sim.call(&[b"GET", b"nokey"]);
    assert_reply(&out, &m, b"$-1\r\n", None);
    let (m, out) = sim.call(&[b"SET", b"k1", b"v1", b"NX"]);
    assert_reply(&out, &m, b":-1\r\n", Some(&v1));
    let (m, out) = sim.call(&[b"GET", b"k1"]);
    assert_reply(&out, &m, b"$2\r\nv1\r\n", Some(&v1));
    sim.finish();
}

#[test]
fn s17_05_to_07_nex() {
    let mut sim = Sim::new(
        "s17_05_nex",
        "§17 #5-#7: NEX applies on equal value or absent key, not on a different value",
    );
    sim.call(&[b"SET", b"k1", b"v1"]);
    sim.advance(10);
    let (m, out) = sim.call(&[b"SET", b"k1", b"v1", b"NEX"]);
    // The client clock equals ours: (now, 1) by the receive rule.
    let v2 = version(T0 + 10, 1);
    assert_reply(&out, &m, b"+OK\r\n", Some(&v2));
    sim.advance(10);
    let (m, out) = sim.call(&[b"SET", b"k1", b"zz", b"NEX"]);
    assert_reply(&out, &m, b":-1\r\n", Some(&v2));
    let (m, out) = sim.call(&[b"SET", b"k2", b"v", b"NEX"]);
    assert!(reply(&out).payload == b"+OK\r\n"[..], "{:?}", m);
    let (_, out) = sim.call(&[b"SET", b"k3", b"v", b"NX"]);
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    sim.finish();
}

#[test]
fn s17_08_09_del_vdel() {
    let mut sim = Sim::new(
        "s17_08_del_vdel",
        "§17 #8-#9: DEL then DEL again; VDEL mismatch, match, absent",
    );
    sim.call(&[b"SET", b"k1", b"v1"]);
    sim.advance(10);
    let (m, out) = sim.call(&[b"DEL", b"k1"]);
    // DEL's __ts is the deletion HLC (spec §18 Q2).
    assert_reply(&out, &m, b":1\r\n", Some(&version(T0 + 10, 1)));
    let (m, out) = sim.call(&[b"DEL", b"k1"]);
    assert_reply(&out, &m, b":0\r\n", None);
    sim.advance(10);
    let (_, out) = sim.call(&[b"SET", b"k", b"v"]);
    let vk = version(T0 + 20, 1);
    assert_eq!(ts_of(reply(&out)), Some(vk.as_str()));
    let (m, out) = sim.call(&[b"VDEL", b"k", b"x"]);
    assert_reply(&out, &m, b":-1\r\n", Some(&vk));
    sim.advance(1);
    let (m, out) = sim.call(&[b"VDEL", b"k", b"v"]);
    assert_reply(&out, &m, b":1\r\n", Some(&version(T0 + 21, 1)));
    let (m, out) = sim.call(&[b"VDEL", b"k", b"v"]);
    assert_reply(&out, &m, b":0\r\n", None);
    sim.finish();
}

#[test]
fn s17_10_expired_key_is_invisible() {
    let mut sim = Sim::new(
        "s17_10_expiry",
        "§17 #10: SET PX 1000, two seconds later GET misses without __ts",
    );
    let (m, out) = sim.call(&[b"SET", b"e", b"v", b"PX", b"1000"]);
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0, 1)));
    sim.advance(999);
    let (_, out) = sim.call(&[b"GET", b"e"]);
    assert_eq!(reply(&out).payload, &b"$1\r\nv\r\n"[..]);
    let timer = sim.advance(1001);
    assert!(
        timer.is_empty(),
        "no observers, nothing to publish: {timer:?}"
    );
    let (m, out) = sim.call(&[b"GET", b"e"]);
    assert_reply(&out, &m, b"$-1\r\n", None);
    // NX succeeds on the expired key.
    let (m, out) = sim.call(&[b"SET", b"e", b"w", b"NX"]);
    // The GET before absorbed its __ts: (T0+2000, 1), so this is counter 2.
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0 + 2000, 2)));
    sim.finish();
}

#[test]
fn s17_10_lazy_expiry_without_timer() {
    // A host whose timer is late: the key is already invisible at its deadline.
    let mut sim = Sim::new(
        "s17_10_lazy_expiry",
        "§10: an expired key is invisible even before the timer fires",
    );
    sim.call(&[b"SET", b"e", b"v", b"PX", b"1000"]);
    sim.now += 1000; // no timeout call
    let (m, out) = sim.call(&[b"GET", b"e"]);
    assert_reply(&out, &m, b"$-1\r\n", None);
    sim.finish();
}

#[test]
fn s17_11_empty_value() {
    let mut sim = Sim::new("s17_11_empty_value", "§17 #11: an empty value is legal");
    let (m, out) = sim.call(&[b"SET", b"z", b""]);
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0, 1)));
    let (m, out) = sim.call(&[b"GET", b"z"]);
    assert_reply(&out, &m, b"$0\r\n\r\n", Some(&version(T0, 1)));
    sim.finish();
}

#[test]
fn s17_12_to_20_errors() {
    let mut sim = Sim::new(
        "s17_12_errors",
        "§17 #12-#20: error replies, all with __stat 200 and no __ts",
    );
    let cases: Vec<(Vec<&[u8]>, &[u8])> = vec![
        (vec![b"GET", b""], b"-ERR the key length is zero\r\n"),
        (vec![b"DEL", b""], b"-ERR the key length is zero\r\n"),
        (vec![b"MGET", b"a"], b"-ERR unknown command\r\n"),
        (
            vec![b"GET", b"a", b"b"],
            b"-ERR wrong number of arguments\r\n",
        ),
        (vec![b"SET", b"k", b"v", b"PX"], b"-ERR syntax error\r\n"),
        (vec![b"SET", b"k", b"v", b"XX"], b"-ERR syntax error\r\n"),
        (
            vec![b"SET", b"k", b"v", b"PX", b"abc"],
            b"-ERR syntax error\r\n",
        ),
        (
            vec![b"SET", b"k", b"v", b"NX", b"NEX"],
            b"-ERR syntax error\r\n",
        ),
        (
            vec![b"SET", b"k", b"v", b"PX", b"0"],
            b"-ERR syntax error\r\n",
        ),
    ];
    for (parts, want) in cases {
        let (m, out) = sim.call(&parts);
        assert_reply(&out, &m, want, None);
    }
    for raw in [
        &b"hello"[..],
        b"*1\r\n$3\r\nGET",
        b"",
        b"*0\r\n",
        b"*1\r\n$3\r\nGET\r\nextra",
    ] {
        let mut m = sim.request(&[b"GET", b"k"]);
        m.payload = raw.to_vec();
        let out = sim.send(&m);
        assert_reply(&out, &m, b"-ERR syntax error\r\n", None);
    }
    // #13: SET without __ts.
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    set_prop(&mut m, "__ts", None);
    let out = sim.send(&m);
    assert_reply(&out, &m, b"-ERR missing timestamp\r\n", None);
    // ... but GET without __ts is fine.
    let mut m = sim.request(&[b"GET", b"k"]);
    set_prop(&mut m, "__ts", None);
    let out = sim.send(&m);
    assert_reply(&out, &m, b"$-1\r\n", None);
    // #14: malformed __ts.
    for bad in ["abc", "1:2", "x:0:n", "1:2:3:4", ""] {
        let mut m = sim.request(&[b"SET", b"k", b"v"]);
        set_prop(&mut m, "__ts", Some(bad));
        let out = sim.send(&m);
        assert_reply(&out, &m, b"-ERR malformed timestamp\r\n", None);
    }
    // #15: __ts 120 s ahead; the server clock does not move.
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    let ahead = format!("{:015}:00000:c1", sim.now + 120_000);
    set_prop(&mut m, "__ts", Some(&ahead));
    let out = sim.send(&m);
    assert_reply(&out, &m, SKEW, None);
    // Exactly 60 s ahead is still accepted (the limit is "more than").
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    let edge = format!("{:015}:00000:c1", sim.now + 60_000);
    set_prop(&mut m, "__ts", Some(&edge));
    let out = sim.send(&m);
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0 + 60_000, 1)));
    // #16: __ft ten years ahead, on a key that does not exist.
    let mut m = sim.request(&[b"SET", b"n", b"v"]);
    let future = format!("{:015}:00000:c1", sim.now + 10 * 365 * 86_400_000);
    set_prop(&mut m, "__ft", Some(&future));
    let out = sim.send(&m);
    assert_reply(&out, &m, FT_SKEW, None);
    let mut m = sim.request(&[b"SET", b"n", b"v"]);
    set_prop(&mut m, "__ft", Some("not-a-token"));
    let out = sim.send(&m);
    assert_reply(&out, &m, b"-ERR malformed timestamp\r\n", None);
    // A garbage __ft on GET is ignored (fencing applies to SET, DEL, VDEL only).
    let mut m = sim.request(&[b"GET", b"n"]);
    set_prop(&mut m, "__ft", Some("garbage"));
    let out = sim.send(&m);
    assert_reply(&out, &m, b"$-1\r\n", None);
    sim.finish();
}

#[test]
fn s17_17_fencing() {
    let mut sim = Sim::new(
        "s17_17_fencing",
        "§17 #17: fencing tokens required, lower rejected, equal and higher accepted",
    );
    let f0 = format!("{:015}:00000:lock", T0 - 1000);
    let f1 = format!("{T0:015}:00000:lock");
    let f2 = format!("{T0:015}:00001:lock");
    let with_ft = |sim: &mut Sim, parts: &[&[u8]], ft: Option<&str>| {
        let mut m = sim.request(parts);
        set_prop(&mut m, "__ft", ft);
        let out = sim.send(&m);
        (m, out)
    };
    let (m, out) = with_ft(&mut sim, &[b"SET", b"p", b"v"], Some(&f1));
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0, 1)));
    let (m, out) = with_ft(&mut sim, &[b"SET", b"p", b"w"], None);
    assert_reply(&out, &m, FT_REQUIRED, None);
    let (m, out) = with_ft(&mut sim, &[b"SET", b"p", b"w"], Some(&f0));
    assert_reply(&out, &m, FT_LOWER, None);
    let (m, out) = with_ft(&mut sim, &[b"DEL", b"p"], Some(&f0));
    assert_reply(&out, &m, FT_LOWER, None);
    let (m, out) = with_ft(&mut sim, &[b"VDEL", b"p", b"w"], None);
    assert_reply(&out, &m, FT_REQUIRED, None);
    // A fenced NX that fails on the condition still needs a good token first.
    let (m, out) = with_ft(&mut sim, &[b"SET", b"p", b"w", b"NX"], None);
    assert_reply(&out, &m, FT_REQUIRED, None);
    // Every request above absorbed its __ts into the clock (counters 2 to 6).
    let (m, out) = with_ft(&mut sim, &[b"SET", b"p", b"w"], Some(&f1));
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0, 7)));
    // GET never checks.
    let (m, out) = with_ft(&mut sim, &[b"GET", b"p"], None);
    assert_reply(&out, &m, b"$1\r\nw\r\n", Some(&version(T0, 7)));
    let (m, out) = with_ft(&mut sim, &[b"DEL", b"p"], Some(&f2));
    assert_reply(&out, &m, b":1\r\n", Some(&version(T0, 9)));
    // Deletion dropped the token: an unfenced SET works again.
    let (m, out) = with_ft(&mut sim, &[b"SET", b"p", b"x"], None);
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0, 10)));
    sim.finish();
}

#[test]
fn s17_21_to_23_keynotify() {
    let mut sim = Sim::new(
        "s17_21_keynotify",
        "§17 #21-#23: KEYNOTIFY twice gives one notification; DELETE before :1; STOP",
    );
    for _ in 0..2 {
        let (m, out) = sim.call(&[b"KEYNOTIFY", b"k"]);
        assert_reply(&out, &m, b"+OK\r\n", None);
    }
    let (m, out) = sim.call(&[b"SET", b"k", b"abc"]);
    assert_eq!(out.len(), 2, "one notification then the reply: {out:#?}");
    let v = version(T0, 3); // the two KEYNOTIFYs absorbed their __ts
    let notes = notifications(&out);
    assert_notification(
        notes[0],
        "c1",
        b"k",
        b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n",
        &v,
    );
    assert_reply(&out, &m, b"+OK\r\n", Some(&v));
    sim.advance(3);
    let (m, out) = sim.call(&[b"DEL", b"k"]);
    assert_eq!(out.len(), 2);
    let dv = version(T0 + 3, 1);
    assert_notification(
        notifications(&out)[0],
        "c1",
        b"k",
        b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n",
        &dv,
    );
    assert_reply(&out, &m, b":1\r\n", Some(&dv));
    // Nothing for a DEL that removed nothing, nor for GET.
    let (_, out) = sim.call(&[b"DEL", b"k"]);
    assert!(notifications(&out).is_empty());
    let (m, out) = sim.call(&[b"KEYNOTIFY", b"k", b"STOP"]);
    assert_reply(&out, &m, b"+OK\r\n", None);
    let (m, out) = sim.call(&[b"KEYNOTIFY", b"k", b"STOP"]);
    assert_reply(&out, &m, b":0\r\n", None);
    let (_, out) = sim.call(&[b"SET", b"k", b"x"]);
    assert_eq!(out.len(), 1, "no notification after STOP: {out:#?}");
    sim.finish();
}

#[test]
fn s17_21_no_notification_when_not_applied() {
    let mut sim = Sim::new(
        "s17_21_not_applied",
        "§11.2: no notification for :-1, :0, errors or GET; observing survives deletion",
    );
    sim.call(&[b"KEYNOTIFY", b"k"]);
    sim.call(&[b"SET", b"k", b"a"]);
    for parts in [
        vec![&b"SET"[..], b"k", b"b", b"NX"],
        vec![b"SET", b"k", b"b", b"NEX"],
        vec![b"VDEL", b"k", b"zz"],
        vec![b"GET", b"k"],
        vec![b"SET", b"k", b"b", b"BAD"],
    ] {
        let (_, out) = sim.call(&parts);
        assert!(notifications(&out).is_empty(), "{parts:?}");
    }
    // Registration survives deletion and re-creation (T-RS key8).
    let (_, out) = sim.call(&[b"DEL", b"k"]);
    assert_eq!(notifications(&out).len(), 1);
    let (_, out) = sim.call(&[b"SET", b"k", b"c"]);
    assert_eq!(notifications(&out).len(), 1);
    let (_, out) = sim.call(&[b"VDEL", b"k", b"c"]);
    assert_eq!(notifications(&out).len(), 1);
    sim.finish();
}

#[test]
fn s17_24_notification_topic() {
    let mut sim = Sim::new(
        "s17_24_topic",
        "§17 #24: upper-case hex client id and key in the notification topic",
    );
    let m = sim.request_from("client-id1", &[b"KEYNOTIFY", b"SOMEKEY"]);
    sim.send(&m);
    let m = sim.request_from("client-id1", &[b"SET", b"SOMEKEY", b"v"]);
    let out = sim.send(&m);
    assert_eq!(
        notifications(&out)[0].topic,
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/534F4D454B4559"
    );
    sim.finish();
}

#[test]
fn s17_25_expiry_notifies_delete() {
    let mut sim = Sim::new(
        "s17_25_expiry_notify",
        "§17 #25: SET PX 1000 on an observed key: SET, then DELETE at the deadline",
    );
    sim.call(&[b"KEYNOTIFY", b"t"]);
    let (_, out) = sim.call(&[b"SET", b"t", b"v", b"PX", b"1000"]);
    assert_eq!(notifications(&out).len(), 1);
    let before = sim.advance(999);
    assert!(before.is_empty());
    let at = sim.advance(1);
    assert_eq!(at.len(), 1, "{at:#?}");
    let Output::Publish(n) = &at[0] else { panic!() };
    assert_notification(
        n,
        "c1",
        b"t",
        b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n",
        &version(T0 + 1000, 0),
    );
    // A renewal before the deadline moves it.
    sim.call(&[b"SET", b"t", b"v", b"PX", b"1000"]);
    sim.advance(600);
    sim.call(&[b"SET", b"t", b"v", b"NEX", b"PX", b"1000"]);
    assert!(sim.advance(900).is_empty());
    assert_eq!(sim.advance(100).len(), 1);
    // A SET without PX clears the expiry (spec §18 Q5).
    sim.call(&[b"SET", b"t", b"v", b"PX", b"1000"]);
    sim.call(&[b"SET", b"t", b"w"]);
    assert!(sim.advance(5000).is_empty());
    sim.finish();
}

#[test]
fn s17_26_dedup() {
    let mut sim = Sim::new(
        "s17_26_dedup",
        "§17 #26: a redelivered SET NX gets the identical reply and is not applied twice",
    );
    sim.call(&[b"KEYNOTIFY", b"d"]);
    let m = sim.request(&[b"SET", b"d", b"v", b"NX"]);
    let first = sim.send(&m);
    assert_eq!(notifications(&first).len(), 1);
    assert_reply(&first, &m, b"+OK\r\n", Some(&version(T0, 2)));
    sim.advance(1500);
    // The broker redelivers it with the expiry it has left.
    let mut m = m;
    m.message_expiry_interval = Some(9);
    let again = sim.send(&m);
    assert_eq!(again.len(), 1, "no second notification: {again:#?}");
    assert_reply(&again, &m, b"+OK\r\n", Some(&version(T0, 2)));
    // Same bytes and properties; only the expiry follows the redelivered copy.
    let (a, b) = (reply(&first), reply(&again));
    assert_eq!(a.payload, b.payload);
    assert_eq!(a.user_properties, b.user_properties);
    assert_eq!(
        (a.message_expiry_interval, b.message_expiry_interval),
        (Some(10), Some(9))
    );
    assert_eq!(a.correlation_data, b.correlation_data);
    // A different correlation id is a new request.
    let (_, out) = sim.call(&[b"SET", b"d", b"v", b"NX"]);
    assert_eq!(reply(&out).payload, &b":-1\r\n"[..]);
    // Error replies are cached too.
    let mut bad = sim.request(&[b"SET", b"x", b"v"]);
    set_prop(&mut bad, "__ts", None);
    let e1 = sim.send(&bad);
    set_prop(&mut bad, "__ts", Some(&format!("{:015}:00000:c1", sim.now)));
    let e2 = sim.send(&bad);
    assert_eq!(reply(&e1).payload, reply(&e2).payload);
    // The cache forgets after the request's expiry plus 60 s.
    sim.advance(71_000);
    let late = sim.send(&m);
    assert_eq!(reply(&late).payload, &b":-1\r\n"[..]);
    sim.finish();
}

#[test]
fn s17_27_unsupported_version() {
    let mut sim = Sim::new(
        "s17_27_version",
        "§17 #27: __protVer with major != 1 gets 505",
    );
    for v in ["2.0", "x"] {
        let mut m = sim.request(&[b"SET", b"k", b"v"]);
        set_prop(&mut m, "__protVer", Some(v));
        let out = sim.send(&m);
        let r = reply(&out);
        assert_eq!(r.payload, &b""[..]);
        assert_eq!(r.correlation_data.as_deref(), m.correlation_data.as_deref());
        assert_eq!(r.message_expiry_interval, Some(10));
        assert_eq!(r.user_property("__stat"), Some("505"));
        assert_eq!(r.user_property("__protVer"), Some("1.0"));
        assert_eq!(r.user_property("__supProtMajVer"), Some("1"));
        assert_eq!(r.user_property("__requestProtVer"), Some(v));
        assert!(r.user_property("__stMsg").is_some());
        assert_eq!(r.user_property("__ts"), None);
    }
    // Nothing was written.
    let (_, out) = sim.call(&[b"GET", b"k"]);
    assert_eq!(reply(&out).payload, &b"$-1\r\n"[..]);
    // Absent means 1.0; 1.x is fine.
    let mut m = sim.request(&[b"GET", b"k"]);
    set_prop(&mut m, "__protVer", None);
    assert_eq!(reply(&sim.send(&m)).payload, &b"$-1\r\n"[..]);
    set_prop(&mut m, "__protVer", Some("1.7"));
    assert_eq!(reply(&sim.send(&m)).payload, &b"$-1\r\n"[..]);
    sim.finish();
}

#[test]
fn s17_28_bad_response_topic() {
    let mut sim = Sim::new(
        "s17_28_response_topic",
        "§17 #28: no or forbidden response topic: nothing is published",
    );
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    m.response_topic = None;
    assert!(sim.send(&m).is_empty());
    for forbidden in [
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/x".to_string(),
        REQUEST_TOPIC.to_string(),
    ] {
        m.response_topic = Some(forbidden.clone());
        let out = sim.send(&m);
        assert_eq!(out.len(), 1);
        assert!(
            matches!(&out[0], Output::Violation { client_id: Some(c), .. } if c == "c1"),
            "{out:?}"
        );
    }
    for invalid in ["", "a/+", "a/#", "/a", "a/", "a//b"] {
        m.response_topic = Some(invalid.into());
        assert!(sim.send(&m).is_empty(), "{invalid:?}");
    }
    // None of them executed.
    let (_, out) = sim.call(&[b"GET", b"k"]);
    assert_eq!(reply(&out).payload, &b"$-1\r\n"[..]);
    sim.finish();
}

#[test]
fn s17_29_request_expiry() {
    let mut sim = Sim::new(
        "s17_29_request_expiry",
        "§17 #29: reply expiry is the time left; an expired request gets nothing",
    );
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    m.message_expiry_interval = Some(5);
    let out = sim.send(&m);
    assert_eq!(reply(&out).message_expiry_interval, Some(5));
    // Queued by the host for 2.5 s: 2.5 s left, rounded up.
    let mut m = sim.request(&[b"GET", b"k"]);
    m.message_expiry_interval = Some(5);
    m.received_at = Some(sim.now - 2500);
    assert_eq!(reply(&sim.send(&m)).message_expiry_interval, Some(3));
    // Queued past its deadline: no reply, and not executed.
    let mut m = sim.request(&[b"DEL", b"k"]);
    m.message_expiry_interval = Some(5);
    m.received_at = Some(sim.now - 5000);
    assert!(sim.send(&m).is_empty());
    m.message_expiry_interval = Some(0);
    m.received_at = None;
    assert!(sim.send(&m).is_empty());
    let (_, out) = sim.call(&[b"GET", b"k"]);
    assert_eq!(reply(&out).payload, &b"$1\r\nv\r\n"[..]);
    sim.finish();
}

#[test]
fn s17_30_31_hlc() {
    let mut sim = Sim::new(
        "s17_30_hlc",
        "§17 #30-#31: receive rule with equal clocks; fresh milliseconds give counter 0",
    );
    let mut m = sim.request(&[b"SET", b"a", b"v"]);
    set_prop(&mut m, "__ts", Some(&format!("{T0}:0:cli")));
    let out = sim.send(&m);
    assert_eq!(
        ts_of(reply(&out)),
        Some(format!("{T0:015}:00001:StateStore").as_str())
    );
    // Requests far behind the server clock: versions are (now, 0).
    for i in 1..=2 {
        sim.advance(1);
        let mut m = sim.request(&[b"SET", b"a", b"v"]);
        set_prop(&mut m, "__ts", Some("000000000001000:00000:old"));
        let out = sim.send(&m);
        assert_eq!(ts_of(reply(&out)), Some(version(T0 + i, 0).as_str()));
    }
    // Two writes in one millisecond: counter 1, then 2.
    let (_, out) = sim.call(&[b"SET", b"a", b"w"]);
    assert_eq!(ts_of(reply(&out)), Some(version(T0 + 2, 1).as_str()));
    let (_, out) = sim.call(&[b"DEL", b"a"]);
    assert_eq!(ts_of(reply(&out)), Some(version(T0 + 2, 2).as_str()));
    // A client clock ahead (within 60 s) pulls the server clock forward.
    let mut m = sim.request(&[b"SET", b"a", b"v"]);
    set_prop(
        &mut m,
        "__ts",
        Some(&format!("{:015}:00007:c1", T0 + 30_000)),
    );
    let out = sim.send(&m);
    assert_eq!(ts_of(reply(&out)), Some(version(T0 + 30_000, 8).as_str()));
    sim.finish();
}

#[test]
fn s17_32_lease() {
    let mut sim = Sim::new(
        "s17_32_lease",
        "§17 #32: lease acquire, held by another, released by expiry, taken by the second client",
    );
    let m = sim.request_from("c2", &[b"KEYNOTIFY", b"L"]);
    sim.send(&m);
    let (m, out) = sim.call(&[b"SET", b"L", b"h1", b"NEX", b"PX", b"2000"]);
    let token = version(T0, 2);
    assert_reply(&out, &m, b"+OK\r\n", Some(&token));
    sim.advance(500);
    let m = sim.request_from("c2", &[b"SET", b"L", b"h2", b"NEX", b"PX", b"2000"]);
    let out = sim.send(&m);
    assert_eq!(reply(&out).payload, &b":-1\r\n"[..]);
    assert_eq!(ts_of(reply(&out)), Some(token.as_str()));
    // Renewal by the holder: strictly newer token, same node id, counter 0 on a fresh ms.
    sim.advance(500);
    let (_, out) = sim.call(&[b"SET", b"L", b"h1", b"NEX", b"PX", b"2000"]);
    let renewed = version(T0 + 1000, 1);
    assert_eq!(ts_of(reply(&out)), Some(renewed.as_str()));
    let expired = sim.advance(2000);
    assert_eq!(notifications(&expired).len(), 1);
    assert_eq!(
        notifications(&expired)[0].payload,
        &b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"[..]
    );
    assert_eq!(
        notifications(&expired)[0].target_client.as_deref(),
        Some("c2")
    );
    let m = sim.request_from("c2", &[b"SET", b"L", b"h2", b"NEX", b"PX", b"2000"]);
    let out = sim.send(&m);
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    // Releasing a lease one does not hold.
    let (_, out) = sim.call(&[b"VDEL", b"L", b"h1"]);
    assert_eq!(reply(&out).payload, &b":-1\r\n"[..]);
    sim.finish();
}

#[test]
fn s17_33_34_case_and_option_order() {
    let mut sim = Sim::new(
        "s17_33_case_order",
        "§17 #33-#34: lower-case verbs and options; PX before NX",
    );
    let mut m = sim.request(&[b"GET", b"a"]);
    m.payload = b"*4\r\n$3\r\nset\r\n$1\r\na\r\n$1\r\nb\r\n$2\r\nnx\r\n".to_vec();
    assert_reply(&sim.send(&m), &m, b"+OK\r\n", Some(&version(T0, 1)));
    let (m, out) = sim.call(&[b"SET", b"k", b"v", b"PX", b"5000", b"NX"]);
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0, 2)));
    let (_, out) = sim.call(&[b"get", b"a"]);
    assert_eq!(reply(&out).payload, &b"$1\r\nb\r\n"[..]);
    let (_, out) = sim.call(&[b"KeyNotify", b"a", b"stop"]);
    assert_eq!(reply(&out).payload, &b":0\r\n"[..]);
    sim.finish();
}

#[test]
fn envelope_400s() {
    let mut sim = Sim::new(
        "envelope_400",
        "§4.3: missing correlation data or message expiry get 400 with __propName",
    );
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    m.correlation_data = None;
    let out = sim.send(&m);
    let r = reply(&out);
    assert_eq!(r.user_property("__stat"), Some("400"));
    assert_eq!(r.user_property("__propName"), Some("Correlation Data"));
    assert_eq!(r.correlation_data, None);
    assert_eq!(r.payload, &b""[..]);
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    m.message_expiry_interval = None;
    let out = sim.send(&m);
    let r = reply(&out);
    assert_eq!(r.user_property("__stat"), Some("400"));
    assert_eq!(r.user_property("__propName"), Some("Message Expiry"));
    assert_eq!(r.correlation_data.as_deref(), m.correlation_data.as_deref());
    assert_eq!(r.message_expiry_interval, None);
    // KEYNOTIFY with no identity at all.
    let mut m = sim.request(&[b"KEYNOTIFY", b"k"]);
    set_prop(&mut m, "__srcId", None);
    let out = sim.send(&m);
    assert_eq!(reply(&out).user_property("__stat"), Some("400"));
    assert_eq!(reply(&out).user_property("__propName"), Some("__srcId"));
    // QoS 0 and foreign topics are ignored.
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    m.qos = 0;
    assert!(sim.send(&m).is_empty());
    m.qos = 1;
    m.topic = "some/other/topic".into();
    assert!(sim.send(&m).is_empty());
    let (_, out) = sim.call(&[b"GET", b"k"]);
    assert_eq!(reply(&out).payload, &b"$-1\r\n"[..]);
    sim.finish();
}

/// What a request can make the dedup cache hold is bounded: correlation data
/// and response topics have a length limit, a reply is kept at most 5 minutes
/// (plus the 60 s buffer) whatever expiry the request asks for, and a payload
/// that is not a command is not cached.
#[test]
fn dedup_bounds() {
    let mut sim = Sim::new(
        "dedup_bounds",
        "correlation data over 256 bytes and response topics over 4096 bytes get 400; a dedup entry lives at most 5 min + 60 s; garbage payloads are not cached",
    );
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    m.correlation_data = Some(vec![7; 257]);
    let out = sim.send(&m);
    let r = reply(&out);
    assert_eq!(r.user_property("__stat"), Some("400"));
    assert_eq!(r.user_property("__propName"), Some("Correlation Data"));
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    m.response_topic = Some(format!("clients/c1/{}", "t".repeat(4096)));
    let out = sim.send(&m);
    let r = reply(&out);
    assert_eq!(r.user_property("__stat"), Some("400"));
    assert_eq!(r.user_property("__propName"), Some("Response Topic"));
    // Neither was executed nor cached.
    let (_, out) = sim.call(&[b"GET", b"k"]);
    assert_eq!(reply(&out).payload, &b"$-1\r\n"[..]);
    assert_eq!(sim.next_deadline(), None);
    // At the limits both are fine.
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    m.correlation_data = Some(vec![7; 256]);
    // The longest message expiry there is: the entry still goes in 6 min.
    m.message_expiry_interval = Some(u32::MAX);
    let out = sim.send(&m);
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    assert_eq!(sim.next_deadline(), Some(sim.now + 5 * 60_000 + 60_000));
    // A payload that is not a command gets its error and is not cached.
    sim.advance(6 * 60_000);
    assert_eq!(sim.next_deadline(), None);
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    m.payload = b"this is not RESP3".to_vec();
    let out = sim.send(&m);
    assert!(reply(&out).payload.starts_with(b"-ERR"));
    assert_eq!(sim.next_deadline(), None);
    sim.finish();
}

/// KEYNOTIFY registrations are bounded per client: past its share a
/// client gets the quota error, other clients and the owner's keys are
/// untouched, and a disconnect frees the share. Run in the component
/// too; not recorded as a vector (a thousand steps).
#[test]
fn keynotify_registrations_are_bounded() {
    for kind in [Kind::Native, Kind::Wasm] {
        let mut sim = Sim::with(kind, "keynotify_bounded", "not recorded");
        let (_, out) = sim.call(&[b"SET", b"owned", b"v"]);
        assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
        for i in 0..statestore_guest::notify::MAX_PER_CLIENT {
            let key = format!("k{i}");
            let m = sim.request_from("flood", &[b"KEYNOTIFY", key.as_bytes()]);
            assert_eq!(reply(&sim.send(&m)).payload, &b"+OK\r\n"[..], "{i}");
        }
        let m = sim.request_from("flood", &[b"KEYNOTIFY", b"one-more"]);
        assert_eq!(
            reply(&sim.send(&m)).payload,
            &b"-ERR the quota has been exceeded\r\n"[..]
        );
        let m = sim.request_from("other", &[b"KEYNOTIFY", b"owned"]);
        assert_eq!(reply(&sim.send(&m)).payload, &b"+OK\r\n"[..]);
        let (_, out) = sim.call(&[b"GET", b"owned"]);
        assert_eq!(reply(&out).payload, &b"$1\r\nv\r\n"[..]);
        sim.disconnect("flood");
        let m = sim.request_from("flood", &[b"KEYNOTIFY", b"one-more"]);
        assert_eq!(
            reply(&sim.send(&m)).payload,
            &b"+OK\r\n"[..],
            "freed by the disconnect"
        );
    }
}

#[test]
fn identity_and_disconnect() {
    let mut sim = Sim::new(
        "identity_disconnect",
        "§3.2, §11.1: identity from the broker beats __srcId; fallbacks; a disconnect drops registrations",
    );
    // A host inside the broker passes the real client id; __srcId is ignored.
    let mut m = sim.request(&[b"KEYNOTIFY", b"k"]);
    m.client_id = Some("real".into());
    set_prop(&mut m, "__srcId", Some("spoofed"));
    sim.send(&m);
    // Fallback to $partition when there is no __srcId (its response topic
    // names it: vector response_topic_claims).
    let mut m = sim.request_from("part", &[b"KEYNOTIFY", b"k"]);
    set_prop(&mut m, "__srcId", None);
    set_prop(&mut m, "$partition", Some("part"));
    sim.send(&m);
    let (_, out) = sim.call(&[b"SET", b"k", b"v"]);
    let targets: Vec<_> = notifications(&out)
        .iter()
        .map(|n| n.target_client.clone().unwrap_or_default())
        .collect();
    assert_eq!(targets, ["part", "real"]);
    assert!(sim.disconnect("real").is_empty());
    let (_, out) = sim.call(&[b"SET", b"k", b"w"]);
    assert_eq!(notifications(&out).len(), 1);
    assert_eq!(
        notifications(&out)[0].target_client.as_deref(),
        Some("part")
    );
    // Reconnecting does not bring registrations back.
    sim.disconnect("part");
    let (_, out) = sim.call(&[b"SET", b"k", b"x"]);
    assert!(notifications(&out).is_empty());
    sim.finish();
}

#[test]
fn two_observers_each_notified_in_order() {
    let mut sim = Sim::new(
        "two_observers",
        "§11.2: every observer gets every change, including the writer",
    );
    for c in ["c1", "c2"] {
        let m = sim.request_from(c, &[b"KEYNOTIFY", b"k"]);
        sim.send(&m);
    }
    let (_, out) = sim.call(&[b"SET", b"k", b"1"]);
    assert_eq!(out.len(), 3);
    assert!(matches!(&out[2], Output::Publish(m) if m.kind == PublishKind::Response));
    let t: Vec<_> = notifications(&out)
        .iter()
        .map(|n| n.target_client.clone().unwrap_or_default())
        .collect();
    assert_eq!(t, ["c1", "c2"]);
    sim.finish();
}

#[test]
fn binary_keys_and_values() {
    let mut sim = Sim::new(
        "binary_keys",
        "§5.1, §15: keys and values with NUL, CR, LF and invalid UTF-8",
    );
    let key: &[u8] = b"k\0\r\n\xff$*";
    let value: &[u8] = b"\r\n\0\xfe\r\n";
    sim.call(&[b"KEYNOTIFY", key]);
    let (_, out) = sim.call(&[b"SET", key, value]);
    let mut want = b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$6\r\n".to_vec();
    want.extend_from_slice(value);
    want.extend_from_slice(b"\r\n");
    assert_notification(notifications(&out)[0], "c1", key, &want, &version(T0, 2));
    let (m, out) = sim.call(&[b"GET", key]);
    let mut bulk = b"$6\r\n".to_vec();
    bulk.extend_from_slice(value);
    bulk.extend_from_slice(b"\r\n");
    assert_reply(&out, &m, &bulk, Some(&version(T0, 2)));
    assert_eq!(notifications(&out).len(), 0);
    sim.finish();
}

#[test]
fn snapshot_restore_keeps_everything() {
    let mut sim = Sim::new(
        "snapshot_restore",
        "§13.1, §11, §10 across a snapshot and restore: keys, versions, tokens, expiry, observers, dedup",
    );
    let ft = format!("{T0:015}:00000:lock");
    sim.call(&[b"KEYNOTIFY", b"k"]);
    let mut m = sim.request(&[b"SET", b"k", b"v", b"PX", b"5000"]);
    set_prop(&mut m, "__ft", Some(&ft));
    let first = sim.send(&m);
    sim.advance(10);
    sim.restore();
    // Dedup survives.
    let again = sim.send(&m);
    assert_eq!(reply(&again).payload, reply(&first).payload);
    assert_eq!(ts_of(reply(&again)), Some(version(T0, 2).as_str()));
    assert!(notifications(&again).is_empty());
    // The fencing token survives.
    let (_, out) = sim.call(&[b"SET", b"k", b"w"]);
    assert_eq!(reply(&out).payload, FT_REQUIRED);
    // The version and value survive.
    let (_, out) = sim.call(&[b"GET", b"k"]);
    assert_eq!(reply(&out).payload, &b"$1\r\nv\r\n"[..]);
    assert_eq!(ts_of(reply(&out)), Some(version(T0, 2).as_str()));
    // The clock survives: L is (T0+10, 2) after the two requests above, so a
    // write with an old __ts continues its counter.
    sim.now -= 10;
    let mut m = sim.request(&[b"SET", b"other", b"v"]);
    set_prop(&mut m, "__ts", Some("000000000000001:00000:c1"));
    let out = sim.send(&m);
    assert_eq!(ts_of(reply(&out)), Some(version(T0 + 10, 3).as_str()));
    sim.now += 10;
    // Expiry and the observer survive.
    let out = sim.advance(5000);
    assert_eq!(notifications(&out).len(), 1);
    sim.finish();
}

#[test]
fn large_keys_and_values_both_runtimes() {
    // Not recorded as a vector (megabytes of JSON); run on both runtimes here.
    for kind in [Kind::Native, Kind::Wasm] {
        let mut sim = Sim::with(kind, "large", "");
        let key = vec![0u8; 65_536];
        let value: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
        let (m, out) = sim.call(&[b"SET", &key, &value]);
        assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0, 1)));
        let (_, out) = sim.call(&[b"GET", &key]);
        let r = reply(&out);
        assert_eq!(r.payload.len(), value.len() + 12);
        assert_eq!(&r.payload[..10], &b"$1048576\r\n"[..]);
        assert_eq!(&r.payload[10..10 + value.len()], &value[..]);
        let (_, out) = sim.call(&[b"VDEL", &key, &value]);
        assert_eq!(reply(&out).payload, &b":1\r\n"[..]);
        // A KEYNOTIFY whose notification topic could never be published.
        let huge = vec![b'x'; 40_000];
        let (_, out) = sim.call(&[b"KEYNOTIFY", &huge]);
        assert_eq!(reply(&out).payload, &b"-ERR syntax error\r\n"[..]);
    }
}

#[test]
fn counter_overflow_moves_to_the_next_millisecond() {
    let mut sim = Sim::new(
        "counter_overflow",
        "§8.4: an HLC counter that would pass 2^31-2 moves the clock to the next ms (counter 0) instead of failing; a client's __ts 59 s ahead with a counter at the limit cannot make other clients' requests fail",
    );
    // The poisoning request: 59 s ahead (inside the skew limit), counter
    // one below the limit. It is served.
    let ahead = T0 + 59_000;
    let mut m = sim.request(&[b"SET", b"k", b"v"]);
    set_prop(&mut m, "__ts", Some(&format!("{ahead:015}:2147483645:c1")));
    let out = sim.send(&m);
    let r = reply(&out);
    assert_eq!(r.user_property("__stat"), Some("200"));
    assert_eq!(r.payload, &b"+OK\r\n"[..]);
    assert_eq!(ts_of(r), Some(version(ahead, 2147483646).as_str()));
    // Every other client's requests are still served, each version later
    // than the last, the clock a millisecond past the poisoned one.
    sim.advance(5);
    let mut m = sim.request_from("c2", &[b"SET", b"other", b"x"]);
    let out = sim.send(&m);
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    assert_eq!(ts_of(reply(&out)), Some(version(ahead + 1, 0).as_str()));
    m = sim.request_from("c2", &[b"DEL", b"k"]);
    let out = sim.send(&m);
    assert_eq!(reply(&out).payload, &b":1\r\n"[..]);
    assert_eq!(ts_of(reply(&out)), Some(version(ahead + 1, 1).as_str()));
    let (_, out) = sim.call(&[b"GET", b"other"]);
    assert_eq!(reply(&out).payload, &b"$1\r\nx\r\n"[..]);
    sim.finish();
}

/// Every journal record of an input comes before its first publish.
fn records_first(out: &[Output]) {
    let first_publish = out.iter().position(|o| matches!(o, Output::Publish(_)));
    let last_record = out.iter().rposition(|o| matches!(o, Output::Journal(_)));
    if let (Some(p), Some(r)) = (first_publish, last_record) {
        assert!(r < p, "journal records must precede publishes: {out:#?}");
    }
}

#[test]
fn journal_persist_all() {
    let config = statestore::Config {
        persist: statestore::Persist::All,
        ..test_config()
    };
    let mut sim = Sim::with_config(
        Kind::Native,
        "journal_all",
        "§5 durability: a record for every change (put, delete, expiry, dedup reply), before the publishes of its input",
        config.clone(),
    );
    let mut all = Vec::new();
    let mut step = |out: Vec<Output>, want: usize| {
        records_first(&out);
        assert_eq!(records(&out).len(), want, "{out:#?}");
        all.extend(records(&out));
    };
    step(sim.call(&[b"KEYNOTIFY", b"k"]).1, 1); // its dedup reply
    step(sim.call(&[b"SET", b"k", b"v", b"PX", b"1000"]).1, 2); // put + reply
    step(sim.call(&[b"GET", b"k"]).1, 0); // reads change nothing
    step(sim.call(&[b"SET", b"k", b"v", b"NX"]).1, 1); // not applied: only the reply
    let ft = format!("{T0:015}:00000:lock");
    let mut m = sim.request(&[b"SET", b"f", b"x"]);
    set_prop(&mut m, "__ft", Some(&ft));
    step(sim.send(&m), 2);
    step(sim.call(&[b"DEL", b"nothing"]).1, 1);
    step(sim.call(&[b"VDEL", b"f", b"x"]).1, 1); // fenced: an error reply only
    step(sim.advance(1000), 1); // the expiry
    let mut m = sim.request(&[b"SET", b"gone", b"soon"]);
    step(sim.send(&m), 2);
    m = sim.request(&[b"DEL", b"gone"]);
    step(sim.send(&m), 2); // delete + reply
    // Replaying the records rebuilds the same keys, versions and dedup replies.
    let mut rebuilt = statestore::NativeStore::new(config.clone()).expect("store");
    statestore::Backend::replay(&mut rebuilt, &all).expect("replay");
    for key in [&b"k"[..], b"f", b"gone", b"nothing"] {
        let mut probe = sim.request(&[b"GET", key]);
        set_prop(&mut probe, "__ts", None);
        let a = reply(&sim.send(&probe)).payload.clone();
        let b = statestore::Backend::handle_messages(
            &mut rebuilt,
            std::slice::from_ref(&probe),
            sim.now,
        )
        .expect("handle");
        assert_eq!(reply(&b).payload, a, "{}", String::from_utf8_lossy(key));
        assert_eq!(ts_of(reply(&b)), ts_of(reply(&sim.send(&probe))));
    }
    // A redelivered request after the "restart" gets its original reply.
    let out =
        statestore::Backend::handle_messages(&mut rebuilt, &[m], sim.now).expect("redelivery");
    assert_eq!(reply(&out).payload, &b":1\r\n"[..]);
    assert!(records(&out).is_empty());
    sim.finish();
}

#[test]
fn journal_persist_flagged() {
    let config = statestore::Config {
        persist: statestore::Persist::Flagged,
        ..test_config()
    };
    let mut sim = Sim::with_config(
        Kind::Native,
        "journal_flagged",
        "§5 durability, --persist flagged: only keys set with aio-persistence=true are journaled",
        config,
    );
    let flagged = |sim: &mut Sim, parts: &[&[u8]]| {
        let mut m = sim.request(parts);
        set_prop(&mut m, "aio-persistence", Some("true"));
        sim.send(&m)
    };
    let puts = |out: &[Output]| records(out).iter().filter(|r| r[1] == 1).count();
    let deletes = |out: &[Output]| records(out).iter().filter(|r| r[1] == 2).count();
    let out = sim.call(&[b"SET", b"plain", b"v"]).1;
    assert_eq!((puts(&out), deletes(&out)), (0, 0));
    let out = flagged(&mut sim, &[b"SET", b"kept", b"v"]);
    assert_eq!((puts(&out), deletes(&out)), (1, 0));
    // An unflagged SET over a persisted value journals its removal.
    let out = sim.call(&[b"SET", b"kept", b"w"]).1;
    assert_eq!((puts(&out), deletes(&out)), (0, 1));
    let out = sim.call(&[b"DEL", b"plain"]).1;
    assert_eq!((puts(&out), deletes(&out)), (0, 0));
    let out = flagged(&mut sim, &[b"SET", b"kept", b"x", b"PX", b"10"]);
    assert_eq!(puts(&out), 1);
    let out = sim.advance(10);
    assert_eq!(records(&out).len(), 1, "the expiry of a persisted key");
    sim.finish();
}

#[test]
fn s15_quota() {
    let config = statestore::Config {
        quota: statestore_guest::types::Quota {
            max_keys: Some(2),
            max_bytes: Some(20),
            max_key_bytes: Some(4),
            max_value_bytes: Some(8),
        },
        ..test_config()
    };
    let mut sim = Sim::with_config(
        Kind::Native,
        "s15_quota",
        "§15 quota: new keys beyond the key count or byte budget, over-long new keys and over-long values get -ERR the quota has been exceeded; updates of existing keys are allowed",
        config,
    );
    const QUOTA: &[u8] = b"-ERR the quota has been exceeded\r\n";
    let (m, out) = sim.call(&[b"SET", b"a", b"1"]);
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0, 1)));
    let (_, out) = sim.call(&[b"SET", b"bb", b"22"]);
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    // A third key: over max_keys (2). Nothing is stored, no version.
    let (m, out) = sim.call(&[b"SET", b"c", b"3"]);
    assert_reply(&out, &m, QUOTA, None);
    let (_, out) = sim.call(&[b"GET", b"c"]);
    assert_eq!(reply(&out).payload, &b"$-1\r\n"[..]);
    // Updating an existing key is allowed, up to max_value_bytes (8).
    sim.advance(1);
    let (_, out) = sim.call(&[b"SET", b"a", b"12345678"]);
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    let (m, out) = sim.call(&[b"SET", b"a", b"123456789"]);
    assert_reply(&out, &m, QUOTA, None);
    let (_, out) = sim.call(&[b"GET", b"a"]);
    assert_eq!(reply(&out).payload, &b"$8\r\n12345678\r\n"[..]);
    // A deletion makes room; a new key longer than max_key_bytes (4) is refused.
    let (_, out) = sim.call(&[b"DEL", b"bb"]);
    assert_eq!(reply(&out).payload, &b":1\r\n"[..]);
    let (m, out) = sim.call(&[b"SET", b"ccccc", b"1"]);
    assert_reply(&out, &m, QUOTA, None);
    // a (1 + 8) + c (1 + 8) = 18 bytes <= 20.
    let (_, out) = sim.call(&[b"SET", b"c", b"12345678"]);
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    let (_, out) = sim.call(&[b"DEL", b"c"]);
    assert_eq!(reply(&out).payload, &b":1\r\n"[..]);
    // a (9) + dddd (4 + 8) = 21 bytes > 20: the byte budget.
    let (m, out) = sim.call(&[b"SET", b"dddd", b"12345678"]);
    assert_reply(&out, &m, QUOTA, None);
    // NX on a new key over quota: the quota answers first (§5.4 step 8 before 10).
    let (m, out) = sim.call(&[b"SET", b"dddd", b"12345678", b"NX"]);
    assert_reply(&out, &m, QUOTA, None);
    sim.finish();
}

/// The config of the SCAN vectors that page: one key a page.
fn one_key_pages() -> statestore::Config {
    statestore::Config {
        scan_page: statestore::ScanPage {
            max_keys: 1,
            max_bytes: 1024,
        },
        ..test_config()
    }
}

#[test]
fn scan_pages_and_tokens() {
    let mut sim = Sim::with_config(
        Kind::Native,
        "scan_pages",
        "§12 SCAN: an empty store; one key a page over three keys with the tokens fed back; a token whose key was deleted; malformed tokens; no __ts",
        one_key_pages(),
    );
    let (m, out) = sim.call(&[b"SCAN", b"*"]);
    assert_reply(&out, &m, b"*1\r\n*0\r\n", None);
    for k in [&b"b1"[..], b"a2", b"a1"] {
        sim.call(&[b"SET", k, b"v"]);
    }
    let (m, out) = sim.call(&[b"SCAN", b"a*"]);
    assert_reply(&out, &m, b"*2\r\n*1\r\n$2\r\na1\r\n$6\r\n0;1;a1\r\n", None);
    let (m, out) = sim.call(&[b"SCAN", b"a*", b"0;1;a1"]);
    assert_reply(&out, &m, b"*2\r\n*1\r\n$2\r\na2\r\n$6\r\n0;1;a2\r\n", None);
    // b1 does not match: the page that looked at it is the last.
    let (m, out) = sim.call(&[b"SCAN", b"a*", b"0;1;a2"]);
    assert_reply(&out, &m, b"*1\r\n*0\r\n", None);
    // The whole store, page by page; a2 is deleted after the first page,
    // and the token naming it still resumes after it.
    let (_, out) = sim.call(&[b"SCAN", b"*"]);
    assert_eq!(
        reply(&out).payload,
        &b"*2\r\n*1\r\n$2\r\na1\r\n$6\r\n0;1;a1\r\n"[..]
    );
    let (_, out) = sim.call(&[b"SCAN", b"*", b"0;1;a1"]);
    assert_eq!(
        reply(&out).payload,
        &b"*2\r\n*1\r\n$2\r\na2\r\n$6\r\n0;1;a2\r\n"[..]
    );
    sim.call(&[b"DEL", b"a2"]);
    // b1 is the last key: its page is the last.
    let (m, out) = sim.call(&[b"SCAN", b"*", b"0;1;a2"]);
    assert_reply(&out, &m, b"*1\r\n*1\r\n$2\r\nb1\r\n", None);
    let (m, out) = sim.call(&[b"SCAN", b"*", b"0;1;b1"]);
    assert_reply(&out, &m, b"*1\r\n*0\r\n", None);
    // Any chain and topology numbers; a key that never existed.
    let (m, out) = sim.call(&[b"SCAN", b"*", b"12;345;a"]);
    assert_reply(&out, &m, b"*2\r\n*1\r\n$2\r\na1\r\n$6\r\n0;1;a1\r\n", None);
    for bad in [&b"a1"[..], b"0;a1", b"x;1;a1", b";1;a1", b"0;;a1", b""] {
        let (m, out) = sim.call(&[b"SCAN", b"*", bad]);
        assert_reply(&out, &m, b"-ERR the scan token is not valid\r\n", None);
    }
    let (m, out) = sim.call(&[b"SCAN"]);
    assert_reply(&out, &m, b"-ERR wrong number of arguments\r\n", None);
    let (m, out) = sim.call(&[b"SCAN", b"*", b"0;1;a", b"x"]);
    assert_reply(&out, &m, b"-ERR wrong number of arguments\r\n", None);
    sim.finish();
}

#[test]
fn scan_glob_rules() {
    let mut sim = Sim::new(
        "scan_glob",
        "§12 SCAN patterns, the glob crate's rules: * ? [abc] [a-z] [!abc], [^x] is not a negation, [*] [?] literal, no backslash escape, case-sensitive, * and ? match / and a leading dot; pattern errors; an empty pattern matches nothing",
    );
    let keys: &[&[u8]] = &[
        b"a1", b"a2", b"b1", b"b/c", b".hidden", b"*", b"?", b"x^y", b"A1", b"a\\1",
    ];
    for k in keys {
        sim.call(&[b"SET", k, b"v"]);
    }
    let list = |keys: &[&[u8]]| {
        let mut want = format!("*1\r\n*{}\r\n", keys.len()).into_bytes();
        for k in keys {
            want.extend_from_slice(format!("${}\r\n", k.len()).as_bytes());
            want.extend_from_slice(k);
            want.extend_from_slice(b"\r\n");
        }
        want
    };
    let cases: &[(&[u8], &[&[u8]])] = &[
        (
            b"*",
            &[
                b"*", b".hidden", b"?", b"A1", b"a1", b"a2", b"a\\1", b"b/c", b"b1", b"x^y",
            ],
        ),
        (b"?1", &[b"A1", b"a1", b"b1"]),
        (b"[ab]1", &[b"a1", b"b1"]),
        (b"[a-b]?", &[b"a1", b"a2", b"b1"]),
        (b"[!a]?", &[b"A1", b"b1"]),
        (b"[^a]?", &[b"a1", b"a2"]),
        (b"x[^]y", &[b"x^y"]),
        (b"[*]", &[b"*"]),
        (b"[?]", &[b"?"]),
        (b"?", &[b"*", b"?"]),
        (b"b?c", &[b"b/c"]),
        (b"*c", &[b"b/c"]),
        (b"*hidden", &[b".hidden"]),
        (b"a\\1", &[b"a\\1"]),
        (b"A*", &[b"A1"]),
        (b"**/c", &[b"b/c"]),
        (b"a1", &[b"a1"]),
        (b"", &[]),
    ];
    for (pattern, want) in cases {
        let (m, out) = sim.call(&[b"SCAN", pattern]);
        assert_reply(&out, &m, &list(want), None);
    }
    for (bad, why) in [
        (
            &b"***"[..],
            "wildcards are either regular `*` or recursive `**` (near character 2)",
        ),
        (
            b"a**",
            "recursive wildcards must form a single path component (near character 0)",
        ),
        (b"[ab", "invalid range pattern (near character 0)"),
    ] {
        let (m, out) = sim.call(&[b"SCAN", bad]);
        let want = format!("-ERR the pattern is not valid: {why}\r\n");
        assert_reply(&out, &m, want.as_bytes(), None);
    }
    sim.finish();
}

#[test]
fn scan_skips_non_utf8_and_expired_keys() {
    let mut sim = Sim::new(
        "scan_utf8_expiry",
        "§12 SCAN: keys that are not UTF-8 are never returned, a pattern that is not UTF-8 matches nothing, expired keys are not returned (before and after the timer)",
    );
    sim.call(&[b"SET", b"k\xff", b"v"]);
    sim.call(&[b"SET", b"k1", b"v"]);
    sim.call(&[b"SET", b"k2", b"v", b"PX", b"100"]);
    let (m, out) = sim.call(&[b"SCAN", b"k*"]);
    assert_reply(&out, &m, b"*1\r\n*2\r\n$2\r\nk1\r\n$2\r\nk2\r\n", None);
    let (m, out) = sim.call(&[b"SCAN", b"k\xff"]);
    assert_reply(&out, &m, b"*1\r\n*0\r\n", None);
    sim.now += 100; // due, the timer not yet run
    let (m, out) = sim.call(&[b"SCAN", b"k*"]);
    assert_reply(&out, &m, b"*1\r\n*1\r\n$2\r\nk1\r\n", None);
    sim.advance(1);
    let (m, out) = sim.call(&[b"SCAN", b"k*"]);
    assert_reply(&out, &m, b"*1\r\n*1\r\n$2\r\nk1\r\n", None);
    sim.finish();
}

#[test]
fn journal_persist_custom() {
    let config = statestore::Config {
        persist: statestore::Persist::Custom,
        persist_keys: vec![
            statestore::KeyMatch::Pattern("sensors/*".into()),
            statestore::KeyMatch::Exact(b"config".to_vec()),
            statestore::KeyMatch::Exact(b"\x00\x01".to_vec()),
        ],
        ..test_config()
    };
    let mut sim = Sim::with_config(
        Kind::Native,
        "journal_custom",
        "--persist custom: keys that match a persist-keys pattern or exact key when set, or carry aio-persistence: true, are journaled; others are not",
        config,
    );
    let puts = |out: &[Output]| records(out).iter().filter(|r| r[1] == 1).count();
    let deletes = |out: &[Output]| records(out).iter().filter(|r| r[1] == 2).count();
    for (key, want) in [
        (&b"sensors/t1"[..], 1),
        (b"config", 1),
        (b"\x00\x01", 1),
        (b"configx", 0),
        (b"other", 0),
    ] {
        let out = sim.call(&[b"SET", key, b"v"]).1;
        assert_eq!(puts(&out), want, "{key:?}");
    }
    let mut m = sim.request(&[b"SET", b"flagged", b"v"]);
    set_prop(&mut m, "aio-persistence", Some("true"));
    assert_eq!(puts(&sim.send(&m)), 1);
    let out = sim.call(&[b"DEL", b"sensors/t1"]).1;
    assert_eq!(deletes(&out), 1);
    let out = sim.call(&[b"DEL", b"other"]).1;
    assert_eq!((puts(&out), deletes(&out)), (0, 0));
    sim.finish();
}

/// A request not answered: no publish at all, and a violation naming no
/// client for the host to log and count.
fn assert_ignored(out: &[Output]) {
    assert!(
        matches!(out, [Output::Violation { client_id: None, reason }] if reason.contains("not answered")),
        "{out:?}"
    );
}

#[test]
fn response_topic_must_name_its_requester() {
    let mut sim = Sim::new(
        "response_topic_claims",
        "without a broker-supplied client id, a request whose response topic has the SDKs' shape clients/<id>/... must name its own requester (__srcId, or $partition / __invId) there, as is or in upper-case hex (Go); otherwise it is not answered (nothing is published to a topic that is not the requester's; the host is told with a violation naming no client). Topics of another shape make no claim; a broker-supplied id is trusted",
    );
    // The victim observes a key.
    let m = sim.request_from("victim", &[b"KEYNOTIFY", b"k"]);
    assert_eq!(reply(&sim.send(&m)).payload, &b"+OK\r\n"[..]);
    // c1 claims to be the victim while receiving its replies at its own
    // topic; or through $partition, with no __srcId: not answered.
    for partition in [false, true] {
        let mut m = sim.request_from("c1", &[b"KEYNOTIFY", b"k", b"STOP"]);
        if partition {
            set_prop(&mut m, "__srcId", None);
            set_prop(&mut m, "$partition", Some("victim"));
        } else {
            set_prop(&mut m, "__srcId", Some("victim"));
        }
        assert_ignored(&sim.send(&m));
    }
    // The victim is still notified.
    let (_, out) = sim.call(&[b"SET", b"k", b"v"]);
    assert_eq!(notifications(&out).len(), 1);
    // Go's topics name the client in upper-case hex: "c1" is 6331.
    let mut m = sim.request_from("c1", &[b"GET", b"k"]);
    m.response_topic = Some(
        "clients/6331/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response"
            .into(),
    );
    let out = sim.send(&m);
    assert_eq!(reply(&out).payload, &b"$1\r\nv\r\n"[..]);
    assert_eq!(Some(&*reply(&out).topic), m.response_topic.as_deref());
    // A topic of another shape makes no claim (allowed unless
    // sdk_response_topics, vector sdk_response_topics).
    let mut m = sim.request_from("c1", &[b"GET", b"k"]);
    m.response_topic = Some("inbox/c1".into());
    assert_eq!(reply(&sim.send(&m)).payload, &b"$1\r\nv\r\n"[..]);
    // A broker-supplied client id is the identity: __srcId is not compared.
    let mut m = sim.request_from("c1", &[b"GET", b"k"]);
    m.client_id = Some("c1".into());
    set_prop(&mut m, "__srcId", Some("someone-else"));
    assert_eq!(reply(&sim.send(&m)).payload, &b"$1\r\nv\r\n"[..]);
    sim.finish();
}

#[test]
fn sdk_response_topics_only() {
    let config = statestore::Config {
        sdk_response_topics: true,
        ..test_config()
    };
    let mut sim = Sim::with_config(
        Kind::Native,
        "sdk_response_topics",
        "--response-topics sdk: only clients/<requester>/... response topics are answered; without a broker-supplied client id, others and requests with no identity are not answered (nothing is published to a topic that is not the requester's; the host is told); with one, they get -ERR not authorized (delivered to that client alone)",
        config,
    );
    const DENIED: &[u8] = b"-ERR not authorized\r\n";
    let (m, out) = sim.call(&[b"SET", b"k", b"v"]);
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0, 1)));
    let mut m = sim.request(&[b"GET", b"k"]);
    m.response_topic = Some("protected/billing/commands".into());
    assert_ignored(&sim.send(&m));
    let mut m = sim.request(&[b"GET", b"k"]);
    set_prop(&mut m, "__srcId", None);
    assert_ignored(&sim.send(&m));
    // With a broker-supplied id too: the topic must be that client's.
    let mut m = sim.request(&[b"GET", b"k"]);
    m.client_id = Some("c2".into());
    let out = sim.send(&m);
    assert_reply(&out, &m, DENIED, None);
    let mut m = sim.request(&[b"GET", b"k"]);
    m.client_id = Some("c1".into());
    assert_eq!(reply(&sim.send(&m)).payload, &b"$1\r\nv\r\n"[..]);
    sim.finish();
}

/// Per-key authorization: a rule's principals (client ids, user names,
/// attribute sets) get Read, Write or ReadWrite on keys by pattern, exact
/// text or binary, with `{principal.*}` substitutions; a request no rule
/// allows gets `-ERR not authorized`, and SCAN lists only what its
/// requester may read.
#[test]
fn authorization_rules() {
    use statestore_guest::types::{AuthRule, KeyGrant, KeyMethod, KeySpec, Principals};
    let grant = |method, keys: Vec<KeySpec>| KeyGrant { method, keys };
    let config = statestore::Config {
        authorization: Some(vec![
            AuthRule {
                principals: Principals {
                    client_ids: vec!["c1".into()],
                    usernames: vec!["alice".into()],
                    attributes: vec![vec![
                        ("city".into(), "seattle".into()),
                        ("org".into(), "contoso".into()),
                    ]],
                },
                grants: vec![
                    grant(KeyMethod::Read, vec![KeySpec::Pattern("shared/*".into())]),
                    grant(
                        KeyMethod::ReadWrite,
                        vec![
                            KeySpec::Pattern("own/{principal.clientId}/*".into()),
                            KeySpec::Text("org-{principal.attributes.org}".into()),
                            KeySpec::Binary(vec![0x00, 0xff]),
                        ],
                    ),
                ],
            },
            AuthRule {
                principals: Principals {
                    client_ids: vec!["writer".into()],
                    ..Principals::default()
                },
                grants: vec![grant(
                    KeyMethod::Write,
                    vec![KeySpec::Pattern("shared/*".into())],
                )],
            },
        ]),
        ..test_config()
    };
    let mut sim = Sim::with_config(
        Kind::Native,
        "authorization",
        "per-key authorization: principals by client id, user name and attributes; Read, Write, ReadWrite on patterns, text and binary keys with {principal.*} substitutions; denied requests get -ERR not authorized and SCAN lists only readable keys",
        config,
    );
    const DENIED: &[u8] = b"-ERR not authorized\r\n";
    let send = |sim: &mut Sim,
                client: &str,
                user: Option<&str>,
                attrs: &[(&str, &str)],
                parts: &[&[u8]]| {
        let mut m = sim.request_from(client, parts);
        m.client_id = Some(client.into());
        m.username = user.map(str::to_string);
        m.attributes = attrs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        let out = sim.send(&m);
        (m, out)
    };
    // The writer may write shared/*, not read it.
    let (m, out) = send(&mut sim, "writer", None, &[], &[b"SET", b"shared/a", b"1"]);
    assert_reply(&out, &m, b"+OK\r\n", Some(&version(T0, 1)));
    let (m, out) = send(&mut sim, "writer", None, &[], &[b"GET", b"shared/a"]);
    assert_reply(&out, &m, DENIED, None);
    // c1 (by client id) reads shared/*, may not write it.
    let (_, out) = send(&mut sim, "c1", None, &[], &[b"GET", b"shared/a"]);
    assert_eq!(reply(&out).payload, &b"$1\r\n1\r\n"[..]);
    let (m, out) = send(&mut sim, "c1", None, &[], &[b"DEL", b"shared/a"]);
    assert_reply(&out, &m, DENIED, None);
    // Its own space, by substitution; another's is not its.
    let (_, out) = send(&mut sim, "c1", None, &[], &[b"SET", b"own/c1/x", b"v"]);
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    let (m, out) = send(&mut sim, "c1", None, &[], &[b"SET", b"own/c2/x", b"v"]);
    assert_reply(&out, &m, DENIED, None);
    // A client id with glob characters matches itself only.
    let (m, out) = send(
        &mut sim,
        "c*",
        Some("alice"),
        &[],
        &[b"SET", b"own/c1/y", b"v"],
    );
    assert_reply(&out, &m, DENIED, None);
    let (_, out) = send(
        &mut sim,
        "c*",
        Some("alice"),
        &[],
        &[b"SET", b"own/c*/y", b"v"],
    );
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    // By attributes (all of a set), with an attribute substituted.
    let both = [("org", "contoso"), ("city", "seattle")];
    let (_, out) = send(
        &mut sim,
        "dev9",
        None,
        &both,
        &[b"SET", b"org-contoso", b"v"],
    );
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    let (m, out) = send(
        &mut sim,
        "dev9",
        None,
        &[("org", "contoso")],
        &[b"GET", b"org-contoso"],
    );
    assert_reply(&out, &m, DENIED, None);
    // Alice has no org attribute: the org key is not hers.
    let (m, out) = send(
        &mut sim,
        "u1",
        Some("alice"),
        &[],
        &[b"GET", b"org-contoso"],
    );
    assert_reply(&out, &m, DENIED, None);
    // A binary key.
    let (_, out) = send(
        &mut sim,
        "u1",
        Some("alice"),
        &[],
        &[b"SET", b"\x00\xff", b"b"],
    );
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    let (m, out) = send(
        &mut sim,
        "u1",
        Some("alice"),
        &[],
        &[b"SET", b"\x00\xfe", b"b"],
    );
    assert_reply(&out, &m, DENIED, None);
    // KEYNOTIFY is a read.
    let (_, out) = send(&mut sim, "c1", None, &[], &[b"KEYNOTIFY", b"shared/a"]);
    assert_eq!(reply(&out).payload, &b"+OK\r\n"[..]);
    let (m, out) = send(&mut sim, "writer", None, &[], &[b"KEYNOTIFY", b"shared/a"]);
    assert_reply(&out, &m, DENIED, None);
    // Nobody's principal: nothing.
    let (m, out) = send(
        &mut sim,
        "stranger",
        Some("bob"),
        &[],
        &[b"GET", b"shared/a"],
    );
    assert_reply(&out, &m, DENIED, None);
    // SCAN lists only what its requester may read.
    let (_, out) = send(&mut sim, "c1", None, &[], &[b"SCAN", b"*"]);
    assert_eq!(
        reply(&out).payload,
        &b"*1\r\n*2\r\n$8\r\nown/c1/x\r\n$8\r\nshared/a\r\n"[..]
    );
    let (_, out) = send(&mut sim, "stranger", None, &[], &[b"SCAN", b"*"]);
    assert_eq!(reply(&out).payload, &b"*1\r\n*0\r\n"[..]);
    sim.finish();
}

/// WIT 0.6.0 (a replicated store): a KEYNOTIFY registration remembers the
/// replica (and life) its request came through, the newest one when made
/// again; a disconnect reported by a replica drops only what was
/// registered through it, and a replica's new life drops what its earlier
/// lives' clients registered.
#[test]
fn keynotify_registrations_follow_their_replica() {
    let mut sim = Sim::new(
        "keynotify_via",
        "WIT 0.6.0 via: disconnected-via drops only what came through that replica (and life); replica-started drops earlier lives' registrations",
    );
    let r1 = Via {
        replica: 1,
        started: T0 - 10_000,
    };
    let r2 = Via {
        replica: 2,
        started: T0 - 5_000,
    };
    let r3 = Via {
        replica: 3,
        started: T0 - 1_000,
    };
    let through = |sim: &mut Sim, client: &str, via: Via, parts: &[&[u8]]| {
        let mut m = sim.request_from(client, parts);
        m.via = Some(via);
        let out = sim.send(&m);
        (m, out)
    };
    // c1 observes k through replica 1, then again through replica 2 (it
    // moved): the registration is replica 2's now.
    let (m, out) = through(&mut sim, "c1", r1, &[b"KEYNOTIFY", b"k"]);
    assert_reply(&out, &m, b"+OK\r\n", None);
    let (m, out) = through(&mut sim, "c1", r2, &[b"KEYNOTIFY", b"k"]);
    assert_reply(&out, &m, b"+OK\r\n", None);
    // c2 observes j through replica 3.
    let (m, out) = through(&mut sim, "c2", r3, &[b"KEYNOTIFY", b"j"]);
    assert_reply(&out, &m, b"+OK\r\n", None);
    // Replica 1's late report of c1's disconnect: nothing of c1's came
    // through replica 1 any more.
    assert!(sim.disconnect_via("c1", r1).is_empty());
    let (_, out) = through(&mut sim, "c3", r1, &[b"SET", b"k", b"v"]);
    assert_eq!(
        notifications(&out).len(),
        1,
        "c1 still observes k: {out:#?}"
    );
    // Replica 3 starts again: c2's registration died with its old life.
    assert!(
        sim.replica_started(Via {
            replica: 3,
            started: T0 + 1,
        })
        .is_empty()
    );
    let (_, out) = through(&mut sim, "c3", r1, &[b"SET", b"j", b"v"]);
    assert!(notifications(&out).is_empty(), "{out:#?}");
    // Replica 2 reports c1 gone: its registration goes.
    assert!(sim.disconnect_via("c1", r2).is_empty());
    let (_, out) = through(&mut sim, "c3", r1, &[b"SET", b"k", b"w"]);
    assert!(notifications(&out).is_empty(), "{out:#?}");
    // A snapshot keeps each registration's via.
    let (m, out) = through(&mut sim, "c1", r2, &[b"KEYNOTIFY", b"k"]);
    assert_reply(&out, &m, b"+OK\r\n", None);
    sim.restore();
    assert!(sim.disconnect_via("c1", r1).is_empty());
    let (_, out) = through(&mut sim, "c3", r1, &[b"SET", b"k", b"x"]);
    assert_eq!(notifications(&out).len(), 1, "{out:#?}");
    assert!(sim.disconnect_via("c1", r2).is_empty());
    let (_, out) = through(&mut sim, "c3", r1, &[b"SET", b"k", b"y"]);
    assert!(notifications(&out).is_empty(), "{out:#?}");
    sim.finish();
}
