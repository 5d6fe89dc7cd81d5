//! The whole cluster in one thread, under a simulated clock and network,
//! replayable from a seed (the FoundationDB / TigerBeetle way): replicas
//! with the native build of the guest, each with the server's own
//! [`Router`] (clients on every replica; followers forward to the leader),
//! a network that loses, delays and reorders messages and cuts one replica
//! off for a while (both ways, or only what is sent to it), replicas that
//! crash and restart from their log, clocks that are skewed and jump.
//!
//! Checked in every run:
//! - **One meaning for every answer**: no request is answered twice
//!   differently, and none answered 503 ("not applied") is ever applied.
//! - **A log never silently shrinks**: a crash may also delete, empty or
//!   cut a replica's log file, point `raft-log.current` at a missing
//!   generation or delete its snapshot; the replica
//!   either finds all it had synced or refuses to start, and then rejoins
//!   (keeping its term and vote). The checks below catch any write that
//!   got lost instead.
//! - **Snapshots written behind**: a compaction's snapshot file is written
//!   ticks after the compaction began, as a server's thread writes it; the
//!   log is compacted at a later poll still; crashes come in between.
//! - **`raft-state` behind** with one partition: the records that witness
//!   a round's sync are synced ticks later, as a server's thread syncs them
//!   (a crash that damages the log keeps them, as a dead process's page
//!   cache does).
//! - **Pipelined rounds** with one partition: replicas start and stop
//!   handing their readies back before their logs are synced, as a
//!   server's do (`cluster::pipeline`); a sync ends ticks later, or a
//!   crash comes first.
//! - **One sync per round** with partitions: each replica makes its
//!   groups' records durable as a server does, through its round journal
//!   (`cluster::log::journal`), checkpointed often; a crash keeps what was
//!   synced and a torn tail of each file.
//! - **Determinism**: every replica that applies log entry `i` makes
//!   exactly the outputs every other replica made of it (and itself, after
//!   a restart).
//! - **No acknowledged write is lost**: every SET a client got `+OK` for
//!   reads back with its value, during the run and after it: half the
//!   GETs through the log (proposed by the leader), half with a read index
//!   on any replica that is up (a follower waits until it has applied the
//!   leader's commit index), and both kinds in the hot keys' histories that
//!   the linearizability checker reads.
//! - **Same prefix, same state**: once faults stop and every replica has
//!   applied the same index, their snapshots are identical.
//! - **Notifications in order**: clients register KEYNOTIFY on the hot
//!   keys; with [`Notify::Everywhere`] (the embedded broker) each replica's
//!   notifications of a key must come in the order of its versions; with
//!   [`Notify::Origin`] (an external broker) those that do not are counted.
//!
//! A failure names its seed; `run(seed, ..)` replays it exactly (the
//! replicas' election timeouts are fixed per replica, and everything random
//! comes from the seed).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use std::sync::Arc;

use raft::prelude::MessageType;
use statestore_guest::rpc::REQUEST_TOPIC;

mod behind;
mod clients;
mod network;
mod poison;
mod round;
mod settled;

use clients::{Clients, client_request};
use network::{Cut, Wire, carry_out};
use poison::Poisonable;
use round::Round;

use super::file::ReadPath;
use super::log::journal::{self, Journal, Part};
use super::router::{Effects, Limits, Notify, Now, Router, SharedBytes};
use super::{Applying, Compaction, Durability, LogStore, Replica, Timing, linear};
use crate::store::storage::MemStorage;
use crate::{Config, InboundMessage, NativeStore, Output};

/// A tick of simulated time, ms.
const TICK_MS: u64 = 10;
/// Simulated time starts here (ms since the epoch).
const T0: u64 = 1_700_000_000_000;

