//! A linearizability checker: the Wing-Gong algorithm with Lowe's
//! memoization (G. Lowe, "Testing for linearizability", 2017; the algorithm
//! Porcupine and Knossos implement), for one key's history against a
//! register: SET writes a value, DEL removes it and says whether it was
//! there, GET reads it.
//!
//! A history is every operation's invocation and response time. An
//! operation that never got a response (its replica crashed, its leader
//! lost the entry) has none: it may have taken effect at any time after its
//! invocation, or never, which is the same as responding at the end of time
//! with whatever it would have returned.
//!
//! The search: take the operations in invocation order; at each step try
//! to linearize one that was invoked before the earliest pending response
//! (a "minimal" operation), if the model allows what it returned; memoize
//! (set of linearized operations, model state) so no configuration is
//! explored twice; backtrack when stuck. Found: linearizable.

use std::collections::HashSet;

/// An operation on one key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// SET to a value (always applied: no conditions in these histories).
    Set(Vec<u8>),
    /// GET, which returned this (`None`: no key).
    Get(Option<Vec<u8>>),
    /// DEL, which returned whether the key was there (`None`: no answer,
    /// any).
    Del(Option<bool>),
}

/// One operation of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What it did and returned.
    pub op: Op,
    /// When it was invoked.
    pub call: u64,
    /// When its response came (`None`: never).
    pub ret: Option<u64>,
}

/// The register after `op` from `state`, if `op`'s result is possible.
fn step(state: &Option<Vec<u8>>, op: &Op) -> Option<Option<Vec<u8>>> {
    match op {
        Op::Set(v) => Some(Some(v.clone())),
        Op::Get(seen) => (seen == state).then(|| state.clone()),
        Op::Del(said) => {
            let was = state.is_some();
            said.is_none_or(|s| s == was).then_some(None)
        }
    }
}

/// Why a check did not say yes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Linearizable.
    Linearizable,
    /// Not: no order explains the results.
    Not,
    /// The search took more than its budget of steps.
    Unknown,
}

