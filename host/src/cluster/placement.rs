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

/// Where the groups of a cluster are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The replicas' ids, in order.
    members: Vec<u64>,
    /// How many of them hold each group.
    copies: usize,
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
        Placement { members, copies }
    }

    /// Whether every group is on every replica.
    pub fn everywhere(&self) -> bool {
        self.copies >= self.members.len()
    }

    /// The replicas holding group `g`, its place first.
    pub fn hosts(&self, g: u32) -> Vec<u64> {
        let m = self.members.len();
        if m == 0 {
            return Vec::new();
        }
        let start = g as usize % m;
        (0..self.copies)
            .map(|k| self.members[(start + k) % m])
            .collect()
    }

    /// Whether replica `id` holds group `g`.
    pub fn holds(&self, id: u64, g: u32) -> bool {
        self.hosts(g).contains(&id)
    }

    /// The replicas not holding group `g` (to whom its leader sends their
    /// clients' notifications).
    pub fn outsiders(&self, g: u32) -> Vec<u64> {
        let hosts = self.hosts(g);
        self.members
            .iter()
            .copied()
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

    /// A fingerprint of the placement, for peers to compare (0: every group
    /// on every replica).
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
    /// up; its place when none is.
    pub fn agent(&self, g: u32, up: impl Fn(u64) -> bool) -> Option<u64> {
        let hosts = self.hosts(g);
        hosts
            .iter()
            .copied()
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
