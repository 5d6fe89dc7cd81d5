//! Which tenant a client's requests and events go to, and what the broker
//! knows of each client: its verified identity, its connections, its
//! session, the rules that apply to it.

use super::*;

/// Which clients are each tenant's, and where their events go: fixed for
/// a single process; a cluster replica adds the tenants the cluster adds
/// while running.
#[derive(Default)]
pub(super) struct Table {
    pub(super) routes: Vec<Route>,
    pub(super) default: Option<usize>,
    pub(super) tenants: Vec<Inbound>,
}

/// Which tenant's channel a client's events go to.
pub(super) struct Router {
    pub(super) table: Arc<std::sync::RwLock<Table>>,
    /// Requests of clients that belong to no tenant.
    pub(super) strangers: mpsc::Sender<InboundMessage>,
    /// Connections per IP address, and the most allowed (0: no limit).
    pub(super) per_address: std::sync::Mutex<HashMap<IpAddr, usize>>,
    pub(super) max_per_address: usize,
    /// The users every client must be (`--users-file`); none: anonymous
    /// clients are welcome.
    pub(super) users: Option<std::sync::Arc<crate::auth::users::UsersCell>>,
    /// Client ids held by an authenticated user, and the connection
    /// holding each: nobody else may take them.
    pub(super) owners: std::sync::Mutex<HashMap<String, (String, Option<SocketAddr>)>>,
    /// The connection count for `--metrics`.
    pub(super) connections: Option<prometheus::IntGauge>,
    /// The authorization file's rules (`--authorization`), if any.
    pub(super) policy: Option<std::sync::Arc<crate::auth::policy::PolicyCell>>,
    /// What each connected client was verified to be (its user name, from
    /// a password or its certificate), and its connection: the principal
    /// authorization rules see. A user name given without proof is not one.
    pub(super) principals: std::sync::Mutex<HashMap<String, (Verified, Option<SocketAddr>)>>,
    /// How private `clients/<id>/...` is.
    pub(super) client_topics: crate::auth::isolation::ClientTopics,
    /// The retained messages.
    pub(super) retained: Arc<crate::transport::embedded::retained::Retained>,
    /// The counts `$SYS` publishes.
    pub(super) counters: Arc<crate::transport::embedded::sys_topics::Counters>,
    /// Failed logins per address.
    pub(super) logins: crate::transport::embedded::admission::LoginThrottle,
    /// Sessions per address and in all.
    pub(super) sessions: crate::transport::embedded::admission::Sessions,
    /// What was refused, by reason.
    pub(super) refusals: crate::transport::embedded::admission::Refusals,
}

/// A client's verified identity.
#[derive(Debug, Clone, Default)]
pub(super) struct Verified {
    /// From `--users-file`, a tenant's password, or the common name of its
    /// client certificate.
    pub(super) username: Option<String>,
    /// The common name of its client certificate, if any.
    pub(super) certificate: Option<String>,
    /// Its client certificate's subject, if any.
    pub(super) subject: Option<String>,
}

/// Requests of clients of no tenant waiting for their refusal, at most.
pub(super) const STRANGERS_WAITING: usize = 1024;

impl Router {
    /// What `client_id` was verified to be when it connected.
    pub(super) fn verified(&self, client_id: &str) -> Verified {
        let principals = self.principals.lock().unwrap_or_else(|e| e.into_inner());
        principals
            .get(client_id)
            .map(|(v, _)| v.clone())
            .unwrap_or_default()
    }

