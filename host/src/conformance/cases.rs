//! The cases, one async function each, in the order of the provider contract's testing
//! obligations. Each gets a reset emulator and names of its own (see [`Ctx::request`]).

use super::control::Control;
use super::{Options, Profile, Subject};
use egress_emulator_protocol::{DumpInstance, Fault, FaultKind, FaultOp, Plant};
use egress_plugin_host::provider::{
    Capacity, Class, CreateRequest, Instance, IpFamily, Provider, ProviderError, State,
    name_from_uid,
};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Why a case failed: one sentence, expected against observed.
#[derive(Debug)]
pub struct Fail(pub String);

impl From<super::ControlError> for Fail {
    fn from(e: super::ControlError) -> Self {
        Fail(e.to_string())
    }
}

impl From<ProviderError> for Fail {
    fn from(e: ProviderError) -> Self {
        Fail(format!("unexpected error: {e}"))
    }
}

type CaseFuture<'a> = Pin<Box<dyn Future<Output = Result<(), Fail>> + 'a>>;

pub struct Case {
    pub name: &'static str,
    pub run: for<'a> fn(&'a Ctx<'a>) -> CaseFuture<'a>,
}

macro_rules! case {
    ($name:literal, $f:ident) => {
        Case {
            name: $name,
            run: |ctx| Box::pin($f(ctx)),
        }
    };
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return Err(Fail(format!($($msg)*)));
        }
    };
}

pub const CASES: &[Case] = &[
    case!("profile-answers-every-axis", profile_answers_every_axis),
    case!("create-is-idempotent", create_is_idempotent),
    case!("concurrent-creates-make-one-instance", concurrent_creates),
    case!("running-has-an-ip", running_has_an_ip),
    case!("running-without-an-ip-is-provisioning", running_without_ip),
    case!("ipv6-is-served-or-refused", ipv6_served_or_refused),
    case!("spot-is-served-or-refused", spot_served_or_refused),
    case!("quote-is-a-price-or-none", quote_is_a_price_or_none),
    case!(
        "reclaimed-spot-is-interrupted",
        reclaimed_spot_is_interrupted
    ),
    case!("no-spot-capacity-is-quota", no_spot_capacity_is_quota),
    case!("not-started-is-never-stopped", not_started_is_never_stopped),
    case!("unknown-state-is-stopped", unknown_state_is_stopped),
    case!("uid-and-created-at-come-from-the-backend", read_back),
    case!("list-excludes-unmarked-keeps-empty-uid", list_marks),
    case!(
        "list-with-a-scope-down-follows-the-profile",
        list_scope_down
    ),
    case!("list-recent-shows-every-instance-made-since", list_recent),
    case!("get-after-delete-is-not-found", get_after_delete),
    case!("delete-is-idempotent", delete_twice),
    case!("get-during-delete-returns-the-instance", get_during_delete),
    case!("locked-instance-keeps-its-state", locked),
    case!("malformed-id-is-permanent", malformed_ids),
    case!("delete-leaves-no-secondary-resource", no_leftovers),
    case!("cancelled-calls-return-promptly", cancelled_calls),
    case!("fault-server-error-is-transient", fault_server_error),
    case!("fault-slow-answer-is-transient", fault_slow),
    case!("fault-quota-is-quota-exceeded", fault_quota),
    case!("fault-rate-limit-is-quota-exceeded", fault_rate_limit),
    case!("fault-auth-is-permanent", fault_auth),
];

/// What a case works with.
pub struct Ctx<'a> {
    p: &'a dyn Provider,
    control: &'a Control,
    opts: &'a Options,
    call_timeout: Duration,
    profile: &'a [(String, String)],
    run_id: &'a str,
    case: &'static str,
}

impl<'a> Ctx<'a> {
    pub fn new(
        subject: &'a Subject<'a>,
        control: &'a Control,
        opts: &'a Options,
        run_id: &'a str,
        case: &'static str,
    ) -> Self {
        Ctx {
            p: subject.provider,
            control,
            opts,
            call_timeout: subject.call_timeout,
            profile: &subject.profile,
            run_id,
            case,
        }
    }

    /// A uid unique to this run, case and tag, shaped like a Kubernetes UID (a UUID), so
    /// that a backend's limits on label values see what they will see in production.
    fn uid(&self, tag: &str) -> String {
        use sha2::{Digest, Sha256};
        let h = hex::encode(Sha256::digest(format!(
            "{}/{}/{tag}",
            self.run_id, self.case
        )));
        format!(
            "{}-{}-4{}-a{}-{}",
            &h[0..8],
            &h[8..12],
            &h[13..16],
            &h[17..20],
            &h[20..32]
        )
    }

