//! The Raft log on disk: recovery, damage, `raft-state` and rejoin, on
//! simulated and real files.

use std::time::Instant;

use super::*;
use crate::store::storage::MemStorage as Disk;

pub(super) fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: format!("entry {index}").into_bytes().into(),
        ..Default::default()
    }
}

fn open(disk: &Disk) -> Result<LogStore> {
    LogStore::open(Arc::new(disk.clone()), &[1, 2, 3])
}

/// A snapshot's data, `bytes`.
pub(super) fn data(bytes: &[u8]) -> SnapshotBuf {
    let mut d = SnapshotBuf::with_capacity(bytes.len());
    d.buf().extend_from_slice(bytes);
    d
}

pub(super) fn hs(term: u64, vote: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote,
        commit,
        ..Default::default()
    }
}

fn voters(log: &LogStore) -> Vec<u64> {
    log.initial_state().expect("state").conf_state.voters
}

/// The membership a log starts with is its own: a cluster file that
/// lists other replicas later does not change it (the log's changes
/// apply to it), and a replica that joins starts with none.
#[test]
fn the_membership_a_log_starts_with_is_kept() {
    let disk = Disk::new();
    let log = open(&disk).expect("open");
    assert_eq!(voters(&log), [1, 2, 3]);
    drop(log);
    let log = LogStore::open(Arc::new(disk.crash(None)), &[1, 2, 4]).expect("reopen");
    assert_eq!(voters(&log), [1, 2, 3]);
    let joining = Disk::new();
    let log = LogStore::open(Arc::new(joining.clone()), &[]).expect("open");
    assert!(voters(&log).is_empty());
    drop(log);
    let log = LogStore::open(Arc::new(joining.crash(None)), &[1, 2, 3]).expect("reopen");
    assert!(voters(&log).is_empty(), "still joining");
}

#[test]
fn what_was_synced_survives_a_crash_and_a_torn_tail_is_cut() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    log.append(&[entry(1, 1), entry(2, 1)]).expect("append");
    log.set_hardstate(hs(1, 2, 1)).expect("hs");
    log.sync().expect("sync");
    log.append(&[entry(3, 1)]).expect("append"); // never synced
    for torn in [0, 5, 9, 15] {
        let after = disk.crash(Some(torn));
        let back = open(&after).expect("reopen");
        assert_eq!(back.mem.last_index().expect("last"), 2, "torn {torn}");
        assert_eq!(back.hard_state(), hs(1, 2, 1));
        assert_eq!(
            back.mem
                .entries(1, 3, None, GetEntriesContext::empty(false))
                .expect("e"),
            vec![entry(1, 1), entry(2, 1)]
        );
    }
    // All of it written: all of it back.
    let whole = disk.crash(Some(usize::MAX));
    assert_eq!(
        open(&whole)
            .expect("reopen")
            .mem
            .last_index()
            .expect("last"),
        3
    );
}

#[test]
fn a_conflicting_tail_is_replaced_on_replay() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    log.append(&[entry(1, 1), entry(2, 1), entry(3, 1)])
        .expect("append");
    log.append(&[entry(2, 2)]).expect("a new leader's entry 2");
    log.sync().expect("sync");
    let back = open(&disk.crash(None)).expect("reopen");
    assert_eq!(back.mem.last_index().expect("last"), 2);
    assert_eq!(back.mem.term(2).expect("term"), 2);
}

#[test]
fn damage_before_the_end_is_refused() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    log.append(&[entry(1, 1), entry(2, 1), entry(3, 1)])
        .expect("append");
    log.sync().expect("sync");
    let name = log_name(log.generation);
    drop(log);
    let disk = disk.crash(None);
    disk.flip_bit(&name, 12);
    let e = open(&disk).expect_err("damage").to_string();
    assert!(e.contains("damaged"), "{e}");
}

