//! The store behind the plugin, and where it runs.
//!
//! - **Inline** (volatile, or durable with `fsync everysec` / `no`): each
//!   request is one bounded guest call on mosquitto's thread, its reply
//!   published at once. Writes reach the page cache; a thread of the
//!   journal's own syncs them (everysec).
//! - **Worker** (`fsync always`): the store runs on a thread of the
//!   plugin's own, which waits for the disk (requests queued meanwhile
//!   share the next fsync); mosquitto's thread hands it requests and
//!   publishes what it finished at its next callback or tick. The worker
//!   wakes mosquitto's thread when it has finished something ([`Waker`]),
//!   so a reply waits for its fsync, not for mosquitto's 100 ms loop
//!   timeout. No reply of a write leaves before the write is on disk, and
//!   replies keep their order.
//!
//! Either way the mosquitto side gets [`Action`]s to carry out once it
//! holds no lock (a publish or a kick can call the plugin again).

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use statestore::auth::policy::Policy;
use statestore::store::journal::Fsync;
use statestore::store::tenant::{Fleet, Tenant};
use statestore::{InboundMessage, OutboundMessage, Output, PublishKind};

use crate::options::PluginOptions;

/// What the broker is to do for the store.
#[derive(Debug)]
pub enum Action {
    /// Publish into this client's session.
    Publish {
        /// The client.
        to: String,
        /// The message.
        message: Box<OutboundMessage>,
    },
    /// Disconnect this client (it broke the protocol's rules).
    Kick(String),
    /// A line for mosquitto's log.
    Log {
        /// Whether it is an error (else information).
        error: bool,
        /// The line.
        line: String,
    },
}

impl Action {
    fn info(line: String) -> Action {
        Action::Log { error: false, line }
    }
    fn error(line: String) -> Action {
        Action::Log { error: true, line }
    }
}

/// The store and what it needs, wherever it runs.
pub(crate) struct Core {
    tenant: Tenant,
    fleet: Fleet,
    options: PluginOptions,
    /// The authorization file's rules, for the attributes of user names.
    policy: Option<Arc<Policy>>,
    next_deadline: Option<u64>,
}

/// A request waiting for its reply: its response topic, correlation data
/// and client.
type Waiting<'a> = (Option<&'a str>, Option<&'a [u8]>, &'a str);

/// The most requests handed to the guest in one call on the worker.
const MAX_BATCH: usize = statestore::store::driver::MAX_BATCH;

impl Core {
    fn open(options: PluginOptions) -> Result<Core> {
        let store = options.store_options()?;
        let cache_dir = options
            .cache_dir
            .clone()
            .or_else(statestore::runtime::cache::default_dir);
        // Calls bounded by fuel (no timer thread to interrupt them).
        let mut fleet = Fleet::for_replica(1, options.memory_bytes, cache_dir)?;
        let component = options.component();
        let runtime = fleet
            .runtime_from_bytes(&component.read()?, options.limits())
            .with_context(|| format!("cannot load {component}"))?;
        let mut tenant = Tenant::open("mosquitto", runtime, &store)?;
        let next_deadline = tenant.next_deadline()?;
        let policy = match &options.authorization {
            Some(path) => Some(Arc::new(Policy::load(path)?)),
            None => None,
        };
        if let Some(addr) = options.metrics {
            let metrics = serve_metrics(addr)?;
            tenant.set_metrics(metrics.tenant("default"));
            tenant.refresh_metrics(true);
            metrics.set_ready();
        }
        Ok(Core {
            tenant,
            fleet,
            options,
            policy,
            next_deadline,
        })
    }

    /// A request as the guest sees it: its client's verified user name
    /// and attributes, if mosquitto verifies user names.
    fn complete(&self, message: &mut InboundMessage, username: Option<String>) {
        message.received_at = Some(self.tenant.now_ms());
        if self.options.trust_usernames {
            if let Some(p) = &self.policy {
                message.attributes = p.attributes_of(username.as_deref());
            }
            message.username = username;
        }
    }