/// What a run does.
#[derive(Debug, Clone)]
pub struct Options {
    /// Replicas (3 or 5).
    pub replicas: usize,
    /// Ticks with faults and load.
    pub ticks: u64,
    /// Per mille of messages lost.
    pub loss: u64,
    /// Longest delay of a message, ticks (delays reorder).
    pub max_delay: u64,
    /// Per mille chance per tick that a replica crashes (at most one down).
    pub crash: u64,
    /// Per mille chance per tick that a replica is cut off for a while.
    pub partition: u64,
    /// Per mille chance per tick of a client request.
    pub load: u64,
    /// Per mille chance per tick that a follower is replaced while the
    /// cluster runs: removed from the membership, then a new replica (a
    /// new id, an empty disk) joins and catches up from a snapshot.
    pub replace: u64,
    /// Per mille chance that a crash also damages the disk: its log file
    /// deleted, emptied or truncated anywhere, `raft-log.current` naming a
    /// missing generation, or its snapshot deleted. A replica that finds
    /// its log holds less than `raft-state` records refuses to start, and
    /// rejoins (`statestore cluster rejoin`).
    pub damage: u64,
    /// The store in this many key partitions: each replica runs one Raft
    /// group per partition (its own log on its own disk, its own router),
    /// clients' requests go to their key's partition and SCAN pages are
    /// rewritten as a server does ([`super::partition`]). With more than
    /// one, membership changes and rejoins are not simulated (a store in
    /// partitions refuses them), so neither are replacements or damage.
    pub partitions: u32,
    /// Who publishes notifications: every replica to its own broker's
    /// sessions ([`Notify::Everywhere`], the embedded broker: each
    /// replica's notifications of a key must come in the order of the
    /// key's versions), or the replica that took the change
    /// ([`Notify::Origin`], an external broker: counted when they do not,
    /// [`Report::notify_reordered`]).
    pub notify: Notify,
    /// Per mille chance per tick that a replica of one group starts or
    /// stops pipelining its rounds, as a server's does while its own
    /// clients send it requests (`pipelined`): its log synced one to three
    /// ticks after its round went on.
    pub pipeline: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            replicas: 3,
            ticks: 1_500,
            loss: 50,
            max_delay: 5,
            crash: 4,
            partition: 4,
            load: 500,
            replace: 1,
            damage: 300,
            partitions: 1,
            notify: Notify::Origin,
            pipeline: 50,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// SETs acknowledged `+OK`.
    pub acknowledged: usize,
    /// GETs of acknowledged keys that were answered (and checked).
    pub reads: usize,
    /// Crashes and restarts.
    pub crashes: usize,
    /// Times the leader changed.
    pub leader_changes: usize,
    /// Log entries applied (on the replica that applied most).
    pub applied: u64,
    /// Timer entries (expiry proposed by the leader).
    pub timeouts: usize,
    /// Restarts from a crashed disk.
    pub restarts: usize,
    /// Snapshots delivered to replicas behind the leader's log.
    pub snapshots_sent: usize,
    /// Operations on hot keys, checked for linearizability.
    pub hot_ops: usize,
    /// Hot key histories the checker gave up on (its budget).
    pub unknown: usize,
    /// Reads answered with a read index (no log entry).
    pub index_reads: usize,
    /// Replicas replaced by a new one (removed, then a new id added).
    pub replaced: usize,
    /// Requests answered 503: never sent to a leader, never applied.
    pub refused: usize,
    /// Requests answered 408: sent, not applied in time, outcome unknown.
    pub outcome_unknown: usize,
    /// Requests forwarded by a follower to the leader (each time).
    pub forwarded: usize,
    /// Requests held while their replica knew no leader (each time).
    pub held: usize,
    /// Requests sent again to a new leader.
    pub resent: usize,
    /// Requests sent again to the same leader (not applied in time).
    pub retried: usize,
    /// Reads that got no read index in time and went through the log.
    pub reads_to_log: usize,
    /// Crashes that damaged the disk too.
    pub damaged: usize,
    /// Replicas that refused to start on a damaged log and rejoined.
    pub rejoined: usize,
    /// Poison requests answered 500 (the guest failed on them on every
    /// replica, which skipped them alike).
    pub poisoned: usize,
    /// Keys listed by the SCAN of the settled store (each exactly once).
    pub scanned: usize,
    /// Partitions' leaderships handed over to their place.
    pub handed_over: usize,
    /// KEYNOTIFY registrations answered `+OK`.
    pub watches: usize,
    /// Notifications published (each replica's, with
    /// [`Notify::Everywhere`]).
    pub notifications: usize,
    /// With [`Notify::Origin`]: notifications that reached the (external
    /// broker's) observer after one of a later version of the same key:
    /// changes taken by different replicas are published as each applies
    /// them.
    pub notify_reordered: usize,
    /// Times a group stopped its clock for lack of anything to do (the
    /// replicas up at the end), with several groups.
    pub quiet: u64,
    /// Times a quiet group woke for something to do.
    pub woke: u64,
    /// Syncs of pipelined rounds that ended after their round went on.
    pub pipelined_syncs: usize,
    /// Snapshot files written behind, ticks after their compaction began.
    pub snapshots_behind: usize,
    /// Syncs of `raft-state` records held behind (one partition).
    pub state_syncs: usize,
}