    /// A request with a name no other case or run uses.
    fn request(&self, tag: &str) -> CreateRequest {
        let uid = self.uid(tag);
        CreateRequest {
            name: name_from_uid(&uid),
            uid,
            namespace: "conformance".into(),
            proxy_name: format!("{}-{tag}", self.case),
            installation: self.opts.installation.clone(),
            placement: self.opts.placement.clone(),
            cloud_init: b"#cloud-config\n# egress conformance suite\n".to_vec(),
            port: 3128,
            ip_family: Default::default(),
        }
    }

    /// [`Ctx::request`] for spot capacity.
    fn spot_request(&self, tag: &str) -> CreateRequest {
        let mut req = self.request(tag);
        req.placement.capacity = Capacity::Spot;
        req
    }

    /// A spot Create: the request and ID when the plugin serves spot, `None` when it
    /// refuses spot as unsupported (checked to have left nothing behind), and a failure
    /// for any other answer.
    async fn spot(&self, tag: &str) -> Result<Option<(CreateRequest, String)>, Fail> {
        let req = self.spot_request(tag);
        match self.p.create(&req).await {
            Ok(id) => Ok(Some((req, id))),
            Err(e) if refuses_spot(&e) => {
                self.nothing_named(&req.name, "a spot request was refused")
                    .await?;
                tracing::info!(case = self.case, "the plugin serves no spot capacity: {e}");
                Ok(None)
            }
            Err(e) => Err(Fail(format!(
                "a spot Create: want an instance, or Permanent with code {UNSUPPORTED} (a \
                 plugin without spot), it answers {:?} with code {:?} ({})",
                e.class, e.code, e.message
            ))),
        }
    }

    /// The backend holds no instance called `name` and no secondary resource: `after`
    /// says what should have left nothing.
    async fn nothing_named(&self, name: &str, after: &str) -> Result<(), Fail> {
        let dump = self.control.dump().await?;
        let found = dump.instances.iter().filter(|i| i.name == name).count();
        ensure!(
            found == 0 && dump.secondary.is_empty(),
            "{after}, yet the backend holds {found} instances named {name:?} and {} secondary \
             resources",
            dump.secondary.len()
        );
        Ok(())
    }

    async fn create(&self, tag: &str) -> Result<(CreateRequest, String), Fail> {
        let req = self.request(tag);
        let id = self.p.create(&req).await?;
        Ok((req, id))
    }

    /// The emulator's record of the instance named `name`; exactly one must exist.
    async fn backend(&self, name: &str) -> Result<DumpInstance, Fail> {
        let mut found = self.control.by_name(name).await?;
        ensure!(
            found.len() == 1,
            "the backend holds {} instances named {name:?}, want 1",
            found.len()
        );
        Ok(found.remove(0))
    }

    /// Polls Get until `done` holds; fails after `opts.wait` naming `want` and the last answer.
    async fn get_until(
        &self,
        id: &str,
        want: &str,
        done: impl Fn(&Result<Instance, ProviderError>) -> bool,
    ) -> Result<Result<Instance, ProviderError>, Fail> {
        let deadline = Instant::now() + self.opts.wait;
        loop {
            let r = self.p.get(id).await;
            if done(&r) {
                return Ok(r);
            }
            ensure!(
                Instant::now() < deadline,
                "waited {:?} for Get({id}) to answer {want}; it answers {}",
                self.opts.wait,
                show(&r)
            );
            tokio::time::sleep(self.opts.poll).await;
        }
    }

    async fn running(&self, id: &str) -> Result<Instance, Fail> {
        let r = self
            .get_until(
                id,
                "Running",
                |r| matches!(r, Ok(i) if i.state == State::Running),
            )
            .await?;
        Ok(r.expect("checked by get_until"))
    }

    /// Completes deletes the emulator holds back, then waits for NotFound.
    async fn gone(&self, id: &str) -> Result<(), Fail> {
        self.control.finish_deletes().await?;
        self.get_until(id, "NotFound", |r| is_class(r, Class::NotFound))
            .await
            .map(drop)
    }

