//! The SDK scenarios: the unmodified Azure IoT Operations Rust SDK
//! (crates.io `azure_iot_operations_services` with its state store and
//! leased lock clients) against a store whose clients connect to
//! `127.0.0.1:port`, each scenario on a store of its own (fresh: no keys).
//! `tests/sdk_interop.rs` runs every one against one process in both
//! modes, `host/tests/cluster.rs` against a follower and the leader of a
//! cluster.

use std::time::{Duration, Instant, SystemTime};

use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
use azure_iot_operations_services::leased_lock::{self, lease, lock};
use azure_iot_operations_services::state_store::{
    self, ErrorKind, Operation, ServiceError, SetCondition, SetOptions,
};

use crate::sdk::Sdk;

/// Every scenario's request timeout.
pub const T: Duration = Duration::from_secs(5);

/// Lists every scenario, for `$m!(name, ...)`: a test file makes its tests
/// from it.
#[macro_export]
macro_rules! sdk_scenarios {
    ($m:ident) => {
        $m!(
            set_get_del_vdel_with_conditions_and_expiry,
            fencing_tokens,
            observe_set_delete_and_expiry_notifications,
            leased_lock_acquire_renew_expire_and_takeover,
            binary_long_keys_and_mib_values,
            cli_and_sdk_read_each_other,
            list_keys_exactly_once_under_writes,
        );
    };
}

fn opts(set_condition: SetCondition, expires: Option<Duration>) -> SetOptions {
    SetOptions {
        set_condition,
        expires,
        ..Default::default()
    }
}

/// The next notification of an observation, within the request timeout.
pub async fn next(obs: &mut state_store::KeyObservation) -> state_store::KeyNotification {
    tokio::time::timeout(T, obs.recv_notification())
        .await
        .expect("a notification in time")
        .expect("observation open")
        .0
}

fn service_error(e: &state_store::Error) -> &ServiceError {
    match e.kind() {
        ErrorKind::ServiceError(s) => s,
        other => panic!("expected a service error, got {other:?}"),
    }
}

/// `a` strictly before `b` in HLC order.
fn older(a: &HybridLogicalClock, b: &HybridLogicalClock) -> bool {
    (a.timestamp, a.counter) < (b.timestamp, b.counter)
}