    /// Handles requests received together; `requesters[i]` sent
    /// `messages[i]`.
    fn requests(&mut self, messages: &[InboundMessage], requesters: &[String]) -> Vec<Action> {
        let now = self.tenant.now_ms();
        let mut waiting: VecDeque<Waiting<'_>> = messages
            .iter()
            .zip(requesters)
            .map(|(m, r)| {
                (
                    m.response_topic.as_deref(),
                    m.correlation_data.as_deref(),
                    r.as_str(),
                )
            })
            .collect();
        let started = std::time::Instant::now();
        if let Some(m) = self.tenant.metrics() {
            m.requests(messages.iter().map(|m| m.payload.as_slice()));
        }
        let handled = self.tenant.handle(messages, now);
        if let (Ok(outputs), Some(m)) = (&handled, self.tenant.metrics()) {
            m.published(outputs);
            m.answered(started, messages.len());
        }
        let actions = match handled {
            Ok(outputs) => actions(outputs, |reply| {
                // Replies come in the order of their requests: the first
                // waiting request with this topic and correlation is its.
                let at = waiting.iter().position(|(t, c, _)| {
                    *t == Some(&*reply.topic) && *c == reply.correlation_data.as_deref()
                })?;
                waiting.remove(at).map(|(_, _, r)| r.to_string())
            }),
            Err(e) => vec![Action::error(format!("statestore: requests failed: {e:#}"))],
        };
        self.refresh_deadline();
        actions
    }

    fn gone(&mut self, client: &str) -> Vec<Action> {
        let now = self.tenant.now_ms();
        let out = match self.tenant.client_gone(client, now) {
            Ok(outputs) => actions(outputs, |_| None),
            Err(e) => vec![Action::error(format!(
                "statestore: a disconnect failed: {e:#}"
            ))],
        };
        self.refresh_deadline();
        out
    }

    /// Expiry and the dedup cache, when due; the guest's gauges, about once
    /// a second.
    fn tick(&mut self) -> Vec<Action> {
        self.tenant.refresh_metrics(false);
        let now = self.tenant.now_ms();
        if !(self.next_deadline.is_some_and(|d| d <= now) || self.tenant.more_due()) {
            return Vec::new();
        }
        let out = match self.tenant.timeout(now) {
            Ok(outputs) => {
                if let Some(m) = self.tenant.metrics() {
                    m.published(&outputs);
                }
                actions(outputs, |_| None)
            }
            Err(e) => vec![Action::error(format!(
                "statestore: the timer failed: {e:#}"
            ))],
        };
        self.refresh_deadline();
        out
    }

    /// How long until the timer is due (at most a second).
    fn until_due(&self) -> Duration {
        let now = self.tenant.now_ms();
        let ms = match self.next_deadline {
            _ if self.tenant.more_due() => 0,
            Some(d) => d.saturating_sub(now).min(1000),
            None => 1000,
        };
        Duration::from_millis(ms)
    }

    /// SIGHUP: the authorization file and the component file, if given.
    fn reload(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        if let Some(path) = self.options.authorization.clone() {
            let loaded = Policy::load(&path).and_then(|policy| {
                self.tenant.set_authorization(Some(policy.store_rules()))?;
                Ok(policy)
            });
            out.push(match loaded {
                Ok(policy) => {
                    self.policy = Some(Arc::new(policy));
                    Action::info("statestore: authorization rules reloaded".into())
                }
                Err(e) => Action::error(format!(
                    "statestore: authorization reload failed, the rules in force stay: {e:#}"
                )),
            });
        }
        if self.options.component.is_some() {
            let component = self.options.component();
            let limits = self.options.limits();
            let quota = self.tenant.config().quota;
            let upgraded = component
                .read()
                .and_then(|wasm| self.fleet.runtime_from_bytes(&wasm, limits))
                .and_then(|runtime| self.tenant.upgrade(runtime, quota));
            out.push(match upgraded {
                Ok(()) => Action::info(format!("statestore: now serving {component}")),
                Err(e) => Action::error(format!(
                    "statestore: the component was not upgraded, the one in force stays: {e:#}"
                )),
            });
            self.refresh_deadline();
        }
        out
    }

    fn refresh_deadline(&mut self) {
        self.next_deadline = self.tenant.next_deadline().unwrap_or(None);
    }
}