    fn profile(&self, axis: &str) -> Option<&str> {
        self.profile
            .iter()
            .find(|(a, _)| a == axis)
            .map(|(_, v)| v.as_str())
    }
}

/// The codes the operator acts on, and the SDK's refusal of what a plugin did not declare.
use egress_contract::codes::{INTERRUPTED, SPOT_CAPACITY_UNAVAILABLE, UNSUPPORTED};

/// A plugin's refusal of spot capacity it has not: the SDK's (Permanent, `Unsupported`), or
/// the host's for a 0.1.0 plugin, whose contract has no capacity (Permanent, naming it).
fn refuses_spot(e: &ProviderError) -> bool {
    e.class == Class::Permanent
        && match e.code.as_deref() {
            Some(code) => code == UNSUPPORTED,
            None => e.message.contains("no capacity (spot placements)"),
        }
}

/// An answer that says the backend took a spot instance back: Stopped or Terminated and
/// interrupted, or NotFound with code `Interrupted`.
fn interrupted(r: &Result<Instance, ProviderError>) -> bool {
    match r {
        Ok(i) => i.interrupted && matches!(i.state, State::Stopped | State::Terminated),
        Err(e) => e.class == Class::NotFound && e.code.as_deref() == Some(INTERRUPTED),
    }
}

fn is_class<T>(r: &Result<T, ProviderError>, class: Class) -> bool {
    matches!(r, Err(e) if e.class == class)
}

/// A Get answer in one short phrase.
fn show(r: &Result<Instance, ProviderError>) -> String {
    match r {
        Ok(i) if i.ip.is_empty() && i.ipv6.is_empty() => format!("{:?} without an IP", i.state),
        Ok(i) if i.ipv6.is_empty() => format!("{:?} at {}", i.state, i.ip),
        Ok(i) if i.ip.is_empty() => format!("{:?} at {} only", i.state, i.ipv6),
        Ok(i) => format!("{:?} at {} and {}", i.state, i.ip, i.ipv6),
        Err(e) => format!("{:?} ({})", e.class, e.message),
    }
}

fn show_err<T: std::fmt::Debug>(r: &Result<T, ProviderError>) -> String {
    match r {
        Ok(v) => format!("success ({v:?})"),
        Err(e) => format!("{:?} ({})", e.class, e.message),
    }
}

fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

// ---- the cases --------------------------------------------------------------------------

async fn profile_answers_every_axis(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let problems = Profile::problems(ctx.profile);
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    Ok(())
}

async fn create_is_idempotent(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (req, first) = ctx.create("a").await?;
    let second = ctx.p.create(&req).await?;
    ensure!(
        first == second,
        "a repeat Create returned {second:?}, the first {first:?}"
    );
    ctx.backend(&req.name).await?;
    Ok(())
}

async fn concurrent_creates(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let req = ctx.request("a");
    let (a, b) = tokio::join!(ctx.p.create(&req), ctx.p.create(&req));
    let (a, b) = (a?, b?);
    ensure!(a == b, "two concurrent Creates returned {a:?} and {b:?}");
    ctx.backend(&req.name).await?;
    Ok(())
}

async fn running_has_an_ip(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (req, id) = ctx.create("a").await?;
    let i = ctx.running(&id).await?;
    ensure!(!i.ip.is_empty(), "Get answers Running with no IP");
    ensure!(
        i.id == id,
        "Get({id}) answers an instance with id {:?}",
        i.id
    );
    ensure!(
        i.uid == req.uid,
        "Get answers uid {:?}, the request had {:?}",
        i.uid,
        req.uid
    );
    Ok(())
}

async fn running_without_ip(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (req, id) = ctx.create("a").await?;
    ctx.running(&id).await?;
    let b = ctx.backend(&req.name).await?;
    ctx.control.set_address(&b.id, None).await?;
    let r = ctx.p.get(&id).await;
    ensure!(
        matches!(&r, Ok(i) if i.state == State::Provisioning && i.ip.is_empty()),
        "the backend runs it without an address: want Provisioning without an IP, Get answers {}",
        show(&r)
    );
    Ok(())
}

