//! Replays every golden vector against the native build and the wasm component.

use statestore_tests::{Kind, load_vectors, replay};

#[test]
fn vectors_native() {
    let vectors = load_vectors().expect("vectors load");
    assert!(
        vectors.len() >= 20,
        "expected the conformance vectors, found {}",
        vectors.len()
    );
    for v in &vectors {
        replay(v, Kind::Native).unwrap_or_else(|e| panic!("{e:#}"));
    }
}

#[test]
fn vectors_wasm() {
    let vectors = load_vectors().expect("vectors load");
    assert!(
        vectors.len() >= 20,
        "expected the conformance vectors, found {}",
        vectors.len()
    );
    for v in &vectors {
        replay(v, Kind::Wasm).unwrap_or_else(|e| panic!("{e:#}"));
    }
}

#[test]
fn vectors_wasm_typed() {
    let vectors = load_vectors().expect("vectors load");
    for v in &vectors {
        replay(v, Kind::WasmTyped).unwrap_or_else(|e| panic!("{e:#}"));
    }
}

#[test]
fn a_tampered_vector_fails() {
    // The replayer must notice a wrong expectation, or it proves nothing.
    let mut v = load_vectors().expect("vectors load").remove(0);
    let step = v
        .steps
        .iter_mut()
        .find(|s| !s.outputs.is_empty())
        .expect("a step with outputs");
    if let statestore::Output::Publish(m) = &mut step.outputs[0] {
        let mut changed = m.payload.to_vec();
        changed.push(b'!');
        m.payload = changed.into();
    }
    assert!(replay(&v, Kind::Native).is_err());
    assert!(replay(&v, Kind::Wasm).is_err());
    assert!(replay(&v, Kind::WasmTyped).is_err());
}
