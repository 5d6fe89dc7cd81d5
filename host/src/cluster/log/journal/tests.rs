//! The round journal: what a round committed survives a crash that lost
//! the logs' unsynced writes, whatever became of them; checkpoints,
//! generations, torn and damaged journals.

use std::sync::Arc;

use raft::Storage as _;

use super::super::LogStore;
use super::super::tests::{data, entry, hs};
use super::{Journal, Part, parts_of, read};
use crate::store::storage::{MemStorage as Disk, Storage as _};

/// A replica of `disks.len()` groups, with its journal on the first disk,
/// opened as a server opens it (the journal read, every log opened with
/// its parts, the journal started afresh).
fn open(disks: &[Disk], checkpoint: u64) -> anyhow::Result<(Vec<LogStore>, Journal)> {
    let found = read(&disks[0])?;
    let mut logs = Vec::new();
    for (g, disk) in disks.iter().enumerate() {
        let mine = parts_of(found.as_deref(), g as u32);
        logs.push(LogStore::open_with(
            Arc::new(disk.clone()),
            &[1, 2, 3],
            mine.as_deref(),
            true,
        )?);
    }
    let journal = Journal::create(Arc::new(disks[0].clone()), checkpoint)?;
    Ok((logs, journal))
}

/// What `disk`'s journal holds (it has one).
fn parts_in(disk: &Disk) -> Vec<(u32, Part)> {
    read(disk).expect("readable").expect("a journal")
}

fn commit(journal: &mut Journal, logs: &mut [LogStore]) {
    let logs = logs.iter_mut().enumerate();
    journal
        .commit(logs.map(|(g, l)| (g as u32, l)))
        .expect("commit");
}

fn crash(disks: &[Disk], torn: Option<usize>) -> Vec<Disk> {
    disks.iter().map(|d| d.crash(torn)).collect()
}

fn terms(log: &LogStore) -> Vec<(u64, u64)> {
    let (first, last) = (
        log.first_index().expect("the step succeeds"),
        log.last_index().expect("the step succeeds"),
    );
    (first..=last)
        .map(|i| (i, log.term(i).expect("term")))
        .collect()
}

/// The current log file of `disk`, and its name.
fn current(disk: &Disk) -> (String, Vec<u8>) {
    let generation = String::from_utf8(disk.read("raft-log.current").expect("the step succeeds"))
        .expect("the step succeeds");
    let name = format!("raft-log.{}", generation.trim());
    let data = disk.read(&name).expect("the step succeeds");
    (name, data)
}

#[test]
fn what_a_round_committed_survives_a_crash_that_lost_the_logs_writes() {
    let disks = [Disk::new(), Disk::new()];
    let (mut logs, mut journal) = open(&disks, 1 << 20).expect("open");
    logs[0]
        .append(&[entry(1, 1), entry(2, 1)])
        .expect("the step succeeds");
    logs[0]
        .set_hardstate(hs(1, 1, 0))
        .expect("the step succeeds");
    logs[1].append(&[entry(1, 1)]).expect("the step succeeds");
    commit(&mut journal, &mut logs);
    // Written and never journaled: not acknowledged, may be lost.
    logs[0].append(&[entry(3, 1)]).expect("the step succeeds");
    assert!(logs[0].is_dirty(), "the logs themselves were not synced");
    for torn in [None, Some(0), Some(7), Some(1000)] {
        let after = crash(&disks, torn);
        let (logs, _) = open(&after, 1 << 20).expect("reopen");
        let t0 = terms(&logs[0]);
        assert!(
            t0 == [(1, 1), (2, 1)] || t0 == [(1, 1), (2, 1), (3, 1)],
            "{torn:?}: {t0:?}"
        );
        assert_eq!(
            logs[0].hard_state().vote,
            1,
            "the vote went through the journal"
        );
        assert_eq!(terms(&logs[1]), [(1, 1)]);
    }
}