    /// Whether the broker resources of `--authorization` let `client_id`
    /// (verified as `v`) do what `check` asks; allowed when there is no
    /// file.
    pub(super) fn authorized_as(
        &self,
        client_id: &str,
        v: &Verified,
        check: impl FnOnce(&crate::auth::policy::Policy, &crate::auth::policy::Who<'_>) -> bool,
    ) -> bool {
        let Some(policy) = self.policy.as_ref().and_then(|c| c.get()) else {
            return true;
        };
        let attributes = policy.attributes_for(
            v.username.as_deref(),
            v.certificate.as_deref(),
            v.subject.as_deref(),
        );
        let who = crate::auth::policy::Who {
            client_id,
            username: v.username.as_deref(),
            attributes: &attributes,
        };
        check(&policy, &who)
    }

    /// [`Router::authorized_as`] for a connected client.
    pub(super) fn authorized(
        &self,
        client_id: &str,
        check: impl FnOnce(&crate::auth::policy::Policy, &crate::auth::policy::Who<'_>) -> bool,
    ) -> bool {
        // Who the client is matters only with rules in force.
        if self.policy.as_ref().and_then(|c| c.get()).is_none() {
            return true;
        }
        self.authorized_as(client_id, &self.verified(client_id), check)
    }

    /// A connected client's verified user name and attributes.
    pub(super) fn principal_of(&self, client_id: &str) -> (Option<String>, Vec<(String, String)>) {
        let v = self.verified(client_id);
        let attributes = self
            .policy
            .as_ref()
            .and_then(|c| c.get())
            .map(|p| {
                p.attributes_for(
                    v.username.as_deref(),
                    v.certificate.as_deref(),
                    v.subject.as_deref(),
                )
            })
            .unwrap_or_default();
        (v.username, attributes)
    }

    /// The routes, to read.
    pub(super) fn table(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn tenant_of(&self, username: Option<&str>, client_id: &str) -> Option<usize> {
        let table = self.table();
        table
            .routes
            .iter()
            .position(|r| r.matcher.matches(username, client_id))
            .or(table.default)
    }

    /// Where the events of tenant `t`'s clients go.
    pub(super) fn inbound(&self, t: usize) -> Option<Inbound> {
        self.table().tenants.get(t).cloned()
    }

    /// Whether one tenant takes every client (nothing to tell apart).
    fn one_takes_all(&self) -> bool {
        let table = self.table();
        table.routes.len() == 1 && table.default.is_some()
    }

    /// Whether two clients belong to the same tenant (or both to none).
    pub(super) fn same_tenant(&self, a: &Id, b: &Id) -> bool {
        // One tenant that takes every client: nothing to compare.
        if self.one_takes_all() {
            return true;
        }
        self.tenant_of(username(a), a.client_id.as_ref())
            == self.tenant_of(username(b), b.client_id.as_ref())
    }

    /// Whether a message the store published (a reply, a notification)
    /// may reach `to`: a tenant's store publishes as `$statestore/<n>` and
    /// reaches its own clients only (a reply's topic is the requester's
    /// choice); the refusals to clients of no tenant come from
    /// `$statestore` and reach clients of none.
    pub(super) fn store_may_deliver(&self, store: &Id, to: &Id) -> bool {
        if self.one_takes_all() {
            return true;
        }
        let sender: &str = store.client_id.as_ref();
        let tenant = match sender.strip_prefix(STORE_SENDER) {
            Some("") => None,
            Some(rest) => match rest.strip_prefix('/').and_then(|n| n.parse().ok()) {
                Some(n) => Some(n),
                None => return true,
            },
            // Not the store's (the broker's own): not ours to judge.
            None => return true,
        };
        tenant == self.tenant_of(username(to), to.client_id.as_ref())
    }

    /// Whether `addr` may open one more connection.
    pub(super) fn address_has_room(&self, addr: Option<SocketAddr>) -> bool {
        let Some(addr) = addr else { return true };
        if self.max_per_address == 0 {
            return true;
        }
        let counts = self.per_address.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(&addr.ip()).copied().unwrap_or(0) < self.max_per_address
    }

    /// The user holding `client_id`, if an authenticated one does.
    pub(super) fn owner_of(&self, client_id: &str) -> Option<String> {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.get(client_id).map(|(user, _)| user.clone())
    }

    /// A connection from `addr` opened (+1) or closed (-1).
    pub(super) fn count_connection(&self, addr: Option<SocketAddr>, opened: bool) {
        let Some(addr) = addr else { return };
        if let Some(g) = &self.connections {
            if opened { g.inc() } else { g.dec() }
        }
        let change = if opened { 1 } else { -1 };
        self.counters.connected.fetch_add(change, Ordering::Relaxed);
        let mut counts = self.per_address.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(addr.ip()).or_insert(0);
        if opened {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&addr.ip());
            }
        }
    }

    /// Whether any password is judged (`--users-file`, or a tenant's).
    pub(super) fn checks_passwords(&self) -> bool {
        self.users.is_some()
            || self
                .table()
                .routes
                .iter()
                .any(|r| r.matcher.password.is_some())
    }

    /// The verdict on a client's credentials: `None` if no tenant claims
    /// its user name with a password.
    pub(super) fn authenticate(
        &self,
        username: &str,
        password: Option<&[u8]>,
    ) -> Option<AuthResult> {
        let table = self.table();
        let route = table
            .routes
            .iter()
            .find(|r| r.matcher.usernames.iter().any(|u| u == username))?;
        let expected = route.matcher.password.as_deref()?;
        let given = password.unwrap_or_default();
        use subtle::ConstantTimeEq;
        Some(if bool::from(given.ct_eq(expected.as_bytes())) {
            AuthResult::Allow(false, None)
        } else {
            AuthResult::BadUsernameOrPassword
        })
    }
}