/// Steps the linearizability checker may take per history.
const LINEAR_BUDGET: u64 = 20_000_000;

/// The value of a GET reply (`$-1`: none).
fn parse_bulk(payload: &[u8]) -> Option<Vec<u8>> {
    let rest = payload.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\r')?;
    let len: usize = std::str::from_utf8(&rest[..nl]).ok()?.parse().ok()?;
    rest.get(nl + 2..nl + 2 + len).map(<[u8]>::to_vec)
}

/// splitmix64: every random choice of a run.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// A request a client is waiting for.
#[derive(Debug, Clone)]
enum Op {
    /// SET of key `n` to value `n`.
    Set(u64),
    /// GET of key `n`, acknowledged before the GET was sent.
    Get(u64),
    /// SET with a short PX of a key nobody checks (expiry entries).
    Ttl,
    /// SET, GET or DEL of a hot key (of [`HOT_KEYS`]), shared by every
    /// client: its history is checked for linearizability. The event's
    /// index in that key's history.
    Hot(usize, usize),
    /// SET of the key that fails the guest ([`poison::POISON`]): answered
    /// 500 (or 503 / 408), never applied.
    Poison,
    /// KEYNOTIFY of a hot key (by the one client id every request has).
    Watch,
}

/// How often (ticks) leaders of partitions look at their place (a
/// server's second).
const SPREAD_TICKS: u64 = 100;

/// Keys every client writes, reads and deletes concurrently.
const HOT_KEYS: usize = 3;

/// One Raft group of a replica (a partition of the store).
struct Group {
    replica: Replica<Poisonable>,
    /// What it does with its clients' requests (the server's own).
    router: Router,
}

struct SimReplica {
    /// Its groups, one per partition, while it is up.
    up: Option<Vec<Group>>,
    /// Its disks, one per partition: what was synced survives a crash,
    /// with a torn tail. The first holds its round journal too.
    disks: Vec<MemStorage>,
    /// Its round journal, while it is up.
    journal: Option<Journal>,
    /// What its groups' routers hold, counted together.
    bytes: SharedBytes,
    /// Down until this tick.
    down_until: u64,
    /// Its clock's offset from simulated time, ms.
    skew: i64,
    /// Removed from the membership: down for good.
    removed: bool,
    /// Its disk was damaged in its last crash: it may have to rejoin.
    damaged: bool,
    /// Refused to start and rejoined: down until the leader has removed
    /// it and is adding it back.
    rejoining: bool,
    /// Pipelining its rounds (one group only), and its syncs under way.
    pipelining: bool,
    syncs: behind::Syncs,
}

impl SimReplica {
    /// Replica `id` on a new disk, with the membership `ids` (none: it
    /// joins) and a skewed clock.
    fn new(id: u64, ids: &[u64], o: &Options, rng: &mut Rng, base: Instant) -> Result<SimReplica> {
        let disks: Vec<MemStorage> = (0..o.partitions).map(|_| MemStorage::new()).collect();
        let bytes = SharedBytes::default();
        let mut groups = Vec::new();
        for disk in &disks {
            groups.push(Group {
                replica: start(id, ids, disk, None, o.partitions > 1)?,
                router: router(id, base, 0, o.notify, &bytes),
            });
        }
        Ok(SimReplica {
            up: Some(groups),
            journal: new_journal(&disks[0], o)?,
            disks,
            bytes,
            down_until: 0,
            skew: rng.below(4_000) as i64 - 2_000,
            removed: false,
            damaged: false,
            rejoining: false,
            pipelining: false,
            syncs: Default::default(),
        })
    }

    /// Group 0's replica (the membership's), if up.
    fn first(&self) -> Option<&Replica<Poisonable>> {
        self.up.as_ref().map(|g| &g[0].replica)
    }