/// SET with NX and NEX, GET (hit, miss), VDEL, DEL, PX expiry, an empty
/// value: the replies, their versions, and the HLC order of versions.
pub async fn set_get_del_vdel_with_conditions_and_expiry(port: u16) {
    let a = Sdk::connect(port, "sdk-crud").await;
    let ss = &a.ss;
    let r = ss
        .set(
            b"k1".to_vec(),
            b"v1".to_vec(),
            T,
            None,
            opts(SetCondition::OnlyIfDoesNotExist, None),
        )
        .await
        .expect("set nx");
    assert!(r.response);
    let v1 = r.version.expect("a SET reply carries the version");
    let r = ss
        .set(
            b"k1".to_vec(),
            b"v2".to_vec(),
            T,
            None,
            opts(SetCondition::OnlyIfDoesNotExist, None),
        )
        .await
        .expect("set nx again");
    assert!(!r.response);
    assert_eq!(
        r.version.as_ref().map(|v| v.to_string()),
        Some(v1.to_string()),
        "not-applied carries the stored version"
    );
    let r = ss
        .set(
            b"k1".to_vec(),
            b"v1".to_vec(),
            T,
            None,
            opts(SetCondition::OnlyIfEqualOrDoesNotExist, None),
        )
        .await
        .expect("nex equal");
    assert!(r.response);
    let v2 = r.version.expect("version");
    assert!(older(&v1, &v2));
    assert_eq!(v1.node_id, v2.node_id);
    let r = ss
        .set(
            b"k1".to_vec(),
            b"zz".to_vec(),
            T,
            None,
            opts(SetCondition::OnlyIfEqualOrDoesNotExist, None),
        )
        .await
        .expect("nex different");
    assert!(!r.response);
    let r = ss
        .set(
            b"fresh".to_vec(),
            b"x".to_vec(),
            T,
            None,
            opts(SetCondition::OnlyIfEqualOrDoesNotExist, None),
        )
        .await
        .expect("nex absent");
    assert!(r.response);
    let g = ss.get(b"k1".to_vec(), T).await.expect("get");
    assert_eq!(g.response, Some(b"v1".to_vec()));
    assert_eq!(g.version.map(|v| v.to_string()), Some(v2.to_string()));
    let miss = ss.get(b"nothing".to_vec(), T).await.expect("get miss");
    assert_eq!(miss.response, None);
    assert!(miss.version.is_none(), "a miss has no version");
    assert_eq!(
        ss.vdel(b"k1".to_vec(), b"other".to_vec(), None, T)
            .await
            .expect("vdel")
            .response,
        -1
    );
    assert_eq!(
        ss.vdel(b"k1".to_vec(), b"v1".to_vec(), None, T)
            .await
            .expect("vdel")
            .response,
        1
    );
    assert_eq!(
        ss.vdel(b"k1".to_vec(), b"v1".to_vec(), None, T)
            .await
            .expect("vdel")
            .response,
        0
    );
    assert_eq!(
        ss.del(b"fresh".to_vec(), None, T)
            .await
            .expect("del")
            .response,
        1
    );
    assert_eq!(
        ss.del(b"fresh".to_vec(), None, T)
            .await
            .expect("del")
            .response,
        0
    );
    // PX: gone after it expires.
    let r = ss
        .set(
            b"px".to_vec(),
            b"v".to_vec(),
            T,
            None,
            opts(
                SetCondition::Unconditional,
                Some(Duration::from_millis(700)),
            ),
        )
        .await
        .expect("set px");
    assert!(r.response);
    assert_eq!(
        ss.get(b"px".to_vec(), T).await.expect("get").response,
        Some(b"v".to_vec())
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let gone = ss.get(b"px".to_vec(), T).await.expect("get");
    assert_eq!(gone.response, None);
    assert!(gone.version.is_none());
    // Empty keys never leave the SDK; an empty value is fine.
    assert!(
        ss.set(
            b"empty".to_vec(),
            Vec::new(),
            T,
            None,
            SetOptions::default()
        )
        .await
        .expect("set empty")
        .response
    );
    assert_eq!(
        ss.get(b"empty".to_vec(), T).await.expect("get").response,
        Some(Vec::new())
    );
    a.close().await;
}

/// Fencing tokens: a SET or DEL with an older token than the key's is
/// refused, a newer one accepted.
pub async fn fencing_tokens(port: u16) {
    let a = Sdk::connect(port, "sdk-fence").await;
    let ss = &a.ss;
    let ft = HybridLogicalClock::new();
    let r = ss
        .set(
            b"fk".to_vec(),
            b"x".to_vec(),
            T,
            Some(ft.clone()),
            SetOptions::default(),
        )
        .await
        .expect("fenced set");
    assert!(r.response);
    let e = ss
        .set(
            b"fk".to_vec(),
            b"y".to_vec(),
            T,
            None,
            SetOptions::default(),
        )
        .await
        .expect_err("no token");
    assert!(
        matches!(service_error(&e), ServiceError::MissingFencingToken),
        "{e:?}"
    );
    let mut stale = ft.clone();
    stale.timestamp = SystemTime::now() - Duration::from_secs(3600);
    let e = ss
        .set(
            b"fk".to_vec(),
            b"y".to_vec(),
            T,
            Some(stale.clone()),
            SetOptions::default(),
        )
        .await
        .expect_err("stale token");
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "{e:?}"
    );
    let e = ss
        .del(b"fk".to_vec(), Some(stale), T)
        .await
        .expect_err("stale token on del");
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "{e:?}"
    );
    let e = ss
        .vdel(b"fk".to_vec(), b"x".to_vec(), None, T)
        .await
        .expect_err("no token on vdel");
    assert!(
        matches!(service_error(&e), ServiceError::MissingFencingToken),
        "{e:?}"
    );
    // The token the store returned is newer than the one it holds: accepted.
    let newer = r.version.expect("version");
    let r = ss
        .set(
            b"fk".to_vec(),
            b"y".to_vec(),
            T,
            Some(newer.clone()),
            SetOptions::default(),
        )
        .await
        .expect("newer token");
    assert!(r.response);
    assert_eq!(
        ss.get(b"fk".to_vec(), T).await.expect("get").response,
        Some(b"y".to_vec())
    );
    assert_eq!(
        ss.del(b"fk".to_vec(), Some(newer), T)
            .await
            .expect("del")
            .response,
        1
    );
    // A token far in the future is refused even on a new key.
    let mut future = HybridLogicalClock::new();
    future.timestamp = SystemTime::now() + Duration::from_secs(10 * 365 * 86_400);
    let e = ss
        .set(
            b"new".to_vec(),
            b"v".to_vec(),
            T,
            Some(future),
            SetOptions::default(),
        )
        .await
        .expect_err("skewed token");
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenSkew),
        "{e:?}"
    );
    a.close().await;
}

