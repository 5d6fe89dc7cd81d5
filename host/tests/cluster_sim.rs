//! Replication under a simulated network, clock and disk: many seeded runs
//! of a 3-replica cluster with message loss, delay and reordering,
//! partitions (one-way ones too), crashes and restarts, clock jumps, and
//! followers replaced by new replicas (membership changes), bounded by
//! time; rounds pipelined (a log synced ticks after its round went on);
//! snapshots and `raft-state` written behind (ticks after);
//! logs damaged in crashes (deleted, emptied, cut, a generation or
//! the snapshot missing), refused and rejoined; clients on every replica,
//! through the server's own routing, and no request answered twice
//! differently. A failure names its
//! seed: `STATESTORE_SIM_SEED=<seed> cargo test -p statestore --test
//! cluster_sim` replays exactly that run. `STATESTORE_SIM_FROM=<n>` starts
//! at the n-th seed of each test, to go on past the seeds a shorter run
//! (CI's) reached.

use std::time::{Duration, Instant};

use statestore::cluster::router::Notify;
use statestore::cluster::sim::{Options, Report, run};

fn budget() -> Duration {
    let secs = std::env::var("STATESTORE_SIM_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    Duration::from_secs(secs)
}

/// Adds `r`'s counts to `total`.
fn add(total: &mut Report, r: &Report) {
    total.acknowledged += r.acknowledged;
    total.reads += r.reads;
    total.crashes += r.crashes;
    total.leader_changes += r.leader_changes;
    total.timeouts += r.timeouts;
    total.applied += r.applied;
    total.restarts += r.restarts;
    total.snapshots_sent += r.snapshots_sent;
    total.hot_ops += r.hot_ops;
    total.unknown += r.unknown;
    total.index_reads += r.index_reads;
    total.replaced += r.replaced;
    total.refused += r.refused;
    total.outcome_unknown += r.outcome_unknown;
    total.damaged += r.damaged;
    total.forwarded += r.forwarded;
    total.held += r.held;
    total.resent += r.resent;
    total.retried += r.retried;
    total.reads_to_log += r.reads_to_log;
    total.rejoined += r.rejoined;
    total.poisoned += r.poisoned;
    total.scanned += r.scanned;
    total.handed_over += r.handed_over;
    total.watches += r.watches;
    total.notifications += r.notifications;
    total.notify_reordered += r.notify_reordered;
    total.quiet += r.quiet;
    total.woke += r.woke;
    total.pipelined_syncs += r.pipelined_syncs;
    total.snapshots_behind += r.snapshots_behind;
    total.state_syncs += r.state_syncs;
}

/// The first seed's number in each test's sequence
/// (`STATESTORE_SIM_FROM`, else 0).
fn first_run() -> u64 {
    std::env::var("STATESTORE_SIM_FROM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Runs only the seed `STATESTORE_SIM_SEED` names, if it names one.
fn replayed(options: &Options) -> bool {
    let Some(seed) = std::env::var("STATESTORE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    else {
        return false;
    };
    let report = run(seed, options).unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("seed {seed}: {report:?}");
    true
}

#[test]
fn seeded_runs_keep_every_acknowledged_write_and_agree() {
    let options = Options::default();
    if replayed(&options) {
        return;
    }
    let start = Instant::now();
    let mut total = Report::default();
    let mut runs = 0u64;
    let first = first_run();
    while runs < 3_000 && start.elapsed() < budget() {
        let seed = 0x5157_0000 + first + runs;
        let r = run(seed, &options).unwrap_or_else(|e| panic!("{e:#}"));
        add(&mut total, &r);
        runs += 1;
    }
    eprintln!("{runs} seeded runs: {total:?}");
    // The runs did what they are for: writes acknowledged and read back
    // through faults, leaders changing, replicas crashing.
    assert!(runs >= 5, "{runs} runs");
    assert!(total.acknowledged > 100 * runs as usize / 5, "{total:?}");
    assert!(
        total.reads > 0 && total.crashes > 0 && total.leader_changes > runs as usize,
        "{total:?}"
    );
    assert!(
        total.poisoned > 0,
        "poison requests were answered 500 and skipped alike by every replica: {total:?}"
    );
    assert!(total.timeouts > 0, "expiry went through the log: {total:?}");
    assert!(
        total.index_reads > 10 * runs as usize,
        "reads were answered with a read index, on followers and leaders: {total:?}"
    );
    assert!(
        total.hot_ops > 0 && total.unknown * 100 <= runs as usize * 3,
        "hot keys' histories were checked (the checker gave up on at most 1%): {total:?}"
    );
    assert!(
        total.restarts > 0 && total.snapshots_sent > 0,
        "replicas restarted from their disks and caught up from snapshots: {total:?}"
    );
    assert!(
        total.refused > 0 && total.outcome_unknown > 0,
        "requests were answered 503 (never sent, checked never applied) and 408 (sent, outcome unknown; no other answer after): {total:?}"
    );
    assert!(
        total.forwarded > 0
            && total.held > 0
            && total.resent > 0
            && total.retried > 0
            && total.reads_to_log > 0,
        "the server's routing ran in the simulation: forwards to the leader, holds, resends to a new leader, retries, reads without a read index in time: {total:?}"
    );
    assert!(
        total.damaged > 0 && total.rejoined > 0,
        "crashes damaged logs, replicas refused to start on them and rejoined: {total:?}"
    );
    assert!(
        total.replaced * 4 >= runs as usize,
        "followers were replaced while the cluster ran (removed, a new replica added): {total:?}"
    );
    assert!(
        total.watches > 0 && total.notifications > 0,
        "observers registered with KEYNOTIFY and were notified: {total:?}"
    );
    assert!(
        total.state_syncs > 10 * runs as usize,
        "raft-state's records were synced behind, ticks after their rounds, with crashes between: {total:?}"
    );
    assert!(
        total.snapshots_behind > runs as usize,
        "compactions' snapshot files were written behind, ticks after they began, with crashes between: {total:?}"
    );
    assert!(
        total.pipelined_syncs > 10 * runs as usize,
        "replicas pipelined their rounds (their logs synced ticks after the rounds went on), crashed between, and drained: {total:?}"
    );
    // Through an external broker, the leader that appended a change
    // publishes its notifications: out of order only around a change of
    // leader (when each replica published the changes it took, 4% were).
    assert!(
        total.notify_reordered * 100 <= total.notifications,
        "at most 1% of notifications reached the observer after a later version of their key: {total:?}"
    );
}

/// A store in 3 partitions: each replica runs 3 Raft groups under the same
/// faults (loss, delay, cuts, crashes that tear every group's log, clock
/// jumps), clients' requests go to their key's partition through the
/// server's routing, and every run checks each group as above (one answer
/// per request, determinism, no acknowledged write lost, hot keys
/// linearizable, the same state once settled) plus: every key lives in its
/// own partition, and a SCAN through the partitions lists every key of the
/// settled store exactly once; leaders hand their partitions over to their
/// places as a server does, under the same faults. Notifications are
/// published as with the embedded broker (every replica to its own
/// sessions), and each replica's of a key must come in the order of the
/// key's versions. `STATESTORE_SIM_SEED=<seed>` replays one.
#[test]
fn seeded_runs_of_a_store_in_partitions_keep_every_write_and_scan_once() {
    let options = Options {
        partitions: 3,
        notify: Notify::Everywhere,
        ..Options::default()
    };
    if replayed(&options) {
        return;
    }
    let start = Instant::now();
    let mut total = Report::default();
    let mut runs = 0u64;
    let first = first_run();
    while runs < 1_000 && start.elapsed() < budget() / 3 {
        let seed = 0x9A27_0000 + first + runs;
        let r = run(seed, &options).unwrap_or_else(|e| panic!("{e:#}"));
        add(&mut total, &r);
        runs += 1;
    }
    eprintln!("{runs} seeded runs in 3 partitions: {total:?}");
    assert!(runs >= 3, "{runs} runs");
    assert!(total.acknowledged > 100 * runs as usize / 5, "{total:?}");
    assert!(
        total.reads > 0 && total.crashes > 0 && total.snapshots_sent > 0 && total.forwarded > 0,
        "{total:?}"
    );
    assert!(
        total.hot_ops > 0 && total.unknown * 100 <= runs as usize * 3,
        "{total:?}"
    );
    assert!(
        total.handed_over > runs as usize,
        "leaderships were handed to their partitions' places under faults: {total:?}"
    );
    assert!(
        total.quiet >= runs && total.woke > 0,
        "idle groups stopped their clocks, and woke for what came: {total:?}"
    );
    assert!(
        total.scanned >= total.acknowledged,
        "the settled stores were scanned through their partitions: {total:?}"
    );
    assert!(
        total.watches > 0 && total.notifications > total.watches,
        "observers registered with KEYNOTIFY in the keys' partitions, and every replica's notifications of a key came in order: {total:?}"
    );
}

/// One seed, twice: the same run (a failure can be replayed).
#[test]
fn a_seed_replays_exactly() {
    let o = Options::default();
    let a = run(7, &o).expect("run");
    let b = run(7, &o).expect("run");
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}