#[test]
fn any_bytes_in_the_log_open_or_are_refused_never_panic() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    let entries: Vec<Entry> = (1..=20).map(|i| entry(i, 1 + i / 7)).collect();
    log.append(&entries).expect("append");
    log.set_hardstate(hs(3, 1, 15)).expect("hs");
    log.sync().expect("sync");
    let name = log_name(log.generation);
    drop(log);
    // What was written, and a little of the zeros filled ahead of it.
    let full = disk.crash(None).read(&name).expect("read");
    let end = parse(&full, "log").expect("parse").good;
    let good = full[..(end + 64).min(full.len())].to_vec();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..500 {
        let mut bytes = good.clone();
        match round % 4 {
            0 => bytes.truncate((next() as usize) % (good.len() + 1)),
            1 => {
                let at = (next() as usize) % bytes.len();
                bytes[at] ^= 1 << (next() % 8);
            }
            2 => bytes = (0..next() % 300).map(|_| next() as u8).collect(),
            _ => {
                let at = (next() as usize) % bytes.len();
                let extra: Vec<u8> = (0..next() % 40).map(|_| next() as u8).collect();
                bytes.splice(at..at, extra);
            }
        }
        let d = Disk::new();
        d.write_atomic(CURRENT, b"7").expect("current");
        d.write_atomic("raft-log.7", &bytes).expect("log");
        if let Ok(back) = open(&d.crash(None)) {
            // What opened is a log raft-rs can start from.
            let last = back.mem.last_index().expect("last");
            assert!(back.hard_state().commit <= last, "round {round}");
        }
    }
}

#[test]
fn a_snapshot_compacts_the_log_and_is_what_a_restart_starts_from() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    let entries: Vec<Entry> = (1..=10).map(|i| entry(i, 1)).collect();
    log.append(&entries).expect("append");
    log.set_hardstate(hs(1, 1, 8)).expect("hs");
    log.sync().expect("sync");
    assert!(raft::Storage::snapshot(&log, 0, 0).is_err(), "none yet");
    log.compact(8, data(b"state at 8"), Instant::now())
        .expect("compact");
    let snap = raft::Storage::snapshot(&log, 0, 0).expect("snapshot");
    assert_eq!(snap.get_metadata().index, 8);
    assert_eq!(&snap.data[..], b"state at 8");
    assert_eq!(log.mem.first_index().expect("first"), 8);
    let disk = disk.crash(None);
    let back = open(&disk).expect("reopen");
    assert_eq!(back.snapshot_index(), 8);
    assert_eq!(raft::Storage::term(&back, 8).expect("term"), 1);
    assert_eq!(back.mem.last_index().expect("last"), 10);
    assert_eq!(back.hard_state().commit, 8);
    assert_eq!(
        back.mem
            .entries(9, 11, None, GetEntriesContext::empty(false))
            .expect("e"),
        vec![entry(9, 1), entry(10, 1)]
    );
    // A leader's snapshot past the log replaces it.
    let mut back = back;
    let mut leaders = snap.clone();
    leaders.mut_metadata().index = 20;
    leaders.mut_metadata().term = 3;
    leaders.data = b"state at 20".to_vec().into();
    back.install(leaders).expect("install");
    let again = open(&disk.crash(None)).expect("reopen");
    assert_eq!(again.snapshot_index(), 20);
    assert_eq!(again.mem.last_index().expect("last"), 20);
    assert_eq!(again.hard_state().commit, 20);
}

