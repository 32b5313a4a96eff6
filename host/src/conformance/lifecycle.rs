//! The lifecycle of one instance against whatever endpoint the provider's config names: a
//! real cloud account, moto, or an emulator. Unlike the suite it needs no control surface,
//! so it is what proves a plugin against the real backend (`proxy-operator provider
//! lifecycle`). It cleans up after itself: whatever step fails, the instance it created is
//! deleted before it returns, and anything still listed afterwards is reported. That holds
//! for a first create that fails too: its answer may have been lost after the backend made
//! the instance (a gateway's 5xx, a timeout), so the instance is looked for by its uid (and
//! name) in ListByTag, and deleted.

use egress_plugin_host::provider::{
    Class, CreateRequest, Instance, Placement, Provider, ProviderError, State, name_from_uid,
};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct LifecycleOptions {
    pub placement: Placement,
    pub installation: String,
    /// The uid the instance is created for (its name derives from it).
    pub uid: String,
    /// User data for the instance.
    pub cloud_init: Vec<u8>,
    pub port: u16,
    /// Pause between two Gets while waiting.
    pub poll: Duration,
    /// How long to wait for Running, and again for NotFound.
    pub wait: Duration,
}

impl LifecycleOptions {
    pub fn new(placement: Placement) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        LifecycleOptions {
            placement,
            installation: "egress-lifecycle-test".into(),
            uid: format!("lifecycle-{:x}", nanos as u64),
            cloud_init: b"#cloud-config\n".to_vec(),
            port: 3128,
            poll: Duration::from_secs(5),
            wait: Duration::from_secs(600),
        }
    }
}

/// One step done.
#[derive(Debug, Clone)]
pub struct Step {
    pub name: &'static str,
    pub elapsed: Duration,
    pub detail: String,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok    {:<22} {:>8.1} s  {}",
            self.name,
            self.elapsed.as_secs_f64(),
            self.detail
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("{step}: {message}")]
    Step {
        step: &'static str,
        message: String,
        /// What the cleanup after the failure did.
        cleanup: String,
    },
    #[error("left behind: {0}")]
    LeftBehind(String),
}

/// Runs create, create again, wait for Running, list, delete, delete again, wait for
/// NotFound, and a final listing to find anything left behind.
pub async fn run(
    p: &dyn Provider,
    opts: &LifecycleOptions,
    mut each: impl FnMut(&Step),
) -> Result<Vec<Step>, LifecycleError> {
    let req = CreateRequest {
        name: name_from_uid(&opts.uid),
        uid: opts.uid.clone(),
        namespace: "lifecycle".into(),
        proxy_name: "lifecycle".into(),
        installation: opts.installation.clone(),
        placement: opts.placement.clone(),
        cloud_init: opts.cloud_init.clone(),
        port: opts.port,
        ip_family: Default::default(),
    };
    let mut steps = Vec::new();
    let mut done = |name, started: Instant, detail: String| {
        let s = Step {
            name,
            elapsed: started.elapsed(),
            detail,
        };
        each(&s);
        steps.push(s);
    };

    let started = Instant::now();
    let id = match p.create(&req).await {
        Ok(id) => id,
        Err(e) => {
            return Err(LifecycleError::Step {
                step: "create",
                message: e.to_string(),
                cleanup: after_failed_create(p, &req).await,
            });
        }
    };
    done("create", started, format!("id {id} (name {})", req.name));

    let result = after_create(p, &req, &id, opts, &mut done).await;
    if let Err(LifecycleError::Step { step, message, .. }) = result {
        let cleanup = match p.delete(&id).await {
            Ok(()) => format!("deleted {id}"),
            Err(e) => format!("could not delete {id}, delete it by hand: {e}"),
        };
        return Err(LifecycleError::Step {
            step,
            message,
            cleanup,
        });
    }
    result?;
    Ok(steps)
}

/// The cleanup after a first create that failed: no ID came back, but the backend may have
/// made the instance before the answer was lost. It carries the marks of the create call, so
/// ListByTag finds it by its uid (or, for IDs that hold it, its name); what is found is
/// deleted. What this cannot see (a backend that lists a new instance late) the same run
/// with `--uid` adopts and deletes.
async fn after_failed_create(p: &dyn Provider, req: &CreateRequest) -> String {
    let (name, uid) = (&req.name, &req.uid);
    let repeat = format!("repeat the run with --uid {uid} to adopt and delete one made later");
    let listed = match p.list_by_tag(&req.installation).await {
        Ok(listed) => listed,
        Err(e) => {
            return format!(
                "could not look for instance {name} (ListByTag({}) failed: {e}); look for it by \
                 hand, or {repeat}",
                req.installation
            );
        }
    };
    let ours: Vec<String> = listed
        .into_iter()
        .filter(|i| i.uid == *uid || i.id.contains(name.as_str()))
        .map(|i| i.id)
        .collect();
    if ours.is_empty() {
        return format!(
            "nothing to clean up: ListByTag({}) lists no instance with uid {uid} or name {name} \
             ({repeat})",
            req.installation
        );
    }
    let mut done = Vec::new();
    for id in ours {
        done.push(match p.delete(&id).await {
            Ok(()) => format!("deleted {id}"),
            Err(e) => format!("could not delete {id}, delete it by hand: {e}"),
        });
    }
    format!(
        "the backend made it anyway, found by its uid in ListByTag: {}",
        done.join("; ")
    )
}

