//! Which replicas hold which groups, without I/O.
//!
//! A cluster of M replicas whose file says `copies = C` (C < M) keeps each
//! Raft group (a partition of a store, or a tenant's store or partition) on
//! C of them: group `g` on the C replicas that follow, in the order of
//! their ids, the `g mod M`-th one. So the groups' state and writes spread
//! over every machine: each replica holds about C/M of them, and the
//! `g mod M`-th replica, the group's first, is the place of its leader
//! (see [`Placement::place`]). Without `copies` (or `copies = M`) every
//! group is on every replica, as before.
//!
//! ```text
//!   M = 4, C = 3:  group 0 on 1 2 3 | group 1 on 2 3 4 | group 2 on 3 4 1 | group 3 on 4 1 2
//! ```
//!
//! A replica serves clients of every group: what they send to a group it
//! does not hold goes to one that does (its agent for that group, see
//! `super::node`), which serves it as its own clients' and sends the
//! answers back.
//!
//! The formula is where groups start. The cluster may then move a group's
//! copy from one replica to another (`statestore cluster move`): the moves
//! it agreed ([`Moves`], entries of group 0) override the formula for the
//! groups they name, with a version that grows with every change, so every
//! replica (group 0's or not, told by its peers) ends with the same
//! placement. One move at a time; see `super::node` for how a move is
//! carried out.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, bail};

/// Where the groups of a cluster are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The ids of the replicas the cluster was made with, in order: the
    /// formula's.
    members: Vec<u64>,
    /// How many of them hold each group.
    copies: usize,
    /// The moves agreed since the formula.
    moves: Moves,
}

/// A group's copy moving from one replica to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The group.
    pub group: u32,
    /// The replica it leaves.
    pub from: u64,
    /// The replica it goes to.
    pub to: u64,
}

/// The moves the cluster agreed: where the groups they name are now, and
/// the one under way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moves {
    /// Grows by one with every change agreed (0: none ever).
    pub version: u64,
    /// The replicas of each group moved, its place first.
    pub hosts: BTreeMap<u32, Vec<u64>>,
    /// The move under way, if one is: its group is already on its new
    /// replicas (`hosts`); its old one keeps its copy until the move is
    /// settled.
    pub moving: Option<Move>,
    /// The members added while running, with their address records
    /// (`raft=<addr> [mqtt=<addr>]`).
    pub joined: BTreeMap<u64, Vec<u8>>,
    /// The members being removed: their groups move away, then they leave.
    pub draining: BTreeSet<u64>,
    /// The members removed (their ids are not used again).
    pub left: BTreeSet<u64>,
    /// The tenants the cluster added and removed while running (group
    /// 0's), for the replicas not holding it.
    pub tenants: super::Tenancy,
}

/// The most groups [`Moves::decode`] takes (a group count's bound).
const MOVES_MAX: u32 = 1 << 20;