/// `/metrics`, `/healthz` and `/readyz` on `addr`, served by a thread of
/// their own (mosquitto's thread never serves them).
fn serve_metrics(addr: std::net::SocketAddr) -> Result<Arc<statestore::metrics::Metrics>> {
    let metrics = statestore::metrics::Metrics::new()?;
    let (bound, listening) = mpsc::channel();
    let served = metrics.clone();
    std::thread::Builder::new()
        .name("statestore-metrics".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = bound.send(Err(anyhow::Error::from(e)));
                    return;
                }
            };
            rt.block_on(async move {
                let _ = bound.send(served.serve(addr).await);
                std::future::pending::<()>().await;
            });
        })
        .context("cannot start the metrics thread")?;
    let at = listening
        .recv()
        .context("the metrics thread ended")?
        .with_context(|| format!("plugin_opt_metrics {addr}"))?;
    tracing::info!(metrics = %format!("http://{at}/metrics"), "metrics listening");
    Ok(metrics)
}

/// The guest's outputs as actions: a reply to the client `requester`
/// names, a notification to its observer.
fn actions(
    outputs: Vec<Output>,
    mut requester: impl FnMut(&OutboundMessage) -> Option<String>,
) -> Vec<Action> {
    let mut out = Vec::with_capacity(outputs.len());
    for output in outputs {
        match output {
            Output::Publish(m) => {
                let to = match m.kind {
                    PublishKind::Response => requester(&m),
                    PublishKind::Notification => m.target_client.as_deref().map(str::to_string),
                };
                match to {
                    Some(to) => out.push(Action::Publish {
                        to,
                        message: Box::new(m),
                    }),
                    None => out.push(Action::error(
                        "statestore: an output for nobody was dropped".into(),
                    )),
                }
            }
            Output::Violation { client_id, reason } => {
                out.push(Action::error(format!(
                    "statestore: request not answered ({}): {reason}",
                    client_id
                        .as_deref()
                        .unwrap_or("its response topic is not its requester's")
                )));
                out.extend(client_id.map(Action::Kick));
            }
            Output::Journal(_) | Output::More(_) => {}
        }
    }
    out
}

/// Wakes mosquitto's thread from its `epoll_wait` (which a signal handler
/// always interrupts), so that its loop runs its tick, where what the
/// worker finished is published. The signal is a real-time one nobody else
/// uses, sent to that thread alone; its handler does nothing and restarts
/// every other system call (`SA_RESTART`).
struct Waker {
    thread: libc::pthread_t,
    signal: libc::c_int,
}

extern "C" fn woken(_: libc::c_int) {}

impl Waker {
    /// On mosquitto's thread: the handler installed, the thread noted.
    fn install() -> Result<Waker> {
        // SAFETY: plain libc calls; the handler does nothing.
        unsafe {
            let signal = libc::SIGRTMIN() + 7;
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = woken as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                anyhow::bail!(
                    "cannot install the wake-up signal: {}",
                    std::io::Error::last_os_error()
                );
            }
            Ok(Waker {
                thread: libc::pthread_self(),
                signal,
            })
        }
    }

    /// Wakes mosquitto's thread.
    fn wake(&self) {
        // SAFETY: a live thread (mosquitto's main thread outlives the
        // worker, which cleanup joins) and a signal with a handler.
        unsafe {
            libc::pthread_kill(self.thread, self.signal);
        }
    }
}

/// What mosquitto's thread hands the worker.
pub(crate) enum Job {
    Request(Box<InboundMessage>, String),
    Gone(String),
    Reload,
}

/// The store, on mosquitto's thread or on a worker.
pub(crate) enum Store {
    /// On mosquitto's thread.
    Inline(Box<Core>),
    /// On a thread of the plugin's own.
    Worker(Box<Worker>),
}

/// The mosquitto side of the store's own thread.
pub(crate) struct Worker {
    /// Work for it.
    jobs: mpsc::Sender<Job>,
    /// What it finished, for mosquitto's thread to carry out.
    done: Arc<Mutex<Vec<Action>>>,
    /// A copy of the options (for requests).
    options: PluginOptions,
    /// The policy as the worker last loaded it.
    policy: Arc<Mutex<Option<Arc<Policy>>>>,
    /// The thread.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Store {
    /// Opens the store (recovering it) and starts it where its options say.
    pub fn open(options: PluginOptions) -> Result<Store> {
        let durable_always = options.data_dir.is_some() && options.fsync == Fsync::Always;
        let core = Core::open(options.clone())?;
        if !durable_always {
            return Ok(Store::Inline(Box::new(core)));
        }
        let (jobs, rx) = mpsc::channel();
        let done = Arc::new(Mutex::new(Vec::new()));
        let policy = Arc::new(Mutex::new(core.policy.clone()));
        let waker = Waker::install()?;
        let thread = {
            let done = done.clone();
            let policy = policy.clone();
            std::thread::Builder::new()
                .name("statestore".into())
                .spawn(move || work(core, rx, done, policy, waker))
                .context("cannot start the store's thread")?
        };
        Ok(Store::Worker(Box::new(Worker {
            jobs,
            done,
            options,
            policy,
            thread: Some(thread),
        })))
    }

