//! Leader election over a `coordination.k8s.io/v1` Lease (kube-lease-manager).
//!
//! Every replica loads plugins and serves the discovery API; only the leader runs the loops
//! that write to the cloud and to Proxy status (reconciler, GC, health engine, provider
//! monitor). [`Leadership`] keeps this replica's claim on the Lease and publishes whether it
//! leads on a `watch` channel; [`run_while_leader`] starts the leader-only loops when
//! leadership is gained and cancels them (a child token) as soon as it is lost.
//!
//! Timing: the Lease is held for `duration` after each renewal and the leader renews every
//! `renew`. kube-lease-manager counts in whole seconds: `duration` and `renew` must be whole
//! seconds with `0 < renew < duration` (so the shortest Lease is 2 s). A follower takes over
//! a crashed leader's Lease once it has expired: after at most `duration` plus up to 1 s of
//! jitter. On any API error while leading this replica steps down at once (it cannot prove
//! it still holds the Lease), releases it if it can, and starts a new claim after a backoff.

use std::future::Future;
use std::time::Duration;

use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Where the Lease lives, who claims it and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    pub namespace: String,
    pub lease_name: String,
    /// Unique per replica (the pod name).
    pub identity: String,
    /// How long the Lease stays valid after a renewal.
    pub duration: Duration,
    /// How often the leader renews.
    pub renew: Duration,
}

/// Why lease timings cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error("lease {0} must be a whole number of seconds (got {1:?})")]
    NotWholeSeconds(&'static str, Duration),
    #[error("lease {0} must be at least 1s")]
    TooShort(&'static str),
    #[error(
        "lease renew interval ({renew:?}) must be shorter than the lease duration ({duration:?})"
    )]
    RenewNotShorter { renew: Duration, duration: Duration },
}

/// kube-lease-manager's `(duration, grace)` in seconds for a Lease held `duration` and
/// renewed every `renew`: the leader renews `grace` seconds before expiry.
pub fn lease_params_secs(duration: Duration, renew: Duration) -> Result<(u64, u64), TimingError> {
    let whole = |what, d: Duration| {
        if d.subsec_nanos() != 0 {
            Err(TimingError::NotWholeSeconds(what, d))
        } else if d.as_secs() == 0 {
            Err(TimingError::TooShort(what))
        } else {
            Ok(d.as_secs())
        }
    };
    let d = whole("duration", duration)?;
    let r = whole("renew interval", renew)?;
    if r >= d {
        return Err(TimingError::RenewNotShorter { renew, duration });
    }
    Ok((d, d - r))
}

/// What the election loop does with one answer from the lease manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Publish this leadership state and keep watching.
    Publish(bool),
    /// Publish "not leader", release the Lease if held, back off and claim anew.
    StepDown,
}

/// The decision after the lease manager answered `result` (Ok: whether we hold the Lease).
/// An error is a step down even while leading: a replica that cannot renew must assume the
/// Lease expires under it (the manager itself would keep reporting the old state).
pub fn decide<E>(result: &Result<bool, E>) -> Step {
    match result {
        Ok(leads) => Step::Publish(*leads),
        Err(_) => Step::StepDown,
    }
}

/// Backoff before claiming the Lease again after `failures` errors in a row.
pub fn retry_delay(failures: u32) -> Duration {
    let secs = 1u64
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u64::MAX)
        .min(30);
    Duration::from_secs(secs)
}