    /// See [`SimReplica::first`].
    fn first_mut(&mut self) -> Option<&mut Replica<Poisonable>> {
        self.up.as_mut().map(|g| &mut g[0].replica)
    }

    /// Its time at `tick`.
    fn now(&self, base: Instant, tick: u64) -> Now {
        Now {
            at: base + Duration::from_millis(tick * TICK_MS),
            ms: (T0 + tick * TICK_MS).saturating_add_signed(self.skew),
        }
    }
}

/// The routers' timeouts, shorter than a server's so that cuts outlast them.
const LIMITS: Limits = Limits {
    hold: Duration::from_millis(1_000),
    resend_within: Duration::from_millis(3_000),
    retry_after: Duration::from_millis(400),
    read_wait: Duration::from_millis(100),
    timer_every: Duration::from_millis(200),
};

/// Replica `id`'s router (at `tick`): odd replicas answer reads with a
/// read index, even ones through the log.
/// Replica `id`'s router of a group (started at `tick`), counting its bytes
/// with the replica's other groups' (`bytes`) as a server's do.
fn router(id: u64, base: Instant, tick: u64, notify: Notify, bytes: &SharedBytes) -> Router {
    let path = if id % 2 == 1 {
        ReadPath::Index
    } else {
        ReadPath::Log
    };
    let at = base + Duration::from_millis(tick * TICK_MS);
    // Read contexts of a new life never meet an earlier life's.
    let next_read = (id << 48) | (tick << 16);
    let mut router = Router::new(id, config(), None, path, notify, LIMITS, next_read, at);
    router.share(bytes);
    router
}

fn config() -> Config {
    Config::default()
}

/// Snapshots often, so replicas that fall behind catch up from them.
const COMPACTION: Compaction = Compaction {
    entries: 40,
    bytes: 1 << 20,
    follow: 0,
};

/// Replica `id` over `disk`: a new disk starts with the membership `ids`
/// (none: it joins), a used one with what it recorded and what the round
/// journal holds of it (`parts`; `journaled`: its records go through the
/// journal, as a server's do with partitions).
fn start(
    id: u64,
    ids: &[u64],
    disk: &MemStorage,
    parts: Option<&[&Part]>,
    journaled: bool,
) -> Result<Replica<Poisonable>> {
    let log = LogStore::open_with(Arc::new(disk.clone()), ids, parts, journaled)?;
    let make = Box::new(|snapshot: Option<&[u8]>| {
        Ok(Poisonable::new(match snapshot {
            None => NativeStore::new(config())?,
            Some(s) => NativeStore::restore(config(), s)?,
        }))
    });
    let mut replica = Replica::new(id, log, make, timing(id), Durability::Always, COMPACTION)?;
    // Its snapshots written behind, as a server's are, and with one
    // partition its `raft-state` records synced behind (`raft_state =
    // "behind"`): when the simulation chooses (`Sim::background`).
    replica.log_mut().snapshots_held();
    if !journaled {
        replica.log_mut().witness_held();
    }
    if journaled {
        // Several groups, as a server's: the idle ones stop their clocks.
        replica.set_quiet_after(Some(super::quiet::QUIET_AFTER));
    }
    Ok(replica)
}

/// A replica's round journal is checkpointed past this many bytes: often,
/// so that the simulation crashes around checkpoints too.
const CHECKPOINT_BYTES: u64 = 16 << 10;

/// A replica's round journal, on its first disk, started afresh (once its
/// groups were opened with what the last one held), if it has partitions
/// (one partition syncs its log itself, as a server's does).
fn new_journal(disk: &MemStorage, o: &Options) -> Result<Option<Journal>> {
    if o.partitions < 2 {
        return Ok(None);
    }
    Journal::create(Arc::new(disk.clone()), CHECKPOINT_BYTES).map(Some)
}

fn key(n: u64) -> String {
    format!("key-{n}")
}

fn request(parts: &[&[u8]], correlation: u64, now: u64) -> InboundMessage {
    InboundMessage {
        topic: REQUEST_TOPIC.into(),
        payload: statestore_guest::resp3::request(parts),
        qos: 1,
        response_topic: Some("clients/sim/response".into()),
        correlation_data: Some(correlation.to_be_bytes().to_vec()),
        message_expiry_interval: Some(60),
        content_type: None,
        payload_format_indicator: None,
        user_properties: vec![
            ("__ts".into(), format!("{now:015}:00000:sim")),
            ("__protVer".into(), "1.0".into()),
        ],
        client_id: Some("sim".into()),
        received_at: None,
        username: None,
        attributes: Vec::new(),
        via: None,
    }
}