/// A snapshot written behind (on its own thread): the loop goes on
/// appending; until the compaction is finished the log is whole, and a
/// crash while the file is written, or after it was written and before the
/// log was compacted, opens with every entry (from the new snapshot once
/// it is in place); a leader's snapshot waits for the one under way.
#[test]
fn a_snapshot_written_behind_leaves_the_log_whole_until_it_is_in_place() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    log.snapshots_behind();
    let entries: Vec<Entry> = (1..=10).map(|i| entry(i, 1)).collect();
    log.append(&entries).expect("append");
    log.set_hardstate(hs(1, 1, 8)).expect("hs");
    log.sync().expect("sync");
    log.compact(8, data(b"state at 8"), Instant::now())
        .expect("compact");
    assert!(log.is_compacting(), "written on its own thread");
    log.append(&[entry(11, 1)]).expect("the loop goes on");
    log.set_hardstate(hs(1, 1, 10)).expect("hs");
    log.sync().expect("sync");
    assert!(
        raft::Storage::snapshot(&log, 0, 0).is_err(),
        "not offered before it is in place"
    );
    assert_eq!(log.mem.first_index().expect("first"), 1);
    let back = open(&disk.crash(None)).expect("a crash while it is written");
    assert!([0, 8].contains(&back.snapshot_index()));
    assert_eq!(back.mem.last_index().expect("last"), 11);
    drop(back);
    while !log.compacting.as_ref().expect("under way").written() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let back = open(&disk.crash(None)).expect("written, the log not compacted");
    assert_eq!(back.snapshot_index(), 8);
    assert_eq!(
        back.mem
            .entries(9, 12, None, GetEntriesContext::empty(false))
            .expect("the entries after it"),
        vec![entry(9, 1), entry(10, 1), entry(11, 1)]
    );
    drop(back);
    assert!(!log.poll_compaction().expect("finished"), "none under way");
    assert_eq!(log.snapshot_index(), 8);
    assert_eq!(log.mem.first_index().expect("first"), 8);
    let back = open(&disk.crash(None)).expect("compacted");
    assert_eq!(back.snapshot_index(), 8);
    assert_eq!(back.mem.last_index().expect("last"), 11);
    drop(back);
    // Another under way when a leader's snapshot comes: it finishes first.
    log.set_hardstate(hs(1, 1, 11)).expect("hs");
    log.compact(11, data(b"state at 11"), Instant::now())
        .expect("compact");
    let mut leaders = raft::Storage::snapshot(&log, 0, 0).expect("at 8");
    leaders.mut_metadata().index = 20;
    leaders.mut_metadata().term = 3;
    leaders.data = b"state at 20".to_vec().into();
    log.install(leaders).expect("install");
    assert!(!log.is_compacting());
    let again = open(&disk.crash(None)).expect("reopen");
    assert_eq!(again.snapshot_index(), 20);
    assert_eq!(
        &raft::Storage::snapshot(&again, 0, 0)
            .expect("the leader's")
            .data[..],
        b"state at 20"
    );
    // Closed while one is written: waited for, and opens from either.
    drop(again);
    log.append(&[entry(21, 3)]).expect("append");
    log.set_hardstate(hs(3, 1, 21)).expect("hs");
    log.compact(21, data(b"state at 21"), Instant::now())
        .expect("compact");
    drop(log);
    let last = open(&disk.crash(None)).expect("reopen");
    assert_eq!(last.snapshot_index(), 21);
    assert_eq!(last.mem.last_index().expect("last"), 21);
}

/// A sync started while the log goes on being written (a leader's
/// pipelined round): `raft-state` then says what was written before it
/// started, not what came after; the log stays to be synced; a sync whose
/// log was rewritten meanwhile (a compaction: its new generation synced
/// whole) records nothing.
#[test]
fn a_sync_under_way_records_what_was_written_before_it_started() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    log.witness_behind().expect("its thread");
    log.append(&[entry(1, 1), entry(2, 1)]).expect("append");
    let (mut file, mark) = log.start_sync().expect("start").expect("written");
    log.append(&[entry(3, 1)]).expect("written meanwhile");
    file.sync().expect("the sync");
    log.synced(mark, std::time::Duration::ZERO).expect("synced");
    assert_eq!(log.anchor().last, 2, "as of its start");
    assert!(log.is_dirty(), "entry 3 is still to sync");
    let (mut file, mark) = log.start_sync().expect("start").expect("written");
    file.sync().expect("the sync");
    log.synced(mark, std::time::Duration::ZERO).expect("synced");
    assert_eq!(log.anchor().last, 3);
    assert!(!log.is_dirty());
    assert!(
        log.start_sync().expect("start").is_none(),
        "nothing to sync"
    );
    // Rewritten while a sync is under way: it records nothing.
    log.append(&[entry(4, 1)]).expect("append");
    let (_file, mark) = log.start_sync().expect("start").expect("written");
    log.set_hardstate(hs(1, 1, 4)).expect("hs");
    log.compact(4, data(b"state at 4"), Instant::now())
        .expect("compact");
    let after = log.anchor();
    log.synced(mark, std::time::Duration::ZERO).expect("synced");
    assert_eq!(log.anchor(), after, "the rewrite's record stands");
    log.sync().expect("settles");
    let back = open(&disk.crash(None)).expect("reopen");
    assert_eq!(back.snapshot_index(), 4);
}