/// This replica's claim on the Lease. Dropping it aborts the claim without releasing the
/// Lease (like a crash); call [`Leadership::stop`] to hand it over cleanly.
pub struct Leadership {
    leader: watch::Receiver<bool>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Leadership {
    /// Starts claiming the Lease (created if missing). Fails only on unusable timings; API
    /// errors are retried in the background.
    pub fn new(client: kube::Client, settings: LeaseSettings) -> Result<Self, TimingError> {
        let (duration, grace) = lease_params_secs(settings.duration, settings.renew)?;
        let (tx, leader) = watch::channel(false);
        let stop = CancellationToken::new();
        let task = tokio::spawn(elect(client, settings, duration, grace, tx, stop.clone()));
        Ok(Leadership {
            leader,
            stop,
            task: Some(task),
        })
    }

    /// A `Leadership` that always leads (leader election turned off).
    pub fn always() -> Self {
        let (tx, leader) = watch::channel(true);
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            token.cancelled().await;
            drop(tx);
        });
        Leadership {
            leader,
            stop,
            task: Some(task),
        }
    }

    /// Whether this replica leads, now and on every change.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Stops claiming and releases the Lease if held, so another replica can take over
    /// without waiting for it to expire. Stop the leader-only loops first.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn elect(
    client: kube::Client,
    settings: LeaseSettings,
    duration: u64,
    grace: u64,
    tx: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let identity = settings.identity.as_str();
    let mut failures = 0u32;
    loop {
        // A fresh manager each round: after an error the old one may still believe it
        // leads and would not report leadership again.
        let params = LeaseParams::new(identity, duration, grace);
        let built = tokio::select! {
            _ = stop.cancelled() => return,
            m = LeaseManager::new(
                client.clone(),
                settings.lease_name.as_str(),
                settings.namespace.as_str(),
                params,
                LeaseCreateMode::AutoCreate,
            ) => m,
        };
        match built {
            Ok(manager) => loop {
                let result = tokio::select! {
                    biased;
                    _ = stop.cancelled() => {
                        tx.send_replace(false);
                        let _ = tokio::time::timeout(Duration::from_secs(5), manager.release()).await;
                        info!(identity, "stopped claiming the leader lease");
                        return;
                    }
                    r = manager.changed() => r,
                };
                match decide(&result) {
                    Step::Publish(leads) => {
                        failures = 0;
                        if tx.send_replace(leads) != leads {
                            info!(
                                identity,
                                lease = settings.lease_name.as_str(),
                                leads,
                                "leadership changed"
                            );
                        }
                    }
                    Step::StepDown => {
                        if tx.send_replace(false) {
                            warn!(
                                identity,
                                "stepping down: the leader lease could not be renewed"
                            );
                        }
                        if let Err(e) = &result {
                            warn!(identity, error = %e, "leader lease");
                        }
                        let _ =
                            tokio::time::timeout(Duration::from_secs(2), manager.release()).await;
                        break;
                    }
                }
            },
            Err(e) => warn!(identity, error = %e, "setting up the leader lease"),
        }
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(retry_delay(failures)) => {}
        }
    }
}

/// Runs `loops` while `leader` says this replica leads, until `shutdown`: each time
/// leadership is gained, `loops(token)` starts with a fresh child token of `shutdown`; when
/// it is lost (or the leadership channel closes), that token is cancelled and the loops
/// get `stop_grace` to finish before they are dropped. Returns after `shutdown` (or once
/// the channel has closed) with the loops stopped.
pub async fn run_while_leader<F, Fut>(
    mut leader: watch::Receiver<bool>,
    shutdown: CancellationToken,
    stop_grace: Duration,
    mut loops: F,
) where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        // Wait to lead.
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = leader.wait_for(|l| *l) => if r.is_err() { return },
        }
        let token = shutdown.child_token();
        let run = loops(token.clone());
        tokio::pin!(run);
        let mut closed = false;
        let finished = tokio::select! {
            _ = &mut run => true,
            _ = shutdown.cancelled() => false,
            r = leader.wait_for(|l| !*l) => { closed = r.is_err(); false }
        };
        token.cancel();
        if !finished && tokio::time::timeout(stop_grace, &mut run).await.is_err() {
            warn!(grace = ?stop_grace, "leader-only loops did not stop in time; dropped");
        }
        if closed || shutdown.is_cancelled() {
            return;
        }
        // The loops ended by themselves while still leading: wait for the next term
        // rather than spinning.
        if *leader.borrow() {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                r = leader.wait_for(|l| !*l) => if r.is_err() { return },
            }
        }
    }
}