impl Moves {
    /// `u64 version, u32 count, per group u32 group, u8 count, u64 host...,
    /// then u8 0, or u8 1, u32 group, u64 from, u64 to` (the move under
    /// way), then `u32 count, per member joined u64 id, u32 length, record`,
    /// the members draining and those left, each `u32 count, u64 id...`,
    /// then the tenants (as a Raft snapshot has them).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.version.to_le_bytes().to_vec();
        out.extend_from_slice(&(self.hosts.len() as u32).to_le_bytes());
        for (g, hosts) in &self.hosts {
            out.extend_from_slice(&g.to_le_bytes());
            out.push(hosts.len() as u8);
            hosts
                .iter()
                .for_each(|h| out.extend_from_slice(&h.to_le_bytes()));
        }
        match self.moving {
            None => out.push(0),
            Some(m) => {
                out.push(1);
                out.extend_from_slice(&m.group.to_le_bytes());
                out.extend_from_slice(&m.from.to_le_bytes());
                out.extend_from_slice(&m.to.to_le_bytes());
            }
        }
        out.extend_from_slice(&(self.joined.len() as u32).to_le_bytes());
        for (id, record) in &self.joined {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&(record.len() as u32).to_le_bytes());
            out.extend_from_slice(record);
        }
        for set in [&self.draining, &self.left] {
            out.extend_from_slice(&(set.len() as u32).to_le_bytes());
            set.iter()
                .for_each(|id| out.extend_from_slice(&id.to_le_bytes()));
        }
        super::format::encode_tenancy(&self.tenants, &mut out);
        out
    }

    /// Reads what [`Moves::encode`] wrote (from a peer or a file: anything
    /// else is an error, never a panic).
    pub fn decode(mut bytes: &[u8]) -> Result<Moves> {
        fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
            if rest.len() < n {
                bail!("a placement cut short");
            }
            let (head, tail) = rest.split_at(n);
            *rest = tail;
            Ok(head)
        }
        let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let version = u64_of(take(&mut bytes, 8)?);
        let count = u32_of(take(&mut bytes, 4)?);
        if count > MOVES_MAX {
            bail!("a placement of {count} groups");
        }
        let mut hosts = BTreeMap::new();
        for _ in 0..count {
            let g = u32_of(take(&mut bytes, 4)?);
            let n = take(&mut bytes, 1)?[0];
            let list = (0..n)
                .map(|_| take(&mut bytes, 8).map(u64_of))
                .collect::<Result<Vec<u64>>>()?;
            if list.is_empty() {
                bail!("group {g} placed on no replica");
            }
            hosts.insert(g, list);
        }
        let moving = match take(&mut bytes, 1)?[0] {
            0 => None,
            1 => Some(Move {
                group: u32_of(take(&mut bytes, 4)?),
                from: u64_of(take(&mut bytes, 8)?),
                to: u64_of(take(&mut bytes, 8)?),
            }),
            other => bail!("a placement's move marked {other}"),
        };
        let count = u32_of(take(&mut bytes, 4)?);
        if count > MOVES_MAX {
            bail!("a placement of {count} members");
        }
        let mut joined = BTreeMap::new();
        for _ in 0..count {
            let id = u64_of(take(&mut bytes, 8)?);
            let len = u32_of(take(&mut bytes, 4)?) as usize;
            joined.insert(id, take(&mut bytes, len)?.to_vec());
        }
        let mut sets = [BTreeSet::new(), BTreeSet::new()];
        for set in &mut sets {
            let count = u32_of(take(&mut bytes, 4)?);
            if count > MOVES_MAX {
                bail!("a placement of {count} members");
            }
            for _ in 0..count {
                set.insert(u64_of(take(&mut bytes, 8)?));
            }
        }
        let [draining, left] = sets;
        let tenants = super::format::decode_tenancy(&mut bytes)?;
        if !bytes.is_empty() {
            bail!("{} bytes after a placement", bytes.len());
        }
        Ok(Moves {
            version,
            hosts,
            moving,
            joined,
            draining,
            left,
            tenants,
        })
    }

    /// Starts move `m` (its group now on `hosts`), agreed at `version`:
    /// taken only at this version (a proposal made from an older placement
    /// is skipped) and while no other move is under way, but one that sends
    /// the group under way elsewhere (from the replica it was going to: one
    /// that is down, say), or back.
    pub fn start(&mut self, version: u64, m: Move, hosts: Vec<u64>) -> bool {
        let redirects = |cur: Move| cur.group == m.group && cur.to == m.from;
        if version != self.version
            || self.moving.is_some_and(|cur| !redirects(cur))
            || hosts.is_empty()
            || !hosts.contains(&m.to)
            || hosts.contains(&m.from)
        {
            return false;
        }
        self.hosts.insert(m.group, hosts);
        self.moving = Some(m);
        self.version += 1;
        true
    }

    /// Replica `id` joins the members, reached as `record` says, agreed
    /// at `version` (not a member, nor one that left).
    pub fn join(&mut self, version: u64, id: u64, record: Vec<u8>) -> bool {
        if version != self.version || self.left.contains(&id) || self.joined.contains_key(&id) {
            return false;
        }
        self.joined.insert(id, record);
        self.version += 1;
        true
    }

    /// Member `id` is being removed, agreed at `version`: its groups move
    /// away.
    pub fn drain(&mut self, version: u64, id: u64) -> bool {
        if version != self.version || self.left.contains(&id) || !self.draining.insert(id) {
            return false;
        }
        self.version += 1;
        true
    }

    /// Member `id` (drained) leaves, agreed at `version`.
    pub fn leave(&mut self, version: u64, id: u64) -> bool {
        if version != self.version || !self.draining.remove(&id) {
            return false;
        }
        // Its address record stays: a replica that left while it was
        // down is told so when it comes back.
        self.left.insert(id);
        self.version += 1;
        true
    }

    /// Settles the move of `group` under way at `version`: its old
    /// replica drops its copy.
    pub fn settle(&mut self, version: u64, group: u32) -> bool {
        if version != self.version || self.moving.is_none_or(|m| m.group != group) {
            return false;
        }
        self.moving = None;
        self.version += 1;
        true
    }
}