/// Fixed, different election timeouts per replica: runs replay exactly.
fn timing(id: u64) -> Timing {
    let min = 10 + 3 * id as usize;
    Timing {
        heartbeat: 2,
        election_min: min,
        election_max: min + 1,
    }
}

/// The reply to the request with `correlation` among `outputs`.
fn reply_to(outputs: &[Output], correlation: u64) -> Option<&[u8]> {
    outputs.iter().find_map(|o| match o {
        Output::Publish(p)
            if p.correlation_data.as_deref() == Some(&correlation.to_be_bytes()[..]) =>
        {
            Some(&p.payload[..])
        }
        _ => None,
    })
}

/// Runs one seeded simulation; an error says which property broke.
pub fn run(seed: u64, o: &Options) -> Result<Report> {
    let mut sim = Sim::new(seed, o)?;
    let total = o.ticks + 3_000; // the tail: faults stop, the cluster settles
    for tick in 0..total {
        sim.step(tick)?;
    }
    sim.report.acknowledged = sim.clients.acknowledged.len();
    for g in sim.nodes.iter().filter_map(|n| n.up.as_ref()).flatten() {
        let (quiet, woke) = g.replica.quiet_times();
        sim.report.quiet += quiet;
        sim.report.woke += woke;
    }
    sim.check_histories()?;
    sim.check_settled(total)?;
    Ok(sim.report)
}

/// The state of one seeded run.
struct Sim<'o> {
    seed: u64,
    o: &'o Options,
    rng: Rng,
    base: Instant,
    /// The founding replicas.
    ids: Vec<u64>,
    nodes: Vec<SimReplica>,
    /// A replacement under way: the replica being removed, and then the
    /// one joining.
    removing: Option<u64>,
    joining: Option<u64>,
    /// The one joining is a replica that rejoins (removed, added back).
    readding: bool,
    report: Report,
    /// Messages in flight: (deliver at tick, message).
    net: Vec<(u64, Wire)>,
    cut: Option<Cut>,
    /// Outputs of each group's applied index, as the first replica made them.
    outputs_at: HashMap<(u32, u64), (Vec<Output>, super::FailedInputs)>,
    clients: Clients,
    next_corr: u64,
    next_key: u64,
    last_leader: u64,
}