/// KEYNOTIFY through the SDK's observe: SET, DEL and expiry notifications
/// with their versions, and none after unobserve.
pub async fn observe_set_delete_and_expiry_notifications(port: u16) {
    let a = Sdk::connect(port, "sdk-writer").await;
    let b = Sdk::connect(port, "sdk-observer").await;
    let mut obs =
        b.ss.observe(b"watched".to_vec(), T)
            .await
            .expect("observe")
            .response;
    let r =
        a.ss.set(
            b"watched".to_vec(),
            b"v1".to_vec(),
            T,
            None,
            SetOptions::default(),
        )
        .await
        .expect("set");
    let n = next(&mut obs).await;
    assert_eq!(n.key, b"watched".to_vec());
    assert_eq!(n.operation, Operation::Set(b"v1".to_vec()));
    assert_eq!(
        n.version.to_string(),
        r.version.expect("version").to_string()
    );
    assert_eq!(
        a.ss.del(b"watched".to_vec(), None, T)
            .await
            .expect("del")
            .response,
        1
    );
    assert_eq!(next(&mut obs).await.operation, Operation::Del);
    // Expiry: a SET notification, then a DELETE when the key expires.
    let started = Instant::now();
    a.ss.set(
        b"watched".to_vec(),
        b"tmp".to_vec(),
        T,
        None,
        opts(SetCondition::Unconditional, Some(Duration::from_secs(1))),
    )
    .await
    .expect("set px");
    assert_eq!(
        next(&mut obs).await.operation,
        Operation::Set(b"tmp".to_vec())
    );
    assert_eq!(next(&mut obs).await.operation, Operation::Del);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "expiry after {took:?}"
    );
    // The writer observing too: both get every change.
    let mut own =
        a.ss.observe(b"watched".to_vec(), T)
            .await
            .expect("observe")
            .response;
    a.ss.set(
        b"watched".to_vec(),
        b"both".to_vec(),
        T,
        None,
        SetOptions::default(),
    )
    .await
    .expect("set");
    assert_eq!(
        next(&mut obs).await.operation,
        Operation::Set(b"both".to_vec())
    );
    assert_eq!(
        next(&mut own).await.operation,
        Operation::Set(b"both".to_vec())
    );
    assert!(
        b.ss.unobserve(b"watched".to_vec(), T)
            .await
            .expect("unobserve")
            .response
    );
    assert!(
        !b.ss
            .unobserve(b"watched".to_vec(), T)
            .await
            .expect("unobserve again")
            .response
    );
    a.ss.set(
        b"watched".to_vec(),
        b"after".to_vec(),
        T,
        None,
        SetOptions::default(),
    )
    .await
    .expect("set");
    assert_eq!(
        next(&mut own).await.operation,
        Operation::Set(b"after".to_vec())
    );
    let late = tokio::time::timeout(Duration::from_millis(700), obs.recv_notification()).await;
    assert!(
        !matches!(late, Ok(Some(_))),
        "no notification after unobserve"
    );
    a.close().await;
    b.close().await;
}

