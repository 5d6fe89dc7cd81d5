//! Quick start: load the state store component in wasmtime, send it a few
//! requests as an MQTT host would, and print what it asks the host to publish.
//!
//! Run: `cargo run -p statestore --example quickstart`

use statestore::{Backend, Config, InboundMessage, Output, Runtime};
use statestore_guest::rpc::REQUEST_TOPIC;

fn request(parts: &[&[u8]], corr: u8, now: u64) -> InboundMessage {
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload: statestore_guest::resp3::request(parts),
        qos: 1,
        response_topic: Some("clients/demo/response".into()),
        correlation_data: Some(vec![corr; 16]),
        message_expiry_interval: Some(10),
        user_properties: vec![
            ("__srcId".into(), "demo".into()),
            ("__ts".into(), format!("{now:015}:00000:demo")),
        ],
        ..Default::default()
    }
}

fn main() -> anyhow::Result<()> {
    let runtime = Runtime::new()?;
    let mut store = runtime.instantiate(&Config::default())?;
    let now = 1_700_000_000_000;
    let requests: [&[&[u8]]; 5] = [
        &[b"KEYNOTIFY", b"greeting"],
        &[b"SET", b"greeting", b"hello", b"PX", b"1000"],
        &[b"GET", b"greeting"],
        &[b"SET", b"greeting", b"other", b"NX"],
        &[b"FLY", b"greeting"],
    ];
    for (i, parts) in requests.iter().enumerate() {
        let shown: Vec<_> = parts.iter().map(|p| String::from_utf8_lossy(p)).collect();
        println!("> {}", shown.join(" "));
        print_outputs(store.handle_messages(&[request(parts, i as u8, now)], now)?);
    }
    let deadline = store.next_deadline()?.expect("the key expires");
    println!("> (timer fires at +{} ms)", deadline - now);
    print_outputs(store.timeout(deadline)?);
    Ok(())
}

fn print_outputs(outputs: Vec<Output>) {
    for o in outputs {
        if let Output::Publish(m) = o {
            let ts = m.user_property("__ts").unwrap_or("-");
            println!(
                "  {:?} on {}: {:?} (__ts {ts})",
                m.kind,
                m.topic,
                String::from_utf8_lossy(&m.payload)
            );
        }
    }
}