impl<'o> Sim<'o> {
    fn new(seed: u64, o: &'o Options) -> Result<Sim<'o>> {
        let mut rng = Rng(seed);
        let base = Instant::now();
        let ids: Vec<u64> = (1..=o.replicas as u64).collect();
        let mut nodes: Vec<SimReplica> = Vec::new();
        for &id in &ids {
            nodes.push(SimReplica::new(id, &ids, o, &mut rng, base)?);
        }
        Ok(Sim {
            seed,
            o,
            rng,
            base,
            ids,
            nodes,
            removing: None,
            joining: None,
            readding: false,
            report: Report::default(),
            net: Vec::new(),
            cut: None,
            outputs_at: HashMap::new(),
            clients: Clients {
                hot: vec![Vec::new(); HOT_KEYS],
                ..Clients::default()
            },
            next_corr: 0,
            next_key: 0,
            last_leader: 0,
        })
    }

    /// One tick: faults, restarts, deliveries, Raft ticks, membership
    /// changes, client load, then every replica's ready.
    fn step(&mut self, tick: u64) -> Result<()> {
        let faults = tick < self.o.ticks;
        let now_ms = T0 + tick * TICK_MS;
        if faults {
            self.faults(tick)?;
        } else {
            self.cut = None;
        }
        if self.cut.is_some_and(|c| tick >= c.until) {
            self.cut = None;
        }
        self.restarts(tick, now_ms)?;
        self.deliver(tick);
        self.background(tick, faults)?;
        for g in self
            .nodes
            .iter_mut()
            .filter_map(|n| n.up.as_mut())
            .flatten()
        {
            g.replica.tick();
        }
        let leader = self.leader();
        self.membership(tick, leader, faults)?;
        if self.o.partitions > 1 && tick.is_multiple_of(SPREAD_TICKS) {
            self.spread_leaders(tick);
        }
        if faults {
            self.load(tick, now_ms)?;
        }
        self.ready(tick, faults)
    }

    /// Replicas whose down time is over start again (a damaged one is
    /// rejoined, as an operator would).
    fn restarts(&mut self, tick: u64, now_ms: u64) -> Result<()> {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if node.up.is_none() && !node.removed && tick >= node.down_until {
                let id = i as u64 + 1;
                let mut groups = Vec::new();
                let journaled = journal::read(&node.disks[0])?;
                for (p, disk) in node.disks.iter().enumerate() {
                    let parts = journal::parts_of(journaled.as_deref(), p as u32);
                    let journaled = self.o.partitions > 1;
                    let replica = match start(id, &self.ids, disk, parts.as_deref(), journaled) {
                        Ok(r) => r,
                        Err(e)
                            if node.damaged && format!("{e:#}").contains("refusing to start") =>
                        {
                            // The operator's recovery (`cluster rejoin`):
                            // its data directory joins again, keeping the
                            // term and vote; the leader removes it and adds
                            // it back (one partition only: see `damage`).
                            super::log::rejoin(disk, now_ms, &[])?;
                            node.damaged = false;
                            node.rejoining = true;
                            node.down_until = u64::MAX;
                            break;
                        }
                        Err(e) => {
                            return Err(
                                e.context(format!("seed {}: restarting replica {id}", self.seed))
                            );
                        }
                    };
                    groups.push(Group {
                        replica,
                        router: router(id, self.base, tick, self.o.notify, &node.bytes),
                    });
                }
                if node.rejoining {
                    continue;
                }
                node.damaged = false;
                node.up = Some(groups);
                node.syncs = Default::default();
                node.journal = new_journal(&node.disks[0], self.o)?;
                // What was in flight to its last life died with its
                // connections.
                self.net.retain(|(_, w)| w.to() != id);
                self.report.restarts += 1;
            }
        }
        Ok(())
    }

    /// Delivers what is due (unless a cut blocks it).
    fn deliver(&mut self, tick: u64) {
        let mut due = Vec::new();
        self.net.retain(|(at, m)| {
            if *at <= tick {
                due.push(m.clone());
                false
            } else {
                true
            }
        });
        for w in due {
            if self.cut.is_some_and(|c| c.blocks(&w)) {
                continue;
            }
            let node = &mut self.nodes[(w.to() - 1) as usize];
            let now = node.now(self.base, tick);
            let Some(groups) = node.up.as_mut() else {
                continue;
            };
            match w {
                Wire::Raft(g, m) => {
                    if m.get_msg_type() == MessageType::MsgSnapshot {
                        self.report.snapshots_sent += 1;
                    }
                    // A stale or unexpected message is refused by Raft;
                    // that is the network's business, not a failure.
                    let _ = groups[g as usize].replica.step(m);
                }
                Wire::Forward {
                    group, from, batch, ..
                } => {
                    let g = &mut groups[group as usize];
                    g.router.forwarded(now, from, &batch, &mut g.replica);
                }
            }
        }
    }

    /// The leader of the highest term (0: none), counting changes.
    fn leader(&mut self) -> u64 {
        let nodes = &self.nodes;
        let leader = nodes
            .iter()
            .filter_map(SimReplica::first)
            .filter(|r| r.is_leader())
            .map(|r| r.id())
            .max_by_key(|id| nodes[(*id - 1) as usize].first().map(|r| r.term()))
            .unwrap_or(0);
        if leader != 0 && leader != self.last_leader {
            self.report.leader_changes += 1;
            self.last_leader = leader;
        }
        leader
    }