/// The SDK's leased lock: acquire, renew, expire, and another holder
/// taking over.
pub async fn leased_lock_acquire_renew_expire_and_takeover(port: u16) {
    let a = Sdk::connect(port, "sdk-lease-a").await;
    let b = Sdk::connect(port, "sdk-lease-b").await;
    let la = lease::Client::new(a.ss.clone(), b"L".to_vec(), a.id.clone().into_bytes())
        .expect("lease a");
    let lb = lease::Client::new(b.ss.clone(), b"L".to_vec(), b.id.clone().into_bytes())
        .expect("lease b");
    // Acquire with auto-renewal: still held well past the lease duration.
    let t1 = la
        .acquire(
            Duration::from_millis(1500),
            T,
            Some(Duration::from_millis(500)),
        )
        .await
        .expect("acquire");
    let e = lb
        .acquire(Duration::from_secs(5), T, None)
        .await
        .expect_err("held by a");
    assert!(
        matches!(e.kind(), leased_lock::ErrorKind::LeaseAlreadyHeld),
        "{e:?}"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        lb.get_holder(T).await.expect("holder"),
        Some(a.id.clone().into_bytes())
    );
    let renewed = la.current_lease_fencing_token().expect("token");
    assert!(
        older(&t1, &renewed),
        "renewal gives a newer token: {t1} then {renewed}"
    );
    assert_eq!(t1.node_id, renewed.node_id);
    la.release(T).await.expect("release");
    assert_eq!(lb.get_holder(T).await.expect("holder"), None);
    // Without renewal the lease is lost on expiry, and a blocked locker takes it.
    let t2 = la
        .acquire(Duration::from_secs(2), T, None)
        .await
        .expect("acquire again");
    let lkb =
        lock::Client::new(b.ss.clone(), b"L".to_vec(), b.id.clone().into_bytes()).expect("lock b");
    let started = Instant::now();
    let waiter = tokio::spawn(async move { lkb.lock(Duration::from_secs(10), T, None).await });
    let tb = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("b gets the lock after a's lease expires")
        .expect("join")
        .expect("lock");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "b must wait for the expiry, waited {waited:?}"
    );
    assert!(older(&t2, &tb));
    assert_eq!(
        lb.get_holder(T).await.expect("holder"),
        Some(b.id.clone().into_bytes())
    );
    // The new holder's token fences the old holder out of a protected key.
    assert!(
        b.ss.set(
            b"guarded".to_vec(),
            b"by-b".to_vec(),
            T,
            Some(tb),
            SetOptions::default()
        )
        .await
        .expect("set")
        .response
    );
    let e =
        a.ss.set(
            b"guarded".to_vec(),
            b"by-a".to_vec(),
            T,
            Some(t2),
            SetOptions::default(),
        )
        .await
        .expect_err("stale holder");
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "{e:?}"
    );
    a.close().await;
    b.close().await;
}

/// Binary keys, long keys and values of a MiB, through the SDK.
pub async fn binary_long_keys_and_mib_values(port: u16) {
    let a = Sdk::connect(port, "sdk-binary").await;
    let cases: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"k\0\r\n\xff*$".to_vec(), b"\r\n\0v".to_vec()),
        (vec![0u8; 6500], vec![7u8; 65_000]),
        (
            (0..65_536u32).map(|i| (i % 251) as u8).collect(),
            vec![1u8; 16],
        ),
        (
            b"big".to_vec(),
            (0..3 * 1024 * 1024u32).map(|i| (i % 253) as u8).collect(),
        ),
    ];
    for (key, value) in &cases {
        let r =
            a.ss.set(key.clone(), value.clone(), T, None, SetOptions::default())
                .await
                .expect("set");
        assert!(r.response);
        let g = a.ss.get(key.clone(), T).await.expect("get");
        assert_eq!(
            g.response.as_deref(),
            Some(value.as_slice()),
            "key of {} bytes",
            key.len()
        );
        assert_eq!(
            a.ss.vdel(key.clone(), value.clone(), None, T)
                .await
                .expect("vdel")
                .response,
            1
        );
    }
    a.close().await;
}

/// The client commands (`statestore get`, `set`, `del`; the library code the
/// binary runs) and the SDK read each other's writes, binary ones included.
pub async fn cli_and_sdk_read_each_other(port: u16) {
    use statestore::client::{self, Client, ClientOptions, Encoding, OK};
    let sdk = Sdk::connect(port, "sdk-and-cli").await;
    let mut cli = Client::connect(&ClientOptions {
        client_cert: None,
        brokers: vec![format!("mqtt://127.0.0.1:{}", port).parse().expect("url")],
        client_id: "cli-and-sdk".into(),
        credentials: None,
        ca_file: None,
        timeout: T,
    })
    .await
    .expect("the CLI connects");
    let key = b"shared\0\xff".to_vec();
    let value: Vec<u8> = (0..=255).collect();
    let mut out = Vec::new();
    let plain = client::SetOptions::default();
    let code = client::set(&mut cli, &key, &value, &plain, &mut out)
        .await
        .expect("set");
    assert_eq!(code, OK);
    let got = sdk.ss.get(key.clone(), T).await.expect("sdk get");
    assert_eq!(got.response.as_deref(), Some(value.as_slice()));
    // The version the CLI printed is the one the SDK reads.
    assert_eq!(
        String::from_utf8_lossy(&out).trim(),
        got.version.expect("a version").to_string()
    );
    let r = sdk
        .ss
        .set(
            key.clone(),
            b"from the sdk".to_vec(),
            T,
            None,
            SetOptions::default(),
        )
        .await
        .expect("sdk set");
    assert!(r.response);
    let mut out = Vec::new();
    assert_eq!(
        client::get(
            &mut cli,
            &key,
            Encoding::Hex,
            client::Output::Text,
            &mut out
        )
        .await
        .expect("get"),
        OK
    );
    assert_eq!(out, b"66726f6d207468652073646b\n");
    assert_eq!(
        client::del(&mut cli, &key, None, None).await.expect("del"),
        OK
    );
    assert_eq!(sdk.ss.get(key, T).await.expect("sdk get").response, None);
    cli.close().await;
    sdk.close().await;
}

