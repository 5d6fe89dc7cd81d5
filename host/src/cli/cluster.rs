//! `statestore cluster ...`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use statestore::cluster::admin;

use super::client::OutputArg;
use super::fail;

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Print each replica's role, term, commit and applied index, and its
    /// lag behind the leader. Exit 0 if a leader is known and a majority
    /// answered, else 1.
    Status(ClusterStatusArgs),
    /// Add a replica to a running cluster (through its leader). Start the
    /// new replica with `join = true` in its cluster file and an empty data
    /// directory (before or after this); it catches up from the leader's
    /// snapshot. One change at a time: returns once every member that
    /// answers has applied it (at most 60 s after the leader did). Where
    /// the file places the groups (`copies`), the new replica's own entry
    /// says `added = true`: it starts holding no group, and groups move to
    /// it one at a time.
    Add(ClusterAddArgs),
    /// Remove a replica from a running cluster (through its leader; a
    /// leader hands the leadership over first). The removed replica stops.
    /// Returns once every member that answers has applied it (at most 60 s
    /// after the leader did).
    /// To replace a dead machine: remove it, then add its successor. Where
    /// the file places the groups (`copies`), the replica's groups move
    /// away first, one at a time.
    Remove(ClusterRemoveArgs),
    /// Bring back a replica whose Raft log was lost or damaged (it refuses
    /// to start, saying so), while the others serve: with the replica
    /// stopped, its log and snapshot are moved aside (`discarded-*`), its
    /// term and vote kept, and the leader removes it and adds it back.
    /// Then start it as before: it catches up from the leader's snapshot.
    /// Not where the file places the groups (`copies`): remove the replica
    /// there (its groups move to the others) and add a new one.
    Rejoin(ClusterRejoinArgs),
    /// Make the cluster's certificates for mutual TLS between replicas:
    /// in the cluster file's `tls_dir`, a CA (`ca.pem`, `ca.key`), a
    /// certificate and key per replica (`replica-<id>.pem`, `.key`) and
    /// one for these tools (`operator.pem`, `.key`). Only what is missing
    /// is made; run it again with `--id` before adding a replica.
    Certs(ClusterCertsArgs),
    /// The cluster's tenants (with `serve --cluster --config`).
    #[command(subcommand)]
    Tenant(ClusterTenantCommand),
    /// Move one group's copy from a replica to another, in a cluster whose
    /// file places the groups (`copies` below its replicas): the new
    /// replica catches up from the group's snapshot while it serves, then
    /// takes the old one's vote, and the old one drops its copy. One move
    /// at a time; waits until it is done (or `--wait` runs out: it goes on
    /// without this command; run it again to follow it).
    Move(ClusterMoveArgs),
}

#[derive(clap::Args)]
pub struct ClusterMoveArgs {
    /// Any replica's cluster file (its replicas and secret are used).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
    /// The group (`cluster status` lists each replica's).
    #[arg(long)]
    group: u32,
    /// The replica whose copy moves.
    #[arg(long)]
    from: u64,
    /// The replica it moves to (one not holding the group).
    #[arg(long)]
    to: u64,
    /// How long to wait for the move to be done, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    wait: u64,
}

#[derive(Subcommand)]
pub enum ClusterTenantCommand {
    /// Add a tenant to a running cluster: first add it to every replica's
    /// `--config` (at the end or anywhere: the cluster keeps its own
    /// order), then run this; the leader proposes it, and every replica
    /// opens its store (its Raft groups, numbered after the others') and
    /// serves its clients once it applies the entry. A replica whose
    /// `--config` does not name it yet says so in its log and tries again
    /// every 10 s.
    Add(ClusterTenantArgs),
    /// Remove a tenant from a running cluster: the leader proposes it, and
    /// every replica, once it applies the entry, stops serving the
    /// tenant's clients (they become clients of no tenant) and closes its
    /// Raft groups. Its data stays in each replica's `tenant-<name>`
    /// directory (delete it, or keep it); its number and name are not used
    /// again, and `--config` need not name it any more. The first tenant
    /// cannot be removed (its group keeps the cluster's membership).
    Remove(ClusterTenantArgs),
}

#[derive(clap::Args)]
pub struct ClusterTenantArgs {
    /// Any replica's cluster file (its replicas and secret are used).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
    /// The tenant's name, as `--config` names it.
    name: String,
}

#[derive(clap::Args)]
pub struct ClusterCertsArgs {
    /// A cluster file with `tls_dir` (its replicas get certificates).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
    /// Also a certificate for this replica id (one about to be added);
    /// may be given more than once.
    #[arg(long)]
    id: Vec<u64>,
}

#[derive(clap::Args)]
pub struct ClusterRejoinArgs {
    /// The cluster file of the replica to bring back (its data directory
    /// is reset; the others are asked to remove it and add it back).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
}

#[derive(clap::Args)]
pub struct ClusterAddArgs {
    /// Any replica's cluster file (its replicas and secret are used).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
    /// The new replica's id (not a member's, never 0).
    #[arg(long)]
    id: u64,
    /// Where the new replica listens for the others.
    #[arg(long, value_name = "ADDR")]
    raft: std::net::SocketAddr,
    /// Where its embedded broker listens for clients (for `cluster status`).
    #[arg(long, value_name = "ADDR")]
    mqtt: Option<std::net::SocketAddr>,
}

#[derive(clap::Args)]
pub struct ClusterRemoveArgs {
    /// Any replica's cluster file (its replicas and secret are used).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
    /// The id of the replica to remove.
    #[arg(long)]
    id: u64,
}

#[derive(clap::Args)]
pub struct ClusterStatusArgs {
    /// Any replica's cluster file (its replicas and secret are used).
    #[arg(long, value_name = "FILE", env = "STATESTORE_CLUSTER")]
    cluster: PathBuf,
    /// `text` (a table), or `json` (one object: replicas, leader, members
    /// and where they come from, healthy).
    #[arg(short, long, value_enum, default_value_t = OutputArg::Text)]
    output: OutputArg,
}

pub fn run(command: ClusterCommand) -> ExitCode {
    let done = |r: Result<()>| match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e, 1),
    };
    match command {
        ClusterCommand::Status(args) => {
            match admin::status(&args.cluster, args.output == OutputArg::Json) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => fail(&e, 2),
            }
        }
        ClusterCommand::Add(args) => done(admin::add(&args.cluster, args.id, args.raft, args.mqtt)),
        ClusterCommand::Remove(args) => done(admin::remove(&args.cluster, args.id)),
        ClusterCommand::Rejoin(args) => done(admin::rejoin(&args.cluster)),
        ClusterCommand::Certs(args) => done(admin::certs(&args.cluster, &args.id)),
        ClusterCommand::Tenant(ClusterTenantCommand::Add(args)) => done(
            statestore::cluster::admin_tenants::add(&args.cluster, &args.name),
        ),
        ClusterCommand::Tenant(ClusterTenantCommand::Remove(args)) => done(
            statestore::cluster::admin_tenants::remove(&args.cluster, &args.name),
        ),
        ClusterCommand::Move(args) => done(statestore::cluster::admin_tenants::move_group(
            &args.cluster,
            statestore::cluster::placement::Move {
                group: args.group,
                from: args.from,
                to: args.to,
            },
            std::time::Duration::from_secs(args.wait),
        )),
    }
}