/// A log on real files that synced entries 1 to 20 (term 2, voted for
/// 3, committed 20), with the snapshot at 8 when `snapshot`.
fn synced_log(dir: &std::path::Path, snapshot: bool) {
    let _ = std::fs::remove_dir_all(dir);
    let disk = crate::store::storage::DirStorage::open(dir).expect("dir");
    let mut log = LogStore::open(Arc::new(disk), &[1, 2, 3]).expect("open");
    let entries: Vec<Entry> = (1..=20).map(|i| entry(i, 2)).collect();
    log.append(&entries).expect("append");
    log.set_hardstate(hs(2, 3, 20)).expect("hs");
    log.sync().expect("sync");
    if snapshot {
        log.compact(8, data(b"state at 8"), Instant::now())
            .expect("compact");
    }
    assert_eq!(log.anchor().last, 20);
    assert_eq!(log.anchor().term, 2);
}

fn open_dir(dir: &std::path::Path) -> Result<LogStore> {
    let disk = crate::store::storage::DirStorage::open(dir).expect("dir");
    LogStore::open(Arc::new(disk), &[1, 2, 3])
}

fn current_log(dir: &std::path::Path) -> std::path::PathBuf {
    let g = std::fs::read_to_string(dir.join(CURRENT)).expect("current");
    dir.join(log_name(g.trim().parse().expect("a number")))
}