    /// A request from `requester` (its user name as mosquitto has it).
    pub fn request(
        &mut self,
        mut message: InboundMessage,
        requester: String,
        username: Option<String>,
    ) -> Vec<Action> {
        match self {
            Store::Inline(core) => {
                core.complete(&mut message, username);
                core.requests(std::slice::from_ref(&message), &[requester])
            }
            Store::Worker(w) => {
                message.received_at = Some(statestore::store::clock::now_ms());
                if w.options.trust_usernames {
                    let policy = w.policy.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    if let Some(p) = policy {
                        message.attributes = p.attributes_of(username.as_deref());
                    }
                    message.username = username;
                }
                let _ = w.jobs.send(Job::Request(Box::new(message), requester));
                self.finished()
            }
        }
    }

    /// A client went away.
    pub fn gone(&mut self, client: String) -> Vec<Action> {
        match self {
            Store::Inline(core) => core.gone(&client),
            Store::Worker(w) => {
                let _ = w.jobs.send(Job::Gone(client));
                self.finished()
            }
        }
    }

    /// mosquitto's tick.
    pub fn tick(&mut self) -> Vec<Action> {
        match self {
            Store::Inline(core) => core.tick(),
            Store::Worker(_) => self.finished(),
        }
    }

    /// SIGHUP.
    pub fn reload(&mut self) -> Vec<Action> {
        match self {
            Store::Inline(core) => core.reload(),
            Store::Worker(w) => {
                let _ = w.jobs.send(Job::Reload);
                self.finished()
            }
        }
    }

    /// What the worker finished since the last call (nothing inline).
    fn finished(&mut self) -> Vec<Action> {
        match self {
            Store::Inline(_) => Vec::new(),
            Store::Worker(w) => {
                std::mem::take(&mut *w.done.lock().unwrap_or_else(|e| e.into_inner()))
            }
        }
    }

    /// Stops the store: flushes and closes the journal.
    pub fn shutdown(self) {
        match self {
            Store::Inline(mut core) => core.tenant.shutdown(),
            Store::Worker(mut w) => {
                let thread = w.thread.take();
                drop(w);
                if let Some(t) = thread {
                    let _ = t.join();
                }
            }
        }
    }
}

/// The worker: handles what mosquitto's thread sends, requests queued
/// together in one call (one fsync), and the timer; ends when the sender
/// is dropped, shutting the store down.
fn work(
    mut core: Core,
    jobs: mpsc::Receiver<Job>,
    done: Arc<Mutex<Vec<Action>>>,
    policy: Arc<Mutex<Option<Arc<Policy>>>>,
    waker: Waker,
) {
    let publish = |actions: Vec<Action>| {
        if !actions.is_empty() {
            done.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(actions);
            waker.wake();
        }
    };
    let mut pending: VecDeque<Job> = VecDeque::new();
    loop {
        if pending.is_empty() {
            match jobs.recv_timeout(core.until_due()) {
                Ok(job) => pending.push_back(job),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            pending.extend(jobs.try_iter());
        }
        // Requests in a row go together; other jobs one at a time, in order.
        let mut messages = Vec::new();
        let mut requesters = Vec::new();
        while messages.len() < MAX_BATCH
            && let Some(Job::Request(..)) = pending.front()
        {
            if let Some(Job::Request(m, r)) = pending.pop_front() {
                messages.push(*m);
                requesters.push(r);
            }
        }
        if !messages.is_empty() {
            publish(core.requests(&messages, &requesters));
        } else {
            match pending.pop_front() {
                Some(Job::Gone(client)) => publish(core.gone(&client)),
                Some(Job::Reload) => {
                    publish(core.reload());
                    *policy.lock().unwrap_or_else(|e| e.into_inner()) = core.policy.clone();
                }
                Some(Job::Request(..)) | None => {}
            }
        }
        publish(core.tick());
    }
    core.tenant.shutdown();
}
