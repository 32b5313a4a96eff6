//! What every emulator shares however its API looks: the state behind one lock, the
//! [`Model`] of the control operations on it, and [`Served`], the running emulator that
//! implements [`Emulator`] over any model and serves the control surface next to the API.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;

use crate::control::{Dump, Emulator, Fault, Plant, RateLimit, Refusal, RequestStats};
use crate::server::ServerThread;
use crate::tls::TestCa;

/// The emulator's state, shared by its handlers and its Rust handle.
pub struct Shared<S>(Arc<Mutex<S>>);

impl<S> Clone for Shared<S> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<S> Shared<S> {
    pub fn new(state: S) -> Self {
        Shared(Arc::new(Mutex::new(state)))
    }

    /// The state, even after a panic under the lock: a test that panicked while holding
    /// it must not hide its real failure behind a poison error in every later call.
    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The control operations on an emulator's state, under its lock: what an emulator
/// implements so that [`Served`] is an [`Emulator`] and serves `/_emulator/`. Operations on
/// an id return whether the instance exists. Emulators built on
/// [`Cloud`](super::Cloud) get it for free.
pub trait Model: Send + 'static {
    fn hold(&mut self, id: &str, hold: bool) -> bool;
    fn set_state(&mut self, id: &str, state: &str) -> bool;
    fn set_address(&mut self, id: &str, ip: Option<&str>) -> bool;
    fn slow_delete(&mut self, id: &str) -> bool;
    fn finish_deletes(&mut self);
    fn set_locked(&mut self, id: &str, locked: bool) -> bool;
    fn plant(&mut self, plant: &Plant) -> Result<String, Refusal>;
    fn inject(&mut self, fault: Fault);
    fn fail_scope(&mut self, scope: &str, fail: bool);
    /// `&mut`: a dump is a look, and time-based schedules advance when someone looks.
    fn dump(&mut self) -> Dump;
    fn reset(&mut self);
    fn set_rate_limit(&mut self, limit: Option<RateLimit>);
    fn stats(&self) -> RequestStats;
    /// Every API call so far as the emulator logs it (`GET /_emulator/requests`).
    fn requests(&self) -> Vec<String>;
    /// See [`Emulator::reclaim`]; unsupported unless the backend has spot.
    fn reclaim(&mut self, id: &str) -> Result<bool, Refusal> {
        let _ = id;
        Err(Refusal::unsupported("reclaim"))
    }
    /// See [`Emulator::set_spot_capacity`]; unsupported (`false`) by default.
    fn set_spot_capacity(&mut self, available: bool) -> bool {
        let _ = available;
        false
    }
    /// See [`Emulator::spot_instances`].
    fn spot_instances(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// The URL and state of an emulator: an [`Emulator`] without the server thread, which the
/// control router holds.
pub struct Handle<S> {
    url: String,
    state: Shared<S>,
}

impl<S> Clone for Handle<S> {
    fn clone(&self) -> Self {
        Handle { url: self.url.clone(), state: self.state.clone() }
    }
}

impl<S> Handle<S> {
    pub fn state(&self) -> &Shared<S> {
        &self.state
    }

    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.state.lock()
    }
}

impl<S: Model> Emulator for Handle<S> {
    fn url(&self) -> String {
        self.url.clone()
    }
    fn hold_provisioning(&self, id: &str, hold: bool) -> bool {
        self.lock().hold(id, hold)
    }
    fn set_backend_state(&self, id: &str, state: &str) -> bool {
        self.lock().set_state(id, state)
    }
    fn set_address(&self, id: &str, ip: Option<&str>) -> bool {
        self.lock().set_address(id, ip)
    }
    fn start_slow_delete(&self, id: &str) -> bool {
        self.lock().slow_delete(id)
    }
    fn finish_deletes(&self) {
        self.lock().finish_deletes()
    }
    fn set_locked(&self, id: &str, locked: bool) -> bool {
        self.lock().set_locked(id, locked)
    }
    fn try_plant(&self, plant: Plant) -> Result<String, Refusal> {
        self.lock().plant(&plant)
    }
    fn inject(&self, fault: Fault) {
        self.lock().inject(fault)
    }
    fn fail_scope(&self, scope: &str, fail: bool) {
        self.lock().fail_scope(scope, fail)
    }
    fn dump(&self) -> Dump {
        self.lock().dump()
    }
    fn reset(&self) {
        self.lock().reset()
    }
    fn set_rate_limit(&self, limit: Option<RateLimit>) {
        self.lock().set_rate_limit(limit)
    }
    fn stats(&self) -> RequestStats {
        self.lock().stats()
    }
    fn reclaim(&self, id: &str) -> Result<bool, Refusal> {
        self.lock().reclaim(id)
    }
    fn set_spot_capacity(&self, available: bool) -> bool {
        self.lock().set_spot_capacity(available)
    }
    fn spot_instances(&self) -> Vec<String> {
        self.lock().spot_instances()
    }
}

/// A running emulator on 127.0.0.1: its API, the control surface under `/_emulator/`, and
/// its state. Stops, closing every connection, when dropped; the state goes with it (so a
/// `Drop` on the state stops what it started, e.g. real proxies).
pub struct Served<S> {
    server: ServerThread,
    handle: Handle<S>,
}

/// A listener on 127.0.0.1 with an OS-chosen port (`0`) or a given one, and the URL it
/// serves: bound before the state is built, for states whose answers contain their URL.
pub fn bind(port: u16) -> std::io::Result<(TcpListener, String)> {
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    Ok((listener, format!("http://{addr}")))
}

impl<S: Model> Served<S> {
    /// Serves `app` (the API, its fallbacks and any control routes of this emulator's
    /// own, over `state`) and the shared control surface from `listener` on a thread named
    /// `name`.
    pub fn serve(
        name: &str,
        listener: TcpListener,
        state: Shared<S>,
        app: Router<Shared<S>>,
    ) -> Served<S> {
        Self::launch(name, listener, state, app, None)
    }

