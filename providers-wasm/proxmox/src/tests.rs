//! Native tests of the pure parts in lib.rs: VMID candidates, the phase of a VM, the start marker, the profile and
//! the seed image's layout. Module tests cover the config, marks, IDs and the classify table.

use super::*;

fn config(range: &str) -> config::Config {
    config::parse(&format!(
        r#"{{"endpoint":"https://pve:8006","tokenId":"a@pve!b","nodes":["pve1"],"templates":{{"d":9000}}{range}}}"#
    ))
    .unwrap()
}

#[test]
fn candidates_derive_from_the_name_and_stay_in_range() {
    let c = config("");
    let a = candidates(&c, "proxy-aaaaaaaaaaaaaaaa");
    assert_eq!(a, candidates(&c, "proxy-aaaaaaaaaaaaaaaa"), "the same name, the same VMIDs");
    assert_eq!(a.len(), 8);
    assert!(a.iter().all(|v| (900_000..=999_999).contains(v)), "{a:?}");
    assert_eq!(a[1], if a[0] == 999_999 { 900_000 } else { a[0] + 1 });
    assert_ne!(a[0], candidates(&c, "proxy-bbbbbbbbbbbbbbbb")[0]);
    let small = config(r#","vmidRange":[500,502]"#);
    let s = candidates(&small, "proxy-aaaaaaaaaaaaaaaa");
    assert!(s.iter().all(|v| (500..=502).contains(v)) && s.len() <= 8, "{s:?}");
}

#[test]
fn phases() {
    let cases = [
        ("destroyed", "stopped", "stopped", Phase::Destroying),
        ("clone", "stopped", "stopped", Phase::Building),
        ("create", "stopped", "", Phase::Building),
        ("", "running", "running", Phase::Up),
        ("backup", "running", "running", Phase::Up),
        ("", "running", "", Phase::Up),
        ("", "running", "paused", Phase::Other),
        ("suspended", "stopped", "stopped", Phase::Down),
        ("", "stopped", "stopped", Phase::Down),
        ("", "egress-conformance-unknown-state", "", Phase::Other),
    ];
    for (lock, status, qmp, want) in cases {
        assert_eq!(phase(lock, status, qmp), want, "{lock} {status} {qmp}");
    }
}

/// The marker profile: never started and starting are Provisioning, never Stopped.
#[test]
fn start_marker() {
    let task = |status: &str, exit: &str| Task { status: status.into(), exitstatus: exit.into() };
    let upid = "UPID:pve1:0001E240:0A1B2C3D:6750B5C0:qmstart:900100:a@pve!b:";
    let state = |m: Option<&str>, t: Option<Task>| after_start(900100, m, t.as_ref()).map(|(s, _)| s);
    assert_eq!(state(None, None).unwrap(), State::Provisioning);
    assert_eq!(state(Some(upid), Some(task("running", ""))).unwrap(), State::Provisioning);
    assert_eq!(state(Some(upid), Some(task("stopped", "OK"))).unwrap(), State::Stopped);
    assert_eq!(state(Some(upid), Some(task("stopped", "WARNINGS: 1"))).unwrap(), State::Stopped);
    assert_eq!(state(Some(upid), None).unwrap(), State::Stopped, "a task the node forgot ran long ago");
    assert_eq!(state(Some("started"), None).unwrap(), State::Stopped);
    assert_eq!(state(Some(upid), Some(task("stopped", "VM 900100 already running"))).unwrap(), State::Stopped);
    let e = state(Some(upid), Some(task("stopped", "start failed: QEMU exited with code 1"))).unwrap_err();
    assert_eq!((e.class, e.code.as_deref()), (sdk::ErrorClass::Transient, Some("TaskFailed")));
    assert!(e.message.contains("QEMU exited with code 1") && e.message.contains(upid), "{}", e.message);
}

#[test]
fn user_data_up_to_a_mib() {
    assert!(fits(b"").is_ok() && fits(&vec![0xff; USER_DATA_MAX]).is_ok());
    let e = fits(&vec![b'a'; USER_DATA_MAX + 1]).unwrap_err();
    assert_eq!((e.class, e.code.as_deref()), (sdk::ErrorClass::Permanent, Some("UserDataTooLarge")));
}

#[test]
fn made_names() {
    assert!(looks_made(&sdk::name_from_uid("3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01")));
    for other in ["proxy-abc", "web-1", "proxy-AAAAAAAAAAAAAAAA", "proxy-aaaaaaaaaaaaaaa1"] {
        assert!(!looks_made(other), "{other}");
    }
}

/// The seed image's fixed structure; the emulator reads it back with a reader of its own in the host tests.
#[test]
fn seed_image_layout() {
    let mut img = Vec::new();
    let user = b"#cloud-config\nruncmd: [echo hi]\n".repeat(100);
    iso::write(&mut img, &[("meta-data", b"instance-id: x\n"), ("user-data", &user)], 1_733_132_400).unwrap();
    assert_eq!(img.len() % 2048, 0);
    assert_eq!(img.len() / 2048, 25 + 1 + user.len().div_ceil(2048));
    assert_eq!(&img[16 * 2048..16 * 2048 + 6], b"\x01CD001");
    assert_eq!(&img[16 * 2048 + 40..16 * 2048 + 46], b"cidata");
    assert_eq!(&img[17 * 2048..17 * 2048 + 6], b"\x02CD001");
    assert_eq!(&img[17 * 2048 + 88..17 * 2048 + 91], b"%/E");
    assert_eq!(&img[18 * 2048..18 * 2048 + 6], b"\xffCD001");
    assert_eq!(&img[26 * 2048..26 * 2048 + user.len()], &user[..], "user data byte for byte");
    assert_eq!(&img[16 * 2048 + 813..16 * 2048 + 827], b"20241202094000");
}

#[test]
fn info_names_the_type_and_check() {
    let info = <Proxmox as Provider>::info();
    assert_eq!((info.type_name.as_str(), info.has_check), ("proxmox", true));
    assert!(info.default_hosts.is_empty());
    assert_eq!(info.profile.len(), 19);
}
