//! Running the conformance suite against a plugin and its emulator, as every provider's
//! tests do.

use egress_emulators::control::Emulator;
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::Placement;
use proxy_operator::conformance::{self, Control, Options, Report, Subject};

/// Every case of the suite against `p`, whose backend `emu` controls, creating at
/// `placement`; each result is printed as it comes.
pub async fn run(p: &WasmProvider, emu: &dyn Emulator, placement: Placement) -> Report {
    let control = Control::new(&emu.url()).unwrap();
    let report = conformance::run(&Subject::wasm(p), &control, &Options::new(placement), |r| {
        eprintln!("{r}")
    })
    .await;
    eprintln!("{}", report.total());
    report
}

/// Every case ran and passed.
pub fn assert_all_pass(report: &Report) {
    assert_eq!(
        report.results.len(),
        conformance::case_names().len(),
        "every case ran"
    );
    let failed: Vec<String> = report.failed().iter().map(|r| r.to_string()).collect();
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}

/// The suite passes against `emu` and leaves no instance behind.
pub async fn assert_passes(p: &WasmProvider, emu: &dyn Emulator, placement: Placement) {
    assert_all_pass(&run(p, emu, placement).await);
    assert!(emu.dump().instances.is_empty(), "the suite cleans up");
}