    /// As [`serve`](Self::serve), over HTTPS with a certificate `ca` signed: the URL is
    /// `https://127.0.0.1:PORT`, and only a client that trusts `ca` gets an answer (the
    /// control surface included).
    pub fn serve_tls(
        name: &str,
        listener: TcpListener,
        state: Shared<S>,
        app: Router<Shared<S>>,
        ca: &TestCa,
    ) -> Served<S> {
        Self::launch(name, listener, state, app, Some(ca))
    }

    fn launch(
        name: &str,
        listener: TcpListener,
        state: Shared<S>,
        app: Router<Shared<S>>,
        ca: Option<&TestCa>,
    ) -> Served<S> {
        let addr = listener.local_addr().expect("local addr");
        let scheme = if ca.is_some() { "https" } else { "http" };
        let handle = Handle { url: format!("{scheme}://{addr}"), state: state.clone() };
        let app = app.with_state(state).merge(super::surface::router(handle.clone()));
        let server = ServerThread::spawn(name, listener, app, ca.map(TestCa::server_config));
        Served { server, handle }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.handle.url.clone()
    }

    /// Every API call so far, as this emulator logs it (control calls excluded).
    pub fn requests(&self) -> Vec<String> {
        self.handle.lock().requests()
    }

    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.handle.lock()
    }

    pub fn handle(&self) -> &Handle<S> {
        &self.handle
    }
}

impl<S: Model> Emulator for Served<S> {
    fn url(&self) -> String {
        self.handle.url()
    }
    fn hold_provisioning(&self, id: &str, hold: bool) -> bool {
        self.handle.hold_provisioning(id, hold)
    }
    fn set_backend_state(&self, id: &str, state: &str) -> bool {
        self.handle.set_backend_state(id, state)
    }
    fn set_address(&self, id: &str, ip: Option<&str>) -> bool {
        Emulator::set_address(&self.handle, id, ip)
    }
    fn start_slow_delete(&self, id: &str) -> bool {
        self.handle.start_slow_delete(id)
    }
    fn finish_deletes(&self) {
        Emulator::finish_deletes(&self.handle)
    }
    fn set_locked(&self, id: &str, locked: bool) -> bool {
        Emulator::set_locked(&self.handle, id, locked)
    }
    fn try_plant(&self, plant: Plant) -> Result<String, Refusal> {
        self.handle.try_plant(plant)
    }
    fn inject(&self, fault: Fault) {
        Emulator::inject(&self.handle, fault)
    }
    fn fail_scope(&self, scope: &str, fail: bool) {
        Emulator::fail_scope(&self.handle, scope, fail)
    }
    fn dump(&self) -> Dump {
        Emulator::dump(&self.handle)
    }
    fn reset(&self) {
        Emulator::reset(&self.handle)
    }
    fn set_rate_limit(&self, limit: Option<RateLimit>) {
        Emulator::set_rate_limit(&self.handle, limit)
    }
    fn stats(&self) -> RequestStats {
        Emulator::stats(&self.handle)
    }
    fn reclaim(&self, id: &str) -> Result<bool, Refusal> {
        Emulator::reclaim(&self.handle, id)
    }
    fn set_spot_capacity(&self, available: bool) -> bool {
        Emulator::set_spot_capacity(&self.handle, available)
    }
    fn spot_instances(&self) -> Vec<String> {
        Emulator::spot_instances(&self.handle)
    }
}