#[test]
fn unsynced_bytes_of_a_log_are_never_read_and_a_log_cut_short_is_refused() {
    let disk = Disk::new();
    let (mut logs, mut journal) =
        open(std::slice::from_ref(&disk), 1 << 20).expect("the step succeeds");
    logs[0].append(&[entry(1, 1)]).expect("the step succeeds");
    commit(&mut journal, &mut logs);
    let synced = logs[0].anchor().synced.expect("the step succeeds") as usize;
    logs[0].append(&[entry(2, 1)]).expect("the step succeeds");
    commit(&mut journal, &mut logs);
    drop(logs);
    drop(journal);
    let after = disk.crash(None);
    let (name, data) = current(&after);
    let mut holed = data[..synced].to_vec();
    holed.extend_from_slice(&[0; 64]);
    holed.extend_from_slice(&[7; 64]);
    after
        .write_atomic(&name, &holed)
        .expect("the step succeeds");
    let (logs, _) = open(std::slice::from_ref(&after), 1 << 20)
        .expect("a hole past what was synced is not read");
    assert_eq!(terms(&logs[0]), [(1, 1), (2, 1)]);
    drop(logs);
    // Cut below what raft-state says was synced: refused.
    let after = after.crash(None);
    let (name, _) = current(&after);
    after.truncate(&name, 3).expect("the step succeeds");
    let e = open(std::slice::from_ref(&after), 1 << 20).expect_err("refused");
    assert!(format!("{e:#}").contains("cut short"), "{e:#}");
    // Opened without a journal, a log records no synced length (the whole
    // file counts, as before journals).
    let plain = LogStore::open(Arc::new(Disk::new()), &[1, 2, 3]).expect("open");
    assert_eq!(plain.anchor().synced, None);
}

#[test]
fn a_checkpoint_syncs_every_log_and_the_journal_starts_over() {
    let disks = [Disk::new(), Disk::new(), Disk::new()];
    let (mut logs, mut journal) = open(&disks, 1 << 10).expect("open");
    let mut checkpoints = 0;
    for i in 1..=60u64 {
        let g = (i % 3) as usize;
        let next = logs[g].last_index().expect("the step succeeds") + 1;
        logs[g]
            .append(&[entry(next, 1)])
            .expect("the step succeeds");
        commit(&mut journal, &mut logs);
        if journal.full() {
            for log in &mut logs {
                log.sync().expect("the step succeeds");
            }
            journal.restart().expect("the step succeeds");
            checkpoints += 1;
            assert!(parts_in(&disks[0]).is_empty());
        }
    }
    assert!(checkpoints >= 2, "{checkpoints} checkpoints");
    assert!(!parts_in(&disks[0]).is_empty(), "rounds since the last");
    drop(logs);
    drop(journal);
    for torn in [None, Some(3)] {
        let (logs, _) = open(&crash(&disks, torn), 1 << 10).expect("reopen");
        for log in &logs {
            assert_eq!(log.last_index().expect("the step succeeds"), 20, "{torn:?}");
        }
    }
}

#[test]
fn a_new_generation_holds_what_the_journal_had_of_the_old_one() {
    let disks = [Disk::new()];
    let (mut logs, mut journal) = open(&disks, 1 << 20).expect("open");
    logs[0]
        .append(&[entry(1, 1), entry(2, 1), entry(3, 1)])
        .expect("the step succeeds");
    logs[0]
        .set_hardstate(hs(1, 1, 3))
        .expect("the step succeeds");
    commit(&mut journal, &mut logs);
    logs[0]
        .compact(2, data(b"state at 2"), std::time::Instant::now())
        .expect("the step succeeds");
    logs[0].append(&[entry(4, 1)]).expect("the step succeeds");
    commit(&mut journal, &mut logs);
    let parts = parts_in(&disks[0]);
    assert_eq!(parts.len(), 2);
    assert_ne!(parts[0].1.generation, parts[1].1.generation);
    drop(logs);
    let (logs, _) = open(&crash(&disks, None), 1 << 20).expect("reopen");
    assert_eq!(logs[0].snapshot_index(), 2);
    assert_eq!(terms(&logs[0]), [(3, 1), (4, 1)]);
}

#[test]
fn a_tail_replaced_in_a_later_round_is_replaced_on_recovery() {
    let disks = [Disk::new()];
    let (mut logs, mut journal) = open(&disks, 1 << 20).expect("open");
    logs[0]
        .append(&[entry(1, 1), entry(2, 1), entry(3, 1), entry(4, 1)])
        .expect("the step succeeds");
    commit(&mut journal, &mut logs);
    logs[0]
        .set_hardstate(hs(2, 2, 1))
        .expect("the step succeeds");
    logs[0].append(&[entry(3, 2)]).expect("the step succeeds");
    commit(&mut journal, &mut logs);
    drop(logs);
    let (logs, _) = open(&crash(&disks, Some(11)), 1 << 20).expect("reopen");
    assert_eq!(terms(&logs[0]), [(1, 1), (2, 1), (3, 2)]);
    assert_eq!(logs[0].hard_state().term, 2);
}