/// On real files: a log that lost what `raft-state` says it held
/// refuses to start, saying what is missing and how to recover, for
/// each way it can be lost; `cluster rejoin` then keeps the term and
/// vote and starts it as a joining replica with an empty log.
#[test]
fn a_log_that_lost_what_it_held_refuses_to_start_and_can_rejoin() {
    let dir = std::env::temp_dir().join(format!("statestore-anchor-{}", std::process::id()));
    type Damage = fn(&std::path::Path);
    let cases: [(&str, bool, Damage, &str); 7] = [
        (
            "deleted",
            false,
            |d| std::fs::remove_file(current_log(d)).expect("rm"),
            "is missing",
        ),
        (
            "emptied",
            false,
            |d| std::fs::write(current_log(d), b"").expect("empty"),
            "holds no entries",
        ),
        (
            "cut at a record",
            false,
            |d| {
                // The last record (the hard state) and the last entry go.
                let p = current_log(d);
                let data = std::fs::read(&p).expect("read");
                let parsed = parse(&data, "log").expect("parse");
                let tail: usize = parsed.records[parsed.records.len() - 2..]
                    .iter()
                    .map(|(_, b)| 9 + b.len())
                    .sum();
                std::fs::write(&p, &data[..parsed.good - tail]).expect("cut");
            },
            "was cut short",
        ),
        (
            "cut inside a record",
            false,
            |d| {
                let p = current_log(d);
                let data = std::fs::read(&p).expect("read");
                let end = parse(&data, "log").expect("parse").good;
                std::fs::write(&p, &data[..end / 2 + 3]).expect("cut");
            },
            "cut inside a record",
        ),
        (
            "a missing generation",
            false,
            |d| std::fs::write(d.join(CURRENT), b"99").expect("current"),
            "raft-log.99 is missing",
        ),
        (
            "raft-log.current deleted",
            false,
            |d| std::fs::remove_file(d.join(CURRENT)).expect("rm"),
            "raft-log.current is missing",
        ),
        (
            "the snapshot deleted",
            true,
            |d| std::fs::remove_file(d.join(SNAPSHOT)).expect("rm"),
            "raft-snapshot is missing",
        ),
    ];
    for (what, snapshot, damage, says) in cases {
        synced_log(&dir, snapshot);
        // Intact: it opens with all of it.
        let back = open_dir(&dir).expect("intact");
        assert_eq!(back.mem.last_index().expect("last"), 20, "{what}");
        drop(back);
        damage(&dir);
        let e = format!(
            "{:#}",
            open_dir(&dir)
                .err()
                .unwrap_or_else(|| panic!("{what}: opened"))
        );
        assert!(e.contains(says), "{what}: {e}");
        assert!(
            e.contains("refusing to start") && e.contains("cluster rejoin"),
            "{what}: {e}"
        );
        // And again: refusing did not change anything.
        assert!(open_dir(&dir).is_err(), "{what}");
        let disk = crate::store::storage::DirStorage::open(&dir).expect("dir");
        let said = rejoin(&disk, 1_000, &[]).expect("rejoin");
        assert!(said.contains("term 2, vote 3 kept"), "{said}");
        drop(disk);
        let back = open_dir(&dir).expect("rejoined");
        assert_eq!(back.mem.last_index().expect("last"), 0, "{what}");
        assert_eq!(back.hard_state().term, 2);
        assert_eq!(back.hard_state().vote, 3);
        assert!(voters(&back).is_empty(), "joining");
        drop(back);
        let kept = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("discarded-1000."))
            .count();
        assert!(kept >= 2, "{what}: moved aside, not deleted");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A replica of several groups rejoins each group's log with the newest
/// term and vote among its files and its parts of the round journal (which
/// may be newer: under the journal a log's files are synced at
/// checkpoints only).
#[test]
fn a_log_rejoins_with_the_journal_s_newer_term_and_vote() {
    let dir =
        std::env::temp_dir().join(format!("statestore-rejoin-journal-{}", std::process::id()));
    synced_log(&dir, false);
    let mut bytes = Vec::new();
    let newer = HardState {
        term: 7,
        vote: 1,
        commit: 20,
        ..HardState::default()
    };
    frame(
        KIND_HARD_STATE,
        &newer.write_to_bytes().expect("hs"),
        &mut bytes,
    );
    let part = journal::Part {
        generation: 1,
        at: 0,
        bytes,
    };
    let disk = crate::store::storage::DirStorage::open(&dir).expect("dir");
    let said = rejoin(&disk, 1_000, &[&part]).expect("rejoin");
    assert!(said.contains("term 7, vote 1 kept"), "{said}");
    drop(disk);
    let back = open_dir(&dir).expect("rejoined");
    assert_eq!((back.hard_state().term, back.hard_state().vote), (7, 1));
    drop(back);
    // An older one does not take the files' place.
    let older = journal::Part {
        generation: 1,
        at: 0,
        bytes: {
            let mut b = Vec::new();
            let h = HardState {
                term: 3,
                vote: 2,
                ..HardState::default()
            };
            frame(KIND_HARD_STATE, &h.write_to_bytes().expect("hs"), &mut b);
            b
        },
    };
    let disk = crate::store::storage::DirStorage::open(&dir).expect("dir");
    let said = rejoin(&disk, 2_000, &[&older]).expect("rejoin again");
    assert!(said.contains("term 7, vote 1 kept"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A vote recorded in `raft-state` survives a log that lost it: the
/// replica never votes twice in one term.
#[test]
fn the_term_and_vote_come_from_raft_state_when_the_log_lost_them() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    log.set_hardstate(hs(5, 2, 0)).expect("a vote");
    // Synced at once (a vote), whatever the policy: no sync() here.
    drop(log);
    let after = disk.crash(None);
    let back = open(&after).expect("reopen");
    assert_eq!((back.hard_state().term, back.hard_state().vote), (5, 2));
    // The log file gone, an empty one in its place: raft-state says 5/2.
    drop(back);
    let g: u64 = String::from_utf8(after.read(CURRENT).expect("current"))
        .expect("utf8")
        .trim()
        .parse()
        .expect("n");
    after.truncate(&log_name(g), 0).expect("empty");
    let back = open(&after.crash(None)).expect("nothing it held is lost (no entries)");
    assert_eq!((back.hard_state().term, back.hard_state().vote), (5, 2));
}

/// A new leader's entries replacing a longer tail shrink the log:
/// `raft-state` says so first, so a crash after does not look like a
/// lost log.
#[test]
fn a_replaced_tail_is_not_taken_for_a_lost_one() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    log.append(&[entry(1, 1), entry(2, 1), entry(3, 1)])
        .expect("append");
    log.sync().expect("sync");
    assert_eq!(log.anchor().last, 3);
    log.append(&[entry(2, 2)]).expect("a new leader's entry 2");
    assert_eq!(log.anchor().last, 1, "recorded before the write");
    // Crash before the new entry is synced: what is on disk is 1..3,
    // or 1 and the torn start of the new record; both open.
    for torn in [0, 10, usize::MAX] {
        let back = open(&disk.crash(Some(torn))).expect("opens");
        assert!(back.mem.last_index().expect("last") >= 1);
    }
}

/// The zeros a file is filled with ahead of its records are its end; a
/// record cut short before them is a torn tail, and one before good
/// records is damage.
#[test]
fn a_zero_filled_tail_is_the_end_not_a_tear() {
    let mut data = Vec::new();
    frame(
        KIND_ENTRY,
        &entry(1, 1).write_to_bytes().expect("e"),
        &mut data,
    );
    let end = data.len();
    data.resize(end + 4096, 0);
    let parsed = parse(&data, "log").expect("parse");
    assert_eq!(
        (parsed.records.len(), parsed.good, parsed.torn),
        (1, end, false)
    );
    let mut torn = data.clone();
    torn[end..end + 6].copy_from_slice(&[9, 0, 0, 0, 1, 2]);
    let parsed = parse(&torn, "log").expect("parse");
    assert_eq!(
        (parsed.records.len(), parsed.good, parsed.torn),
        (1, end, true)
    );
    let mut damaged = data.clone();
    damaged[4] ^= 1;
    frame(
        KIND_ENTRY,
        &entry(2, 1).write_to_bytes().expect("e"),
        &mut damaged,
    );
    assert!(parse(&damaged, "log").is_err(), "damage, not a tear");
}

/// What `disk` holds after a crash, its log's last record cut short by 3
/// bytes (a log that lost part of what it synced).
fn last_entry_cut(disk: &Disk) -> Disk {
    let name = disk
        .list()
        .expect("list")
        .into_iter()
        .find(|n| n.starts_with("raft-log.") && n != "raft-log.current")
        .expect("the log");
    let records = parse(&disk.read(&name).expect("the log"), "log").expect("parse");
    let cut = disk.crash(None);
    cut.truncate(&name, records.good as u64 - 3)
        .expect("cut the last entry");
    cut
}

/// `raft-state` written behind (its own thread, [`LogStore::witness_behind`]):
/// a round synced and not yet witnessed opens after a crash (`raft-state` a
/// round behind); a witnessed round is protected as before (its log cut
/// short is refused); a record written at once (a log about to shrink)
/// comes after the one handed over, never before.
#[test]
fn raft_state_written_behind_keeps_its_order_and_its_watch() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    log.witness_behind().expect("its thread");
    log.append(&[entry(1, 1), entry(2, 1), entry(3, 1)])
        .expect("append");
    log.sync_entries().expect("sync");
    assert_eq!(log.anchor().last, 0, "not witnessed yet");
    let back = open(&disk.crash(None)).expect("raft-state a round behind opens");
    assert_eq!(back.mem.last_index().expect("last"), 3);
    drop(back);
    log.witness().expect("handed over");
    log.sync().expect("settles");
    let cut = last_entry_cut(&disk);
    let refused = open(&cut).expect_err("a witnessed round cut short");
    assert!(
        format!("{refused:#}").contains("refusing to start"),
        "{refused:#}"
    );

    // Handed over, then a shrink recorded at once: the shrink is last.
    log.append(&[entry(4, 1)]).expect("append");
    log.sync_entries().expect("sync");
    log.witness().expect("handed over");
    log.append(&[entry(3, 2)]).expect("a new leader's entry 3");
    assert_eq!(log.anchor().last, 2, "recorded before the write");
    log.sync_entries().expect("sync");
    log.witness().expect("handed over");
    drop(log);
    // Had the record of entry 4 been written after the shrink's, the log
    // (now ending at 3) would look cut short.
    let back = open(&disk.crash(None)).expect("opens");
    assert_eq!(back.mem.last_index().expect("last"), 3);
}

/// Written behind, every round's record is appended to `raft-state` (a
/// process that dies leaves it to the kernel) and synced by its thread at
/// most once every [`witness::EVERY`]: rounds faster than that share a
/// sync; a crash of the machine in between opens (`raft-state` behind); the
/// log settled, the last round is witnessed durably.
#[test]
fn raft_state_written_behind_shares_its_syncs() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    log.witness_behind().expect("its thread");
    let anchor = |disk: &Disk| {
        read_anchor(disk, &[STATE.to_string()])
            .expect("read")
            .expect("an anchor")
    };
    let syncs = disk.syncs(STATE);
    let rounds = 400;
    for i in 1..=rounds {
        log.append(&[entry(i, 1)]).expect("append");
        log.sync_entries().expect("sync");
        log.witness().expect("handed over");
        assert_eq!(anchor(&disk).last, i, "appended at once");
    }
    let back = open(&disk.crash(None)).expect("raft-state behind opens");
    assert_eq!(back.mem.last_index().expect("last"), rounds);
    drop(back);
    log.sync().expect("settles");
    let synced = disk.syncs(STATE) - syncs;
    // In memory, the rounds take a few milliseconds: a sync each would be
    // 400; a stall of the test's thread adds one per `EVERY` at most.
    assert!(
        synced < rounds / 2,
        "{synced} syncs of raft-state for {rounds} rounds"
    );
    assert_eq!(
        anchor(&disk.crash(None)).last,
        rounds,
        "synced once settled"
    );
    drop(log);
    let cut = last_entry_cut(&disk);
    assert!(open(&cut).is_err(), "the last round is witnessed");
}