impl Placement {
    /// The placement of a cluster of `members` (ids, in any order) keeping
    /// each group on `copies` of them (all of them when `None`, or more
    /// than there are).
    pub fn new(members: &[u64], copies: Option<usize>) -> Placement {
        let mut members = members.to_vec();
        members.sort_unstable();
        members.dedup();
        let copies = copies
            .unwrap_or(members.len())
            .clamp(1, members.len().max(1));
        Placement {
            members,
            copies,
            moves: Moves::default(),
        }
    }

    /// The moves agreed since the formula.
    pub fn moves(&self) -> &Moves {
        &self.moves
    }

    /// Takes `moves` if they are newer than those it has (whether it did).
    pub fn set_moves(&mut self, moves: Moves) -> bool {
        if moves.version <= self.moves.version {
            return false;
        }
        self.moves = moves;
        true
    }

    /// The replica group `g` is moving to, while it is.
    pub fn joining(&self, g: u32) -> Option<u64> {
        self.moves.moving.filter(|m| m.group == g).map(|m| m.to)
    }

    /// The replicas holding group `g` by the formula (before any move).
    pub fn formula_hosts(&self, g: u32) -> Vec<u64> {
        let m = self.members.len();
        if m == 0 {
            return Vec::new();
        }
        let start = g as usize % m;
        (0..self.copies)
            .map(|k| self.members[(start + k) % m])
            .collect()
    }

