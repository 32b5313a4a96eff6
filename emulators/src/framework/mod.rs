//! The emulator framework: everything an emulator of a cloud API shares, so that an
//! emulator for a new backend writes only its API's routes, its wire types and a small
//! adapter.
//!
//! # Layers
//!
//! - [`Served`] runs any [`Model`] (the control operations on an emulator's state, under
//!   its lock) on 127.0.0.1, implements [`Emulator`](crate::control::Emulator) over it,
//!   and serves the whole `/_emulator/` control surface of `egress-emulator-protocol` with
//!   one router ([`surface::router`]) over the `Emulator` trait. No emulator routes the
//!   control surface itself; it may add routes of its own next to it.
//! - [`Traffic`] is the bookkeeping of API calls: the request log, the counters of
//!   `GET /_emulator/stats`, injected faults ([`Effect`]) and the enforced rate limit
//!   ([`RateLimits`], one token bucket per key).
//! - [`gated`] puts an HTTP API behind the gate every call passes (log and count, rate
//!   limit, faults, credentials, schedules), for any state that implements [`Api`].
//! - [`Fleet`] holds the instances and every control rule about them: provisioning and its
//!   [`Schedule`], holds, raw states, addresses, locks, slow deletes, plants with the
//!   contract's marks, failing scopes, the dump, real-proxy mode.
//! - [`Cloud`] puts a fleet, its traffic and a backend's [`Adapter`] together and is both
//!   the [`Model`] and the [`Api`]: an emulator of a REST backend built on it has no
//!   control or gate code at all.
//!
//! The example backend (`crate::example`) is built on [`Cloud`]. The Hetzner and EC2
//! emulators keep models of their own (Primary IPs and actions; volumes, reservations and
//! terminated instances that stay visible), implement [`Model`] (and Hetzner [`Api`]), and
//! share the control surface, the traffic bookkeeping, the gate (Hetzner) and real-proxy
//! mode.
//!
//! # Writing an emulator for a new REST backend
//!
//! Say DigitalOcean (`/v2/droplets`). The emulator is one module with three parts:
//!
//! 1. **Wire types**: the request and answer bodies of the API reference (`Droplet`,
//!    `CreateDroplet`, the error body `{"id": "not_found", "message": ..}`), rendered from
//!    a [`Record`] (`id`, `name`, `scope`, `state`, `ip`, `labels`, `user_data`,
//!    `created_at`) plus the backend's own fields in `Record::extra` (size, image, ...).
//! 2. **The adapter**: a struct holding the configuration (token, regions, sizes) that
//!    implements [`Adapter`]: `STATES` (`new` / `active` / `archive`), the id format
//!    (`id(n)`), the addresses handed out (`address(n)`, from TEST-NET-3), the error body
//!    of every [`FaultKind`](crate::control::FaultKind) (`fault`), `unauthorized`,
//!    `rate_limited` and `decorate` (the `RateLimit-*` headers), `classify` (which
//!    [`FaultOp`](crate::control::FaultOp) a method and path serve, and the call's name
//!    for the stats), `authorized` (the bearer token), and `plant` (the checks a create
//!    would make, giving `extra`). About 150 lines.
//! 3. **Routes**: axum handlers over `Shared<Cloud<Adapter>>`. Each locks the state and
//!    uses the fleet: `create` a [`Record`] with an id from `Cloud::new_id`, `get` it
//!    (then `Cloud::saw`, which moves it out of provisioning on the schedule), list with
//!    `fleet.iter()` (answering the backend's 5xx when `fleet.failing_scope` finds one),
//!    and `fleet.delete`, whose [`Deletion`] says locked, in progress or done. Paging,
//!    filters and validation are the backend's, and are most of what is left.
//!
//! Then start it:
//!
//! ```ignore
//! let (listener, _url) = framework::bind(0)?;
//! let state = Shared::new(Cloud::new(adapter, Fleet::new(Do::STATES, schedule, proxies), None));
//! let app = Router::new().nest("/v2", framework::gated(routes(), &state));
//! let emulator = Served::serve("digitalocean-emulator", listener, state, app);
//! ```
//!
//! and `emulator` is an [`Emulator`](crate::control::Emulator): the conformance suite can
//! drive it in-process or over HTTP, with holds, raw states, addresses, locks, slow
//! deletes, plants, faults, failing scopes, rate limits, stats and real proxies, none of
//! which the new module implements. `crate::example` is the worked example.

mod cloud;
mod fleet;
mod gate;
mod served;
pub mod surface;
mod traffic;

pub use cloud::{Adapter, Cloud};
pub use fleet::{Deletion, Fleet, Record, Schedule, States, backend_id, marks};
pub use gate::{Api, gated};
pub use served::{Handle, Model, Served, Shared, bind};
pub use traffic::{Effect, EveryNth, RateLimits, Traffic};