/// An IPv6 Proxy's create either makes an instance that gets an IPv6 address, or is
/// refused as permanent naming IPv6 before anything exists: never an IPv4-only instance
/// that its clients cannot reach.
async fn ipv6_served_or_refused(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let req = CreateRequest {
        ip_family: IpFamily::V6,
        ..ctx.request("a")
    };
    match ctx.p.create(&req).await {
        Ok(id) => {
            let v6 = |r: &Result<Instance, ProviderError>| matches!(r, Ok(i) if i.state == State::Running && i.address(IpFamily::V6).is_some());
            let _running = ctx
                .get_until(&id, "Running with an IPv6 address", v6)
                .await?;
        }
        Err(e) if e.class == Class::Permanent => {
            ensure!(
                e.message.contains("IPv6"),
                "an IPv6 request refused without naming IPv6: {e}"
            );
            let found = ctx.control.by_name(&req.name).await?;
            ensure!(
                found.is_empty(),
                "an IPv6 request was refused, yet the backend holds {} instances named {:?}",
                found.len(),
                req.name
            );
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// A spot Create either makes an instance the backend runs on spot capacity, or is refused
/// as unsupported before anything exists: never an on-demand instance billed for what the
/// user asked to be cheaper.
async fn spot_served_or_refused(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let Some((req, id)) = ctx.spot("a").await? else {
        return Ok(());
    };
    ctx.running(&id).await?;
    let spot = ctx.control.spot_by_name(&req.name).await?;
    ensure!(
        spot == [true],
        "a spot Create made an instance the backend does not run on spot capacity (the dump's \
         spot for {:?}: {spot:?})",
        req.name
    );
    Ok(())
}

/// After the backend reclaims a spot instance, the plugin says so: ListByTag, while it
/// still lists the instance, and Get answer it Stopped or Terminated and interrupted, and
/// once the backend removed it Get answers NotFound with code `Interrupted`.
async fn reclaimed_spot_is_interrupted(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let Some((req, id)) = ctx.spot("a").await? else {
        return Ok(());
    };
    ctx.running(&id).await?;
    let b = ctx.backend(&req.name).await?;
    ctx.control.reclaim(&b.id).await?;
    let listed = ctx.p.list_by_tag(&ctx.opts.installation).await?;
    if let Some(i) = listed.iter().find(|i| i.id == id) {
        let r = Ok(i.clone());
        ensure!(
            interrupted(&r),
            "reclaimed by the backend: ListByTag lists {id} as {} (interrupted: {}), want \
             Stopped or Terminated and interrupted",
            show(&r),
            i.interrupted
        );
    }
    // Waits out a backend still moving; a plain NotFound or a stop without the flag is final.
    let settled = |r: &Result<Instance, ProviderError>| {
        interrupted(r)
            || is_class(r, Class::NotFound)
            || matches!(r, Ok(i) if matches!(i.state, State::Stopped | State::Terminated))
    };
    let r = ctx.get_until(&id, "interrupted", settled).await?;
    let code = r.as_ref().err().and_then(|e| e.code.clone());
    ensure!(
        interrupted(&r),
        "reclaimed by the backend: want Stopped or Terminated and interrupted, or NotFound \
         with code {INTERRUPTED}; Get answers {} (interrupted: {}, code {code:?})",
        show(&r),
        r.as_ref().is_ok_and(|i| i.interrupted)
    );
    Ok(())
}

/// With no spot capacity, a spot Create (or the Gets after it, for a backend that fails
/// the create later) answers QuotaExceeded with code `SpotCapacityUnavailable`, so the
/// operator can fall back to on-demand, and leaves nothing behind.
async fn no_spot_capacity_is_quota(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let switched = ctx.control.set_spot_capacity(false).await;
    let req = ctx.spot_request("a");
    let r = ctx.p.create(&req).await;
    if let Err(e) = &r
        && refuses_spot(e)
    {
        tracing::info!(case = ctx.case, "the plugin serves no spot capacity: {e}");
        return ctx
            .nothing_named(&req.name, "a spot request was refused")
            .await;
    }
    if let Err(e) = switched {
        return Err(Fail(format!(
            "the plugin serves spot, but the emulator cannot take spot capacity away: {e}"
        )));
    }
    let failure = match r {
        Err(e) => Err(e),
        // A backend that accepts the create and fails it later: the first Gets tell.
        Ok(id) => {
            let done = |r: &Result<Instance, ProviderError>| {
                r.is_err() || matches!(r, Ok(i) if i.state != State::Provisioning)
            };
            ctx.get_until(&id, "an error", done).await?.map(drop)
        }
    };
    ensure!(
        matches!(&failure, Err(e) if e.class == Class::QuotaExceeded
            && e.code.as_deref() == Some(SPOT_CAPACITY_UNAVAILABLE)),
        "no spot capacity: want QuotaExceeded with code {SPOT_CAPACITY_UNAVAILABLE} from \
         Create (or the Gets after it), it answers {}",
        show_err(&failure)
    );
    ctx.nothing_named(&req.name, "a spot Create found no capacity")
        .await
}

/// `quote` prices the suite's placement or says the backend publishes no price, and makes
/// nothing: the backend holds the same instances before and after. A 0.1.0 plugin has no
/// `quote` and is refused by the host, naming it.
async fn quote_is_a_price_or_none(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let before = ctx.control.dump().await?.instances.len();
    match ctx.p.quote(&ctx.opts.placement).await {
        Ok(Some(p)) => ensure!(
            p.currency.len() == 3 && p.currency.bytes().all(|b| b.is_ascii_uppercase()),
            "quote answered the currency {:?}, not an ISO 4217 code",
            p.currency
        ),
        Ok(None) => {}
        Err(e) if e.class == Class::Permanent && e.message.contains("no quote") => {}
        Err(e) => return Err(e.into()),
    }
    let after = ctx.control.dump().await?.instances.len();
    ensure!(
        after == before,
        "quote changed the backend: {before} instances before, {after} after"
    );
    Ok(())
}

async fn not_started_is_never_stopped(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (req, id) = ctx.create("a").await?;
    let b = ctx.backend(&req.name).await?;
    ctx.control.hold(&b.id, true).await?;
    for _ in 0..3 {
        let r = ctx.p.get(&id).await;
        ensure!(
            matches!(&r, Ok(i) if i.state == State::Provisioning),
            "created and not started yet: want Provisioning, Get answers {}",
            show(&r)
        );
    }
    ctx.control.hold(&b.id, false).await?;
    ctx.running(&id).await?;
    Ok(())
}

async fn unknown_state_is_stopped(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (req, id) = ctx.create("a").await?;
    let b = ctx.backend(&req.name).await?;
    ctx.control
        .set_state(&b.id, "egress-conformance-unknown-state")
        .await?;
    let r = ctx.p.get(&id).await;
    ensure!(
        matches!(&r, Ok(i) if i.state == State::Stopped),
        "a backend state the plugin does not know: want Stopped, Get answers {}",
        show(&r)
    );
    Ok(())
}

async fn read_back(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let before = unix(SystemTime::now());
    let (req, id) = ctx.create("a").await?;
    let after = unix(SystemTime::now());
    let i = ctx.p.get(&id).await?;
    ensure!(
        i.uid == req.uid,
        "Get answers uid {:?}, want {:?}",
        i.uid,
        req.uid
    );
    let created = i.created_at.map(unix);
    ensure!(
        created.is_some_and(|c| c >= before - 120 && c <= after + 120),
        "Get answers created_at {created:?} (Unix seconds) for an instance created between {before} and {after}"
    );

    // One the plugin never saw: whatever it answers can only come from the backend.
    let scope = ctx.backend(&req.name).await?.scope;
    let uid = ctx.uid("planted");
    let at = (before - 7200) as u64;
    ctx.control
        .plant(&Plant {
            name: name_from_uid(&uid),
            scope,
            managed: true,
            uid: Some(uid.clone()),
            installation: Some(ctx.opts.installation.clone()),
            created_at: Some(at),
        })
        .await?;
    let listed = ctx.p.list_by_tag(&ctx.opts.installation).await?;
    let planted: Vec<&Instance> = listed.iter().filter(|i| i.uid == uid).collect();
    ensure!(
        planted.len() == 1,
        "ListByTag lists {} instances with the planted uid {uid:?}, want 1",
        planted.len()
    );
    let got = planted[0].created_at.map(unix);
    ensure!(
        got == Some(at as i64),
        "ListByTag answers created_at {got:?} for an instance the backend created at {at}"
    );
    let i = ctx.p.get(&planted[0].id).await?;
    ensure!(
        i.uid == uid && i.created_at.map(unix) == Some(at as i64),
        "Get of the planted instance answers uid {:?} created_at {:?}, want {uid:?} {at}",
        i.uid,
        i.created_at.map(unix)
    );
    Ok(())
}

async fn list_marks(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (req, _) = ctx.create("a").await?;
    let scope = ctx.backend(&req.name).await?.scope;
    let inst = ctx.opts.installation.clone();
    let plant = |tag: &str, managed: bool, uid: Option<String>, installation: &str| Plant {
        name: name_from_uid(&ctx.uid(tag)),
        scope: scope.clone(),
        managed,
        uid,
        installation: Some(installation.to_string()),
        created_at: None,
    };
    let unmanaged = ctx.uid("unmanaged");
    let foreign = ctx.uid("foreign");
    for p in [
        plant("unmanaged", false, Some(unmanaged.clone()), &inst),
        plant("empty-uid", true, Some(String::new()), &inst),
        plant("no-uid", true, None, &inst),
        plant(
            "foreign",
            true,
            Some(foreign.clone()),
            "another-installation",
        ),
    ] {
        ctx.control.plant(&p).await?;
    }
    let listed = ctx.p.list_by_tag(&inst).await?;
    let mut uids: Vec<&str> = listed.iter().map(|i| i.uid.as_str()).collect();
    uids.sort();
    ensure!(
        uids == ["", "", req.uid.as_str()],
        "ListByTag answers uids {uids:?}; want the created instance and the two managed ones \
         without a uid (as \"\"), and neither the unmanaged one nor another installation's"
    );
    for i in &listed {
        let r = ctx.p.get(&i.id).await;
        ensure!(
            r.is_ok(),
            "Get of listed id {:?} answers {}",
            i.id,
            show(&r)
        );
    }
    Ok(())
}

/// Contract 0.3.0, for a plugin that declares `lists-recent`: a list with `created-since`
/// shows every managed instance of the installation made since (the host takes a missing
/// one for a reason to Get), and, like a whole list, nothing unmanaged or another
/// installation's. Instances made before may be in it or not.
async fn list_recent(ctx: &Ctx<'_>) -> Result<(), Fail> {
    if !ctx.p.lists_recent() {
        return Ok(());
    }
    let since = SystemTime::now() - Duration::from_secs(60);
    let (req, id) = ctx.create("a").await?;
    let scope = ctx.backend(&req.name).await?.scope;
    let inst = ctx.opts.installation.clone();
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let plant =
        |tag: &str, managed: bool, installation: &str, created_at: Option<SystemTime>| Plant {
            name: name_from_uid(&ctx.uid(tag)),
            scope: scope.clone(),
            managed,
            uid: Some(ctx.uid(tag)),
            installation: Some(installation.to_string()),
            created_at: created_at.map(|t| unix(t) as u64),
        };
    let mut want = vec![(req.uid.clone(), id)];
    for (tag, managed, installation, at) in [
        ("recent", true, inst.as_str(), None),
        ("old", true, inst.as_str(), Some(an_hour_ago)),
        ("unmanaged", false, inst.as_str(), None),
        ("foreign", true, "another-installation", None),
    ] {
        let planted = ctx
            .control
            .plant(&plant(tag, managed, installation, at))
            .await?;
        if tag == "recent" {
            want.push((ctx.uid(tag), planted));
        }
    }
    let listed = ctx
        .p
        .list_recent_at(
            &inst,
            since,
            egress_plugin_host::provider::Priority::Transition,
        )
        .await?;
    let shown = |uid: &str| listed.iter().any(|i| i.uid == uid);
    for (uid, planted) in &want {
        ensure!(
            shown(uid),
            "a list of the instances made since a minute ago lacks {uid:?} ({planted}), made \
             just now; it answers uids {:?}",
            listed.iter().map(|i| i.uid.as_str()).collect::<Vec<_>>()
        );
    }
    for tag in ["unmanaged", "foreign"] {
        ensure!(
            !shown(&ctx.uid(tag)),
            "a list of recent instances shows the {tag} instance {:?}, which a whole list leaves out",
            ctx.uid(tag)
        );
    }
    Ok(())
}

async fn list_scope_down(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (req, id) = ctx.create("a").await?;
    let scope = ctx.backend(&req.name).await?.scope;
    ctx.control.fail_scope(&scope, true).await?;
    let r = ctx.p.list_by_tag(&ctx.opts.installation).await;
    match ctx.profile("list-partial") {
        Some("omit-unreachable") => ensure!(
            matches!(&r, Ok(l) if l.iter().all(|i| i.id != id)),
            "list-partial=omit-unreachable with scope {scope:?} down: want a list without \
             its instance, ListByTag answers {}",
            show_err(&r)
        ),
        _ => ensure!(
            matches!(&r, Err(e) if e.class != Class::NotFound),
            "list-partial=fail-whole with scope {scope:?} down: want an error, ListByTag answers {}",
            show_err(&r)
        ),
    }
    ctx.control.fail_scope(&scope, false).await?;
    let r = ctx.p.list_by_tag(&ctx.opts.installation).await;
    ensure!(
        matches!(&r, Ok(l) if l.iter().any(|i| i.id == id)),
        "with scope {scope:?} back: want a list with {id}, ListByTag answers {}",
        show_err(&r)
    );
    Ok(())
}

async fn get_after_delete(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (_, id) = ctx.create("a").await?;
    ctx.p.get(&id).await?;
    ctx.p.delete(&id).await?;
    ctx.gone(&id).await
}

async fn delete_twice(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (_, id) = ctx.create("a").await?;
    ctx.p.delete(&id).await?;
    let again = ctx.p.delete(&id).await;
    ensure!(
        again.is_ok(),
        "a second Delete (the first may still run) answers {}",
        show_err(&again)
    );
    ctx.gone(&id).await?;
    let after = ctx.p.delete(&id).await;
    ensure!(
        after.is_ok(),
        "Delete of an instance already gone answers {}",
        show_err(&after)
    );
    Ok(())
}

async fn get_during_delete(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (req, id) = ctx.create("a").await?;
    ctx.running(&id).await?;
    let b = ctx.backend(&req.name).await?;
    ctx.control.start_slow_delete(&b.id).await?;
    for _ in 0..3 {
        let r = ctx.p.get(&id).await;
        ensure!(
            r.is_ok(),
            "a delete is in progress and the name is still taken: want the instance, Get answers {}",
            show(&r)
        );
    }
    let again = ctx.p.delete(&id).await;
    ensure!(
        again.is_ok(),
        "Delete while a delete is in progress answers {}",
        show_err(&again)
    );
    ctx.gone(&id).await
}

async fn locked(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (req, id) = ctx.create("a").await?;
    ctx.running(&id).await?;
    let b = ctx.backend(&req.name).await?;
    ctx.control.lock(&b.id, true).await?;
    let r = ctx.p.get(&id).await;
    ensure!(
        matches!(&r, Ok(i) if i.state == State::Running) || is_class(&r, Class::Transient),
        "locked by a backend operation: want the last state (Running) or Transient, Get answers {}",
        show(&r)
    );
    let d = ctx.p.delete(&id).await;
    ensure!(
        d.is_ok() || is_class(&d, Class::Transient),
        "Delete of a locked instance: want success or Transient, it answers {}",
        show_err(&d)
    );
    ctx.control.lock(&b.id, false).await?;
    ctx.p.delete(&id).await?;
    ctx.gone(&id).await
}

async fn malformed_ids(ctx: &Ctx<'_>) -> Result<(), Fail> {
    for id in [
        "",
        "not-an-id",
        "/",
        "a/b/c/d",
        "../../etc/passwd",
        "id\nwith\0controls",
    ] {
        let r = ctx.p.get(id).await;
        ensure!(
            is_class(&r, Class::Permanent),
            "Get({id:?}) of a malformed id: want Permanent, it answers {}",
            show(&r)
        );
        let r = ctx.p.delete(id).await;
        ensure!(
            is_class(&r, Class::Permanent),
            "Delete({id:?}) of a malformed id: want Permanent, it answers {}",
            show_err(&r)
        );
    }
    Ok(())
}

async fn no_leftovers(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (req, id) = ctx.create("a").await?;
    ctx.running(&id).await?;
    let b = ctx.backend(&req.name).await?;
    ctx.p.delete(&id).await?;
    ctx.gone(&id).await?;
    let dump = ctx.control.dump().await?;
    let left: Vec<String> = dump
        .instances
        .iter()
        .map(|i| format!("instance {} ({})", i.id, i.state))
        .chain(
            dump.secondary
                .iter()
                .map(|s| format!("{} {} (attached to {:?})", s.kind, s.id, s.attached_to)),
        )
        .collect();
    ensure!(
        left.is_empty(),
        "after deleting {} ({id}) the backend still holds: {}",
        b.id,
        left.join(", ")
    );
    Ok(())
}

/// One call of the operation a fault targets: Create with `req`, Get or Delete of `id`.
async fn call(
    ctx: &Ctx<'_>,
    op: FaultOp,
    id: &str,
    req: &CreateRequest,
) -> Result<(), ProviderError> {
    match op {
        FaultOp::Create => ctx.p.create(req).await.map(drop),
        FaultOp::Get => ctx.p.get(id).await.map(drop),
        FaultOp::Delete => ctx.p.delete(id).await,
        FaultOp::List | FaultOp::Any => ctx.p.list_by_tag(&ctx.opts.installation).await.map(drop),
    }
}

/// The operator cancels a call by dropping it (a reconcile cut short, a shutdown). The
/// provider must be usable right after, with no slot or lock left held by the dropped call.
async fn cancelled_calls(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let (_, id) = ctx.create("a").await?;
    ctx.p.get(&id).await?;
    let cut = Duration::from_millis(250);
    let delay = ctx.call_timeout + Duration::from_secs(2);
    for op in [
        FaultOp::Get,
        FaultOp::List,
        FaultOp::Create,
        FaultOp::Delete,
    ] {
        ctx.control.inject(&Fault::slow(op, delay, 1)).await?;
        let started = Instant::now();
        let req = ctx.request("cut");
        let r = tokio::time::timeout(cut, call(ctx, op, &id, &req)).await;
        let took = started.elapsed();
        ensure!(
            took < cut + Duration::from_millis(500),
            "{op:?} cancelled after {cut:?} returned only after {took:?}"
        );
        ensure!(
            r.is_err(),
            "{op:?}: the emulator delays the answer {delay:?}, yet the call finished in {took:?}"
        );
        // Usable at once: a fresh call gets its slot and an answer within the time limit.
        let started = Instant::now();
        let next = ctx.p.list_by_tag(&ctx.opts.installation).await;
        ensure!(
            next.is_ok() && started.elapsed() < ctx.call_timeout,
            "after a cancelled {op:?}, ListByTag answers {} in {:?}",
            show_err(&next),
            started.elapsed()
        );
    }
    Ok(())
}

/// Injects `kind` on each operation in turn and checks the class every call comes back with.
async fn fault(ctx: &Ctx<'_>, kind: FaultKind, want: Class) -> Result<(), Fail> {
    let mut wrong = Vec::new();
    let slow = matches!(kind, FaultKind::Slow { .. });
    for op in [
        FaultOp::Create,
        FaultOp::Get,
        FaultOp::Delete,
        FaultOp::List,
    ] {
        ctx.control.reset().await?;
        let (_, id) = ctx.create(&format!("{op:?}").to_lowercase()).await?;
        ctx.p.get(&id).await?;
        // Enough that a plugin retrying inside one call still sees only the fault.
        ctx.control
            .inject(&Fault {
                op,
                kind: kind.clone(),
                count: 50,
            })
            .await?;
        let started = Instant::now();
        let r = call(ctx, op, &id, &ctx.request("second")).await;
        let took = started.elapsed();
        if !is_class(&r, want) {
            wrong.push(format!("{op:?} answers {}", show_err(&r)));
        } else if slow && took > ctx.call_timeout + Duration::from_secs(2) {
            wrong.push(format!(
                "{op:?} took {took:?}, past the {:?} time limit",
                ctx.call_timeout
            ));
        }
    }
    ensure!(
        wrong.is_empty(),
        "want {want:?} from every operation: {}",
        wrong.join("; ")
    );
    Ok(())
}

/// What a quota or rate-limit fault must come back as, by the declared `quota` axis.
fn quota_class(ctx: &Ctx<'_>) -> Class {
    match ctx.profile("quota") {
        Some("absent") => Class::Transient,
        _ => Class::QuotaExceeded,
    }
}

async fn fault_server_error(ctx: &Ctx<'_>) -> Result<(), Fail> {
    fault(ctx, FaultKind::ServerError, Class::Transient).await
}

async fn fault_slow(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let delay_ms = (ctx.call_timeout + Duration::from_secs(2)).as_millis() as u64;
    fault(ctx, FaultKind::Slow { delay_ms }, Class::Transient).await
}

async fn fault_quota(ctx: &Ctx<'_>) -> Result<(), Fail> {
    fault(ctx, FaultKind::Quota, quota_class(ctx)).await
}

async fn fault_rate_limit(ctx: &Ctx<'_>) -> Result<(), Fail> {
    fault(ctx, FaultKind::RateLimit, quota_class(ctx)).await
}

async fn fault_auth(ctx: &Ctx<'_>) -> Result<(), Fail> {
    fault(ctx, FaultKind::Auth, Class::Permanent).await
}