/// Checks `history` (one key, starting absent) within `budget` steps.
pub fn check(history: &[Event], budget: u64) -> Verdict {
    let n = history.len();
    if n == 0 {
        return Verdict::Linearizable;
    }
    // The entries, in time order: calls before returns at the same time
    // (such operations overlap: either order is allowed).
    #[derive(Clone, Copy)]
    struct Entry {
        op: usize,
        is_call: bool,
    }
    let mut entries: Vec<(u64, u8, Entry)> = Vec::with_capacity(2 * n);
    for (i, e) in history.iter().enumerate() {
        entries.push((
            e.call,
            0,
            Entry {
                op: i,
                is_call: true,
            },
        ));
        entries.push((
            e.ret.unwrap_or(u64::MAX),
            1,
            Entry {
                op: i,
                is_call: false,
            },
        ));
    }
    entries.sort_by_key(|(t, k, e)| (*t, *k, e.op));
    let list: Vec<Entry> = entries.into_iter().map(|(_, _, e)| e).collect();
    // A doubly linked list over `list`, with a head at index `len`.
    let len = list.len();
    let head = len;
    let mut next: Vec<usize> = (1..=len + 1).collect();
    let mut prev: Vec<usize> = Vec::with_capacity(len + 1);
    for i in 0..len {
        prev.push(if i == 0 { head } else { i - 1 });
    }
    prev.push(len - 1); // head's prev: the last
    next[head] = 0;
    next[len - 1] = usize::MAX; // the end
    // Where each operation's return entry is.
    let mut ret_at = vec![0usize; n];
    for (i, e) in list.iter().enumerate() {
        if !e.is_call {
            ret_at[e.op] = i;
        }
    }
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, i: usize| {
        let (p, q) = (prev[i], next[i]);
        next[p] = q;
        if q != usize::MAX {
            prev[q] = p;
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, i: usize| {
        let (p, q) = (prev[i], next[i]);
        next[p] = i;
        if q != usize::MAX {
            prev[q] = i;
        }
    };
    let words = n.div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut state: Option<Vec<u8>> = None;
    let mut seen: HashSet<(Vec<u64>, Option<Vec<u8>>)> = HashSet::new();
    // (call entry index, state before it)
    let mut stack: Vec<(usize, Option<Vec<u8>>)> = Vec::new();
    let mut at = next[head];
    let mut steps = 0u64;
    while next[head] != usize::MAX {
        steps += 1;
        if steps > budget {
            return Verdict::Unknown;
        }
        if at == usize::MAX {
            return Verdict::Not;
        }
        let e = list[at];
        if e.is_call {
            let op = e.op;
            let lifted = step(&state, &history[op].op).and_then(|after| {
                let mut bits = linearized.clone();
                bits[op / 64] |= 1 << (op % 64);
                seen.insert((bits.clone(), after.clone()))
                    .then_some((bits, after))
            });
            if let Some((bits, after)) = lifted {
                stack.push((at, std::mem::replace(&mut state, after)));
                linearized = bits;
                // Lift the operation out of the list (its call and return).
                unlink(&mut next, &mut prev, at);
                unlink(&mut next, &mut prev, ret_at[op]);
                at = next[head];
            } else {
                at = next[at];
            }
        } else {
            // A return before its call was linearized: undo the last choice.
            let Some((call_at, before)) = stack.pop() else {
                return Verdict::Not;
            };
            let op = list[call_at].op;
            state = before;
            linearized[op / 64] &= !(1 << (op % 64));
            relink(&mut next, &mut prev, ret_at[op]);
            relink(&mut next, &mut prev, call_at);
            at = next[call_at];
        }
    }
    Verdict::Linearizable
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(op: Op, call: u64, ret: u64) -> Event {
        Event {
            op,
            call,
            ret: Some(ret),
        }
    }

    fn set(v: &str) -> Op {
        Op::Set(v.as_bytes().to_vec())
    }

    fn get(v: Option<&str>) -> Op {
        Op::Get(v.map(|v| v.as_bytes().to_vec()))
    }

    const B: u64 = 1_000_000;

    #[test]
    fn sequential_histories() {
        let ok = [
            ev(set("a"), 0, 1),
            ev(get(Some("a")), 2, 3),
            ev(Op::Del(Some(true)), 4, 5),
            ev(get(None), 6, 7),
            ev(Op::Del(Some(false)), 8, 9),
        ];
        assert_eq!(check(&ok, B), Verdict::Linearizable);
        // A read of a value overwritten before the read began.
        let stale = [
            ev(set("a"), 0, 1),
            ev(set("b"), 2, 3),
            ev(get(Some("a")), 4, 5),
        ];
        assert_eq!(check(&stale, B), Verdict::Not);
        // A read of a value nobody wrote.
        assert_eq!(check(&[ev(get(Some("x")), 0, 1)], B), Verdict::Not);
        // A read of nothing after an acknowledged write: a lost write.
        let lost = [ev(set("a"), 0, 1), ev(get(None), 2, 3)];
        assert_eq!(check(&lost, B), Verdict::Not);
    }

    #[test]
    fn concurrent_operations_may_go_either_way() {
        // A read overlapping a write sees the old value or the new one.
        for seen in [None, Some("a")] {
            let h = [ev(set("a"), 0, 10), ev(get(seen), 1, 2)];
            assert_eq!(check(&h, B), Verdict::Linearizable, "{seen:?}");
        }
        // Two overlapping writes, then reads agree on one order...
        let h = [
            ev(set("a"), 0, 10),
            ev(set("b"), 0, 10),
            ev(get(Some("a")), 11, 12),
            ev(get(Some("a")), 13, 14),
        ];
        assert_eq!(check(&h, B), Verdict::Linearizable);
        // ...and may not flip back and forth between them.
        let flip = [
            ev(set("a"), 0, 10),
            ev(set("b"), 0, 10),
            ev(get(Some("a")), 11, 12),
            ev(get(Some("b")), 13, 14),
            ev(get(Some("a")), 15, 16),
        ];
        assert_eq!(check(&flip, B), Verdict::Not);
        // Reads that overlap each other and one write: a later read may
        // not see an older value than an earlier, finished read saw.
        let h = [
            ev(set("a"), 0, 1),
            ev(set("b"), 2, 20),
            ev(get(Some("b")), 3, 4),
            ev(get(Some("a")), 5, 6),
        ];
        assert_eq!(check(&h, B), Verdict::Not);
    }

    #[test]
    fn an_unanswered_operation_may_or_may_not_have_happened() {
        let pending = |op: Op, call: u64| Event {
            op,
            call,
            ret: None,
        };
        // It happened...
        let h = [pending(set("a"), 0), ev(get(Some("a")), 5, 6)];
        assert_eq!(check(&h, B), Verdict::Linearizable);
        // ...or not...
        let h = [pending(set("a"), 0), ev(get(None), 5, 6)];
        assert_eq!(check(&h, B), Verdict::Linearizable);
        // ...but not before it was invoked...
        let h = [ev(get(Some("a")), 0, 1), pending(set("a"), 5)];
        assert_eq!(check(&h, B), Verdict::Not);
        // ...and not undone once seen.
        let h = [
            pending(set("a"), 0),
            ev(get(Some("a")), 5, 6),
            ev(get(None), 7, 8),
        ];
        assert_eq!(check(&h, B), Verdict::Not);
        // A DEL whose answer never came.
        let h = [
            ev(set("a"), 0, 1),
            pending(Op::Del(None), 2),
            ev(get(None), 5, 6),
        ];
        assert_eq!(check(&h, B), Verdict::Linearizable);
    }

    #[test]
    fn a_del_says_what_was_there() {
        let h = [ev(Op::Del(Some(true)), 0, 1)];
        assert_eq!(check(&h, B), Verdict::Not);
        let h = [ev(set("a"), 0, 1), ev(Op::Del(Some(false)), 2, 3)];
        assert_eq!(check(&h, B), Verdict::Not);
        // Two overlapping DELs of one key: exactly one finds it.
        let h = [
            ev(set("a"), 0, 1),
            ev(Op::Del(Some(true)), 2, 5),
            ev(Op::Del(Some(true)), 2, 5),
        ];
        assert_eq!(check(&h, B), Verdict::Not);
        let h = [
            ev(set("a"), 0, 1),
            ev(Op::Del(Some(true)), 2, 5),
            ev(Op::Del(Some(false)), 2, 5),
        ];
        assert_eq!(check(&h, B), Verdict::Linearizable);
    }

    #[test]
    fn many_overlapping_writes_stay_within_budget() {
        // 12 writers all overlapping, then reads: the memo visits each
        // (subset, value) at most once (4,096 subsets here), not 12!
        // orders.
        let mut h: Vec<Event> = (0..12).map(|i| ev(set(&format!("v{i}")), 0, 100)).collect();
        h.push(ev(get(Some("v7")), 101, 102));
        assert_eq!(check(&h, 10_000_000), Verdict::Linearizable);
        h.push(ev(get(Some("v8")), 103, 104));
        assert_eq!(check(&h, 10_000_000), Verdict::Not);
        // A budget too small says so rather than guessing.
        assert_eq!(check(&h, 10), Verdict::Unknown);
    }
}