/// Records appended after `raft-state`'s last sync may reach the disk in
/// any order when the machine loses power: a bad record with good ones
/// after it is skipped and the last good one read; a bad tail is cut.
#[test]
fn raft_state_reads_past_a_record_the_disk_lost() {
    let disk = Disk::new();
    drop(open(&disk).expect("open"));
    let first = read_anchor(&disk, &[STATE.to_string()])
        .expect("read")
        .expect("an anchor");
    let record = |last: u64| {
        let mut b = Vec::new();
        frame(KIND_STATE, &Anchor { last, ..first }.encode(), &mut b);
        b
    };
    let (a, b, c) = (record(7), record(8), record(9));
    let mut lost = [a.clone(), vec![0; b.len()], c.clone()].concat();
    let read = |bytes: &[u8]| {
        let disk = Disk::new();
        disk.write_atomic(STATE, bytes).expect("write");
        read_anchor(&disk, &[STATE.to_string()]).expect("read")
    };
    assert_eq!(read(&lost).expect("an anchor").last, 9, "a hole skipped");
    lost[a.len() + 3] ^= 0xff;
    assert_eq!(read(&lost).expect("an anchor").last, 9);
    let torn = [a.clone(), b[..b.len() - 2].to_vec()].concat();
    assert_eq!(read(&torn).expect("an anchor").last, 7, "a torn tail");
    let mut flipped = [a, b, c].concat();
    let at = flipped.len() - 3;
    flipped[at] ^= 0x01;
    assert_eq!(read(&flipped).expect("an anchor").last, 8, "a bad tail");
}

/// `raft_state = "first"` ([`LogStore::anchor_first`]): a round's sync
/// records `raft-state` before it returns, so a log cut short right after
/// it is refused with nothing else written.
#[test]
fn raft_state_first_is_recorded_before_the_round_s_messages() {
    let disk = Disk::new();
    let mut log = open(&disk).expect("open");
    log.anchor_first();
    log.append(&[entry(1, 1), entry(2, 1)]).expect("append");
    log.sync_entries().expect("sync");
    assert_eq!(log.anchor().last, 2, "recorded at once");
    let cut = last_entry_cut(&disk);
    assert!(open(&cut).is_err(), "a synced round cut short");
}