#[test]
fn a_torn_journal_tail_is_cut_and_damage_or_a_hole_is_refused() {
    let disks = [Disk::new()];
    let (mut logs, mut journal) = open(&disks, 1 << 20).expect("open");
    logs[0].append(&[entry(1, 1)]).expect("the step succeeds");
    commit(&mut journal, &mut logs);
    logs[0].append(&[entry(2, 1)]).expect("the step succeeds");
    commit(&mut journal, &mut logs);
    drop(logs);
    drop(journal);
    let after = disks[0].crash(None);
    let data = after.read(super::JOURNAL).expect("the step succeeds");
    let parts = parts_in(&after);
    let first = 8 + 1 + super::HEADER + parts[0].1.bytes.len();
    let second = 8 + 1 + super::HEADER + parts[1].1.bytes.len();
    // The second round torn (never synced): cut off, the first kept.
    let torn = Disk::new();
    torn.write_atomic(super::JOURNAL, &data[..first + second / 2])
        .expect("the step succeeds");
    assert_eq!(parts_in(&torn).len(), 1);
    // The first damaged with the second good after it: refused.
    let mut bad = data.clone();
    bad[first / 2] ^= 0x40;
    let damaged = Disk::new();
    damaged
        .write_atomic(super::JOURNAL, &bad)
        .expect("the step succeeds");
    let e = read(&damaged).expect_err("refused");
    assert!(format!("{e:#}").contains("damaged"), "{e:#}");
    // No journal, where raft-state says the log relies on one: refused.
    let lost = disks[0].crash(None);
    lost.remove(super::JOURNAL).expect("removed");
    let e = open(std::slice::from_ref(&lost), 1 << 20).expect_err("refused");
    assert!(
        format!("{e:#}").contains("raft-journal is missing"),
        "{e:#}"
    );
    // A part that starts past the log's end would leave a hole: refused.
    let mut far = parts[1].1.clone();
    far.at += 100;
    let (name, file) = current(&after);
    let e = super::joined(file, parts[0].1.at.into(), &[&far], &name, "here").expect_err("refused");
    assert!(format!("{e:#}").contains("ends at byte"), "{e:#}");
}

/// From `--fsync always` to `everysec`: the logs are opened with what the
/// journal holds, written anew without a journal (whole files count again),
/// and the journal is removed; they open the same after that.
#[test]
fn a_replica_that_stops_journaling_keeps_what_the_journal_held() {
    let disks = [Disk::new(), Disk::new()];
    let (mut logs, mut journal) = open(&disks, 1 << 20).expect("open");
    logs[0].append(&[entry(1, 1), entry(2, 1)]).expect("append");
    logs[1].append(&[entry(1, 1)]).expect("append");
    commit(&mut journal, &mut logs);
    drop(logs);
    drop(journal);
    let after = crash(&disks, None);
    let found = read(&after[0]).expect("read");
    let plain: Vec<LogStore> = after
        .iter()
        .enumerate()
        .map(|(g, d)| {
            let mine = parts_of(found.as_deref(), g as u32);
            LogStore::open_with(Arc::new(d.clone()), &[1, 2, 3], mine.as_deref(), false)
                .expect("open without a journal")
        })
        .collect();
    super::remove(&after[0]).expect("remove");
    assert_eq!(terms(&plain[0]), [(1, 1), (2, 1)]);
    assert_eq!(terms(&plain[1]), [(1, 1)]);
    assert!(plain.iter().all(|l| l.anchor().synced.is_none()));
    drop(plain);
    let again = crash(&after, None);
    assert!(read(&again[0]).expect("read").is_none(), "removed");
    for (g, d) in again.iter().enumerate() {
        let log = LogStore::open(Arc::new(d.clone()), &[1, 2, 3]).expect("open");
        assert_eq!(log.last_index().expect("last"), [2, 1][g]);
    }
}