    /// Replacing a follower: remove it, then add a new replica; as the
    /// operator's tools do, only with a leader whose members are settled (a
    /// new one may not have applied its predecessor's last change: a
    /// removal not yet applied looked like a re-addition done).
    fn membership(&mut self, tick: u64, leader: u64, faults: bool) -> Result<()> {
        let settled = leader != 0
            && self.nodes[(leader - 1) as usize]
                .first()
                .is_some_and(Replica::membership_settled);
        if !settled {
            return Ok(());
        }
        let li = (leader - 1) as usize;
        let voters = self.nodes[li].first().expect("the leader is up").voters();
        if let Some(old) = self.removing {
            if voters.contains(&old) {
                // Proposed again until applied (a lost proposal, a new
                // leader); refused while one is in progress.
                if tick.is_multiple_of(20) && old != leader {
                    let r = self.nodes[li].first_mut().expect("up");
                    let _ = r.propose_change(&super::Change::Remove(old));
                }
            } else if self.nodes[(old - 1) as usize].rejoining {
                // Removed: it starts (joining), and is added back.
                let back = &mut self.nodes[(old - 1) as usize];
                back.rejoining = false;
                back.down_until = tick + 1;
                self.removing = None;
                self.joining = Some(old);
                self.readding = true;
            } else {
                // Gone from the membership: down for good; a new one.
                let gone = &mut self.nodes[(old - 1) as usize];
                gone.up = None;
                gone.journal = None;
                gone.syncs = Default::default();
                gone.removed = true;
                self.clients.crashed(old);
                self.removing = None;
                let id = self.nodes.len() as u64 + 1;
                self.nodes
                    .push(SimReplica::new(id, &[], self.o, &mut self.rng, self.base)?);
                self.joining = Some(id);
            }
        } else if let Some(new) = self.joining {
            // Done once every replica up has applied the addition, the new
            // one too: a leader that applied it and then crashed with a
            // damaged log could leave a replica that has not (the entry
            // committed, the commit not yet told) in a configuration of two
            // whose other member waits to be removed: stuck, as it would be
            // for an operator (see `faults`).
            let everywhere = || {
                self.nodes
                    .iter()
                    .filter_map(SimReplica::first)
                    .all(|r| r.voters().contains(&new))
            };
            if voters.contains(&new) {
                if !everywhere() {
                    // Applied by the leader: the others learn the commit.
                    return Ok(());
                }
                self.joining = None;
                if self.readding {
                    self.readding = false;
                    self.report.rejoined += 1;
                } else {
                    self.report.replaced += 1;
                }
            } else if tick.is_multiple_of(20) {
                let r = self.nodes[li].first_mut().expect("up");
                let _ = r.propose_change(&super::Change::Add {
                    id: new,
                    record: Vec::new(),
                });
            }
        } else if let Some(i) = self.nodes.iter().position(|n| n.rejoining) {
            let id = i as u64 + 1;
            let r = self.nodes[li].first_mut().expect("up");
            if r.propose_change(&super::Change::Remove(id)).is_ok() {
                self.removing = Some(id);
            }
        } else if faults
            && self.o.partitions == 1
            && !self.nodes.iter().any(|n| n.damaged)
            && self.rng.chance(self.o.replace)
        {
            let followers: Vec<u64> = voters.iter().copied().filter(|v| *v != leader).collect();
            if !followers.is_empty() {
                let old = followers[self.rng.below(followers.len() as u64) as usize];
                let r = self.nodes[li].first_mut().expect("up");
                if r.propose_change(&super::Change::Remove(old)).is_ok() {
                    self.removing = Some(old);
                }
            }
        }
        Ok(())
    }