/// SCAN through the SDK's own pager (`Client::list_keys`, 1.5.0-beta1):
/// 3,000 keys over several pages while another client sets new keys and
/// deletes others between pages. Every key present for the whole listing
/// comes exactly once, and nothing that does not match. (In key order from
/// one store; a store in partitions lists each partition in key order, one
/// after the other.)
pub async fn list_keys_exactly_once_under_writes(port: u16) {
    let lister = Sdk::connect(port, "sdk-lister").await;
    let writer = Sdk::connect(port, "sdk-writer").await;
    let stable: Vec<Vec<u8>> = (0..3000)
        .map(|i| format!("scan/k{i:05}").into_bytes())
        .collect();
    let doomed: Vec<Vec<u8>> = (0..500)
        .map(|i| format!("scan/d{i:05}").into_bytes())
        .collect();
    for chunk in stable.chunks(100).chain(doomed.chunks(100)) {
        let sets = chunk.iter().map(|k| {
            writer
                .ss
                .set(k.clone(), b"v".to_vec(), T, None, SetOptions::default())
        });
        for r in futures::future::join_all(sets).await {
            assert!(r.expect("set").response);
        }
    }
    // Keys outside the pattern, and a key that is not UTF-8.
    for k in [&b"other/x"[..], b"scan\xff"] {
        writer
            .ss
            .set(k.to_vec(), b"v".to_vec(), T, None, SetOptions::default())
            .await
            .expect("set");
    }
    let mut pager = lister.ss.list_keys(b"scan/*".to_vec(), T).expect("a pager");
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut pages = 0;
    while let Some(page) = pager.next().await.expect("a page") {
        pages += 1;
        got.extend(page);
        // Between pages: a new key and a deleted one, ahead of and behind
        // where the listing stands.
        if let Some(d) = doomed.get(pages) {
            assert_eq!(
                writer
                    .ss
                    .del(d.clone(), None, T)
                    .await
                    .expect("del")
                    .response,
                1
            );
        }
        let new = format!("scan/n{pages:05}").into_bytes();
        writer
            .ss
            .set(new, b"v".to_vec(), T, None, SetOptions::default())
            .await
            .expect("set");
        assert!(pages < 1000, "the listing does not end");
    }
    assert!(pages >= 3, "3,000 keys take several pages ({pages})");
    let mut sorted = got.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), got.len(), "no repeats");
    assert!(got.iter().all(|k| k.starts_with(b"scan/")));
    let got_set: std::collections::BTreeSet<&Vec<u8>> = got.iter().collect();
    for k in &stable {
        assert!(
            got_set.contains(k),
            "missing {}",
            String::from_utf8_lossy(k)
        );
    }
    // An empty pattern is refused by the SDK itself; one that matches
    // nothing lists nothing (in one empty page, or one per partition).
    assert!(lister.ss.list_keys(Vec::new(), T).is_err());
    let mut none = lister
        .ss
        .list_keys(b"nothing*".to_vec(), T)
        .expect("a pager");
    let mut empty_pages = 0;
    while let Some(page) = none.next().await.expect("a page") {
        assert_eq!(page, Vec::<Vec<u8>>::new());
        empty_pages += 1;
        assert!(empty_pages <= 256, "the listing does not end");
    }
    assert!(empty_pages >= 1);
    lister.close().await;
    writer.close().await;
}