    /// The members now, in order: those the cluster was made with, and
    /// those added while running, but those removed.
    pub fn members(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self
            .members
            .iter()
            .copied()
            .chain(self.moves.joined.keys().copied())
            .filter(|id| !self.moves.left.contains(id))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Whether replica `id` is a member now.
    pub fn is_member(&self, id: u64) -> bool {
        !self.moves.left.contains(&id)
            && (self.members.contains(&id) || self.moves.joined.contains_key(&id))
    }

    /// How many replicas hold each group.
    pub fn copies(&self) -> usize {
        self.copies
    }

    /// Whether every group is on every replica.
    pub fn everywhere(&self) -> bool {
        self.copies >= self.members.len()
    }

    /// The replicas holding group `g`, its place first (where the moves
    /// put it, or the formula).
    pub fn hosts(&self, g: u32) -> Vec<u64> {
        match self.moves.hosts.get(&g) {
            Some(hosts) => hosts.clone(),
            None => self.formula_hosts(g),
        }
    }

    /// Whether replica `id` holds group `g`.
    pub fn holds(&self, id: u64, g: u32) -> bool {
        self.hosts(g).contains(&id)
    }

    /// The replicas not holding group `g` (to whom its leader sends their
    /// clients' notifications).
    pub fn outsiders(&self, g: u32) -> Vec<u64> {
        let hosts = self.hosts(g);
        self.members()
            .into_iter()
            .filter(|id| !hosts.contains(id))
            .collect()
    }

    /// The groups (of `count`) that replica `id` holds, in order.
    pub fn held_by(&self, id: u64, count: u32) -> Vec<u32> {
        (0..count).filter(|&g| self.holds(id, g)).collect()
    }

    /// Where group `g`'s leadership belongs when its `voters` are the ones
    /// placed: its first host. `None` when its first host is not a voter
    /// (then [`super::partition::place`] spreads it among the voters).
    pub fn place(&self, g: u32, voters: &[u64]) -> Option<u64> {
        if self.everywhere() {
            return None;
        }
        self.hosts(g)
            .first()
            .copied()
            .filter(|p| voters.contains(p))
    }

    /// A fingerprint of the formula (its members and copies), for peers to
    /// compare (0: every group on every replica). The moves are not in it:
    /// a replica with older ones is linked, and learns the newer.
    pub fn fingerprint(&self) -> u64 {
        if self.everywhere() {
            return 0;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let words = std::iter::once(self.copies as u64).chain(self.members.iter().copied());
        for byte in words.flat_map(u64::to_le_bytes) {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h.max(1)
    }

    /// The agent of replica `me` for group `g` (which it does not hold):
    /// the first of its hosts, in order from its place, that `up` says is
    /// up (the one it is moving to last: it may not have caught up); its
    /// place when none is.
    pub fn agent(&self, g: u32, up: impl Fn(u64) -> bool) -> Option<u64> {
        let hosts = self.hosts(g);
        let joining = self.joining(g);
        hosts
            .iter()
            .copied()
            .filter(|&h| Some(h) != joining)
            .chain(joining)
            .find(|&h| up(h))
            .or_else(|| hosts.first().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_group_is_on_copies_replicas_spread_evenly() {
        let p = Placement::new(&[4, 2, 1, 3], Some(3));
        assert!(!p.everywhere());
        assert_eq!(p.hosts(0), vec![1, 2, 3]);
        assert_eq!(p.hosts(1), vec![2, 3, 4]);
        assert_eq!(p.hosts(2), vec![3, 4, 1]);
        assert_eq!(p.hosts(3), vec![4, 1, 2]);
        assert_eq!(p.hosts(4), vec![1, 2, 3]);
        assert_eq!(p.outsiders(1), vec![1]);
        assert_eq!(p.held_by(1, 8), vec![0, 2, 3, 4, 6, 7]);
        // Every replica holds 3/4 of the groups and is the place of 1/4.
        for id in 1..=4 {
            assert_eq!(p.held_by(id, 400).len(), 300);
            let places = (0..400)
                .filter(|&g| p.place(g, &p.hosts(g)) == Some(id))
                .count();
            assert_eq!(places, 100);
        }
        assert_eq!(p.place(1, &[3, 4]), None, "its place is not a voter");
        assert_eq!(p.agent(1, |id| id == 3), Some(3));
        assert_eq!(p.agent(1, |_| false), Some(2));
    }

    /// A move puts its group on its new replicas at once (the new one
    /// last as an agent until settled); one at a time, each at the version
    /// it was proposed from; the encoding round-trips and refuses garbage.
    #[test]
    fn moves_override_the_formula_one_at_a_time() {
        let mut p = Placement::new(&[1, 2, 3, 4], Some(3));
        let mut moves = p.moves().clone();
        let m = Move {
            group: 1,
            from: 2,
            to: 1,
        };
        assert!(!moves.start(1, m, vec![1, 3, 4]), "an older version's");
        assert!(
            !moves.start(0, m, vec![2, 3, 4]),
            "still on its old replica"
        );
        assert!(moves.start(0, m, vec![1, 3, 4]));
        let other = Move {
            group: 2,
            from: 3,
            to: 2,
        };
        assert!(!moves.start(1, other, vec![2, 4, 1]), "one at a time");
        // Sent elsewhere while under way: from 1 (where it was going) to 2.
        let mut redirected = moves.clone();
        let back = Move {
            group: 1,
            from: 1,
            to: 2,
        };
        assert!(redirected.start(1, back, vec![2, 3, 4]));
        assert_eq!((redirected.version, redirected.moving), (2, Some(back)));
        assert!(p.set_moves(moves.clone()));
        assert!(!p.set_moves(moves.clone()), "not newer");
        assert_eq!(p.hosts(1), vec![1, 3, 4]);
        assert_eq!(p.hosts(5), vec![2, 3, 4], "the formula's");
        assert_eq!(p.held_by(2, 4), vec![0, 3]);
        assert_eq!(p.joining(1), Some(1));
        assert_eq!(p.agent(1, |_| true), Some(3), "not the one joining");
        assert_eq!(p.agent(1, |id| id == 1), Some(1));
        assert_eq!(Moves::decode(&moves.encode()).expect("decode"), moves);
        assert!(!moves.settle(0, 1) && !moves.settle(1, 2));
        assert!(moves.settle(1, 1));
        assert_eq!((moves.version, moves.moving), (2, None));
        assert!(moves.start(2, other, vec![2, 4, 1]));
        let bytes = moves.encode();
        assert_eq!(Moves::decode(&bytes).expect("decode"), moves);
        for n in 0..bytes.len() {
            assert!(Moves::decode(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Moves::decode(&longer).is_err());
        let mut bad = bytes;
        // The move's marker: before it 21 bytes, three empty lists and no
        // tenants (two empty lists).
        let at = bad.len() - 21 - 12 - 8;
        bad[at] = 7;
        assert!(Moves::decode(&bad).is_err(), "a move marked 7");
    }

    #[test]
    fn without_copies_every_group_is_everywhere() {
        for p in [
            Placement::new(&[1, 2, 3], None),
            Placement::new(&[1, 2, 3], Some(3)),
            Placement::new(&[1, 2, 3], Some(5)),
        ] {
            assert!(p.everywhere());
            assert_eq!(p.fingerprint(), 0);
            assert_eq!(p.hosts(7), vec![2, 3, 1]);
            assert!(p.outsiders(7).is_empty());
            assert_eq!(p.place(7, &[1, 2, 3]), None);
        }
        let a = Placement::new(&[1, 2, 3, 4], Some(3)).fingerprint();
        assert_ne!(a, 0);
        assert_ne!(a, Placement::new(&[1, 2, 3, 5], Some(3)).fingerprint());
        assert_ne!(a, Placement::new(&[1, 2, 3, 4], Some(2)).fingerprint());
        assert_eq!(a, Placement::new(&[4, 3, 2, 1], Some(3)).fingerprint());
    }
}