async fn after_create(
    p: &dyn Provider,
    req: &CreateRequest,
    id: &str,
    opts: &LifecycleOptions,
    done: &mut impl FnMut(&'static str, Instant, String),
) -> Result<(), LifecycleError> {
    let fail = |step: &'static str, message: String| LifecycleError::Step {
        step,
        message,
        cleanup: String::new(),
    };

    let started = Instant::now();
    let again = p
        .create(req)
        .await
        .map_err(|e| fail("create again", e.to_string()))?;
    if again != id {
        return Err(fail(
            "create again",
            format!(
                "returned {again}, the first Create {id}: Create is not idempotent, and {again} may be a duplicate to delete by hand"
            ),
        ));
    }
    done("create again", started, "same id".into());

    let started = Instant::now();
    let running = poll(p, id, opts, |r| match r {
        Ok(i) if i.state == State::Running && !i.ip.is_empty() => Poll::Done(Some(i)),
        Ok(i) if i.state == State::Provisioning => Poll::Again,
        Ok(i) => Poll::Fail(format!(
            "Get answers {:?} while waiting for Running",
            i.state
        )),
        Err(e) if e.class == Class::Transient => Poll::Again,
        Err(e) => Poll::Fail(e.to_string()),
    })
    .await
    .map_err(|m| fail("wait for running", m))?
    .expect("Running answers carry the instance");
    if running.uid != req.uid {
        return Err(fail(
            "wait for running",
            format!("Get answers uid {:?}, want {:?}", running.uid, req.uid),
        ));
    }
    done("wait for running", started, format!("ip {}", running.ip));

    let started = Instant::now();
    let listed = p
        .list_by_tag(&req.installation)
        .await
        .map_err(|e| fail("list", e.to_string()))?;
    if !listed.iter().any(|i| i.id == id && i.uid == req.uid) {
        return Err(fail(
            "list",
            format!("ListByTag({}) does not list {id}", req.installation),
        ));
    }
    done(
        "list",
        started,
        format!("{} instance(s) listed", listed.len()),
    );

    let started = Instant::now();
    p.delete(id)
        .await
        .map_err(|e| fail("delete", e.to_string()))?;
    done("delete", started, String::new());

    let started = Instant::now();
    p.delete(id)
        .await
        .map_err(|e| fail("delete again", e.to_string()))?;
    done("delete again", started, String::new());

    let started = Instant::now();
    poll(p, id, opts, |r| match r {
        Err(e) if e.class == Class::NotFound => Poll::Done(None),
        Ok(_) => Poll::Again,
        Err(e) if e.class == Class::Transient => Poll::Again,
        Err(e) => Poll::Fail(e.to_string()),
    })
    .await
    .map_err(|m| fail("wait for not found", m))?;
    done("wait for not found", started, String::new());

    let started = Instant::now();
    let left = p
        .list_by_tag(&req.installation)
        .await
        .map_err(|e: ProviderError| fail("left behind", e.to_string()))?;
    let ours: Vec<&str> = left
        .iter()
        .filter(|i| i.id == id || i.uid == req.uid)
        .map(|i| i.id.as_str())
        .collect();
    if !ours.is_empty() {
        return Err(LifecycleError::LeftBehind(format!(
            "ListByTag still lists {} for uid {}",
            ours.join(", "),
            req.uid
        )));
    }
    done("left behind", started, "nothing listed".into());
    Ok(())
}

/// What one Get answer means while waiting.
enum Poll {
    Done(Option<Instance>),
    Again,
    Fail(String),
}

/// Polls Get every `opts.poll` until `judge` says done or fail, or `opts.wait` passes.
async fn poll(
    p: &dyn Provider,
    id: &str,
    opts: &LifecycleOptions,
    judge: impl Fn(Result<Instance, ProviderError>) -> Poll,
) -> Result<Option<Instance>, String> {
    let started = Instant::now();
    loop {
        match judge(p.get(id).await) {
            Poll::Done(i) => return Ok(i),
            Poll::Fail(m) => return Err(m),
            Poll::Again => {}
        }
        if started.elapsed() > opts.wait {
            return Err(format!("gave up waiting after {:?}", opts.wait));
        }
        tokio::time::sleep(opts.poll).await;
    }
}
