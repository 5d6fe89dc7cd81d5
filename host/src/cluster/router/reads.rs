//! Which requests of a batch a read index may answer.

use std::collections::{HashMap, HashSet};

use crate::InboundMessage;

/// Splits a batch into the reads to serve with a read index (`index`:
/// allowed now) and the rest, for the log, in order; and how many reads
/// are in the rest. `positions` are the reads (the guest's `reads`). A read
/// whose response topic has a write in flight (`unapplied`) or earlier in
/// the batch goes through the log behind it: a client reads its own writes
/// even when it does not wait for them.
pub(super) fn split_reads(
    messages: Vec<InboundMessage>,
    positions: &[u32],
    index: bool,
    unapplied: &HashMap<String, usize>,
) -> (Vec<InboundMessage>, Vec<InboundMessage>, u64) {
    let mut reads = Vec::new();
    let mut rest = Vec::new();
    let mut by_log = 0;
    let mut writing: HashSet<String> = HashSet::new();
    for (i, m) in messages.into_iter().enumerate() {
        let topic = m.response_topic.as_deref();
        if !positions.contains(&u32::try_from(i).unwrap_or(u32::MAX)) {
            if let Some(t) = topic {
                writing.insert(t.to_string());
            }
            rest.push(m);
        } else if index && !topic.is_some_and(|t| writing.contains(t) || unapplied.contains_key(t))
        {
            reads.push(m);
        } else {
            by_log += 1;
            rest.push(m);
        }
    }
    (reads, rest, by_log)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(topic: &str, corr: u8) -> InboundMessage {
        InboundMessage {
            topic: statestore_guest::rpc::REQUEST_TOPIC.into(),
            qos: 1,
            response_topic: Some(topic.into()),
            correlation_data: Some(vec![corr]),
            ..Default::default()
        }
    }

    fn corrs(messages: &[InboundMessage]) -> Vec<u8> {
        messages
            .iter()
            .map(|m| m.correlation_data.as_ref().expect("corr")[0])
            .collect()
    }

    /// Reads of other clients take the index; a client's read after its
    /// own write (earlier in the batch, or still in flight) stays behind
    /// it in the log, in order.
    #[test]
    fn a_read_behind_its_clients_write_goes_through_the_log() {
        // 0: a's write, 1: a's read, 2: b's read, 3: c's read (c has a
        // write in flight), 4: b's write, 5: b's read.
        let batch = vec![
            message("a", 0),
            message("a", 1),
            message("b", 2),
            message("c", 3),
            message("b", 4),
            message("b", 5),
        ];
        let in_flight = HashMap::from([("c".to_string(), 1)]);
        let (reads, rest, by_log) = split_reads(batch.clone(), &[1, 2, 3, 5], true, &in_flight);
        assert_eq!(corrs(&reads), [2]);
        assert_eq!(corrs(&rest), [0, 1, 3, 4, 5]);
        assert_eq!(by_log, 3);
        // Without the index (off, or a leader new to its term): all in
        // the log, in order.
        let (reads, rest, by_log) = split_reads(batch, &[1, 2, 3, 5], false, &HashMap::new());
        assert!(reads.is_empty());
        assert_eq!(corrs(&rest), [0, 1, 2, 3, 4, 5]);
        assert_eq!(by_log, 4);
    }
}