    /// Leaderships handed to their partition's place as a server does
    /// ([`super::partition::hand_over`]): to a replica that is up, not cut
    /// off, and has every entry.
    fn spread_leaders(&mut self, tick: u64) {
        let up: Vec<u64> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].up.is_some())
            .map(|i| i as u64 + 1)
            .filter(|id| self.cut.is_none_or(|c| c.replica != *id || tick >= c.until))
            .collect();
        for node in self.nodes.iter_mut() {
            let Some(groups) = node.up.as_mut() else {
                continue;
            };
            for (p, g) in groups.iter_mut().enumerate() {
                let r = &mut g.replica;
                if !r.is_leader() {
                    continue;
                }
                let voters = r.voters();
                if super::partition::place(p as u32, &voters) != Some(r.id()) {
                    r.wake();
                }
                if let Some(to) =
                    super::partition::hand_over(p as u32, &voters, &r.status(), |id| {
                        up.contains(&id)
                    })
                {
                    r.transfer_leader(to);
                    self.report.handed_over += 1;
                }
            }
        }
    }

    /// Client load, through any replica that is up (leader or not).
    fn load(&mut self, tick: u64, now_ms: u64) -> Result<()> {
        let up: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].up.is_some())
            .collect();
        if up.is_empty() || !self.rng.chance(self.o.load) {
            return Ok(());
        }
        let i = up[self.rng.below(up.len() as u64) as usize];
        let now = self.nodes[i].now(self.base, tick);
        self.next_corr += 1;
        let corr = self.next_corr;
        let (op, msg) = client_request(
            &mut self.rng,
            corr,
            now_ms,
            tick,
            &mut self.next_key,
            &mut self.clients,
        );
        self.clients.pending.insert(corr, (op, i as u64 + 1));
        let partitions = self.o.partitions;
        let groups = self.nodes[i].up.as_mut().expect("up");
        for (g, messages) in super::partition::split(vec![msg], partitions)
            .into_iter()
            .enumerate()
        {
            if messages.is_empty() {
                continue;
            }
            let group = &mut groups[g];
            let mut fx = Effects::default();
            group
                .router
                .requests(now, messages, &mut group.replica, &mut fx)?;
            carry_out(
                self.seed,
                tick,
                i as u64 + 1,
                (g as u32, partitions),
                fx,
                self.o,
                true,
                &mut self.rng,
                &mut self.net,
                &mut self.clients,
                &mut self.report,
            )?;
        }
        Ok(())
    }

    /// The routers' ticks (what waited too long is answered; the leader
    /// proposes expiry), then ready: persist, send, apply, publish; as a
    /// server does, every group's new records are made durable (with
    /// partitions together, one sync of the round journal, checkpointed
    /// when full) before what depends on them is sent.
    fn ready(&mut self, tick: u64, faults: bool) -> Result<()> {
        let mut round = Round {
            seed: self.seed,
            tick,
            o: self.o,
            faults,
            rng: &mut self.rng,
            net: &mut self.net,
            clients: &mut self.clients,
            report: &mut self.report,
            outputs_at: &mut self.outputs_at,
        };
        for node in self.nodes.iter_mut() {
            let now = node.now(self.base, tick);
            let Some(groups) = node.up.as_mut() else {
                continue;
            };
            let pipelined = node.pipelining && groups.len() == 1 && groups[0].replica.pipelines();
            if !pipelined && groups.len() == 1 {
                let host = &mut round.on_net();
                behind::drain(&mut node.syncs, &mut groups[0].replica, host)?;
            }
            // As a server's follower without clients does (and at random
            // on any replica, which only delays its replies): apply after
            // the round's sync and messages.
            let applying = match !pipelined && round.rng.chance(500) {
                true => Applying::AfterSync,
                false => Applying::Now,
            };
            let mut written = Vec::new();
            for (g, Group { replica: r, router }) in groups.iter_mut().enumerate() {
                let mut fx = Effects::default();
                router.tick(now, r, &mut fx)?;
                let mut messages = Vec::new();
                let (applied, rest) = r.ready_apply(&mut |m| messages.push(m), applying)?;
                round.publish(g as u32, now, (messages, applied), r, router, fx)?;
                if let Some(rest) = rest {
                    let w = r.ready_write(rest)?;
                    if pipelined {
                        node.syncs.defer(r, w, &mut round.on_net())?;
                    } else {
                        written.push((g, w));
                    }
                }
            }
            let mut wrote = vec![false; groups.len()];
            written.iter().for_each(|(g, w)| wrote[*g] = w.must_sync());
            let replicas = groups.iter_mut().map(|group| &mut group.replica);
            let mut synced: Vec<_> = (0..)
                .zip(replicas.zip(wrote))
                .map(|(g, (r, w))| (g, r, w))
                .collect();
            super::persist_round(node.journal.as_mut(), &mut synced)?;
            for (g, w) in written {
                let Group { replica: r, router } = &mut groups[g];
                let mut messages = Vec::new();
                let applied = r.ready_finish(w, &mut |m| messages.push(m))?;
                let fx = Effects::default();
                round.publish(g as u32, now, (messages, applied), r, router, fx)?;
            }
            if node.journal.is_none() {
                for group in groups.iter_mut() {
                    group.replica.witness()?;
                }
            }
            if let Some(journal) = node.journal.as_mut() {
                let logs = groups.iter_mut().map(|g| g.replica.log_mut());
                journal.checkpoint(None, logs.collect())?;
            }
        }
        Ok(())
    }
}
