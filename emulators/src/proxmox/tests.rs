//! The emulator over HTTP, as a plugin meets it: the token, clones and their temporary config, tasks, the seed
//! upload in pveproxy's field order and its checksum, an attached seed read back, the guest agent, locks and
//! destroy, nextid, failing nodes, and PVE 8's bodies without a message.

use super::*;
use crate::control::Emulator;
use sha2::Digest;
use std::io::{Read, Write};
use std::net::TcpStream;

struct Answer {
    status: u16,
    json: Value,
}

/// A minimal HTTP/1.1 client over a blocking socket (the server has its own thread).
fn call(
    e: &ProxmoxEmulator,
    method: &str,
    path: &str,
    auth: bool,
    ct: &str,
    body: &[u8],
) -> Answer {
    let mut s = TcpStream::connect(e.addr()).unwrap();
    let auth = if auth {
        format!("Authorization: PVEAPIToken={EMULATOR_TOKEN_ID}={EMULATOR_TOKEN_SECRET}\r\n")
    } else {
        String::new()
    };
    let head = format!(
        "{method} /api2/json{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: {ct}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).to_string();
    let (head, mut rest) = raw.split_once("\r\n\r\n").unwrap();
    let mut text = String::new();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        loop {
            let (size, tail) = rest.split_once("\r\n").unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            text.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
    } else {
        text = rest.to_string();
    }
    Answer {
        status: raw[9..12].parse().unwrap(),
        json: serde_json::from_str(&text).unwrap_or(Value::Null),
    }
}

fn api(e: &ProxmoxEmulator, method: &str, path: &str, body: Option<Value>) -> Answer {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    call(e, method, path, true, "application/json", body.as_bytes())
}

fn wait(e: &ProxmoxEmulator, upid: &str) -> Value {
    let node = upid.split(':').nth(1).unwrap();
    for _ in 0..100 {
        let a = api(e, "GET", &format!("/nodes/{node}/tasks/{upid}/status"), None);
        if a.json["data"]["status"] == "stopped" {
            return a.json["data"].clone();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("task {upid} still running");
}

fn clone(e: &ProxmoxEmulator, newid: u32, name: &str) -> Answer {
    api(
        e,
        "POST",
        "/nodes/pve1/qemu/9000/clone",
        Some(json!({"newid": newid, "name": name, "description": "d", "target": "pve2"})),
    )
}

/// A seed image made by hand for these tests (not the plugin's writer): one Joliet file.
fn seed(user_data: &[u8]) -> Vec<u8> {
    let mut img = vec![0u8; 21 * 2048];
    let rec = |lba: u32, len: u32, flags: u8, name: &[u8]| {
        let mut r = vec![0u8; 33 + name.len() + (name.len() + 1) % 2];
        r[0] = r.len() as u8;
        r[2..6].copy_from_slice(&lba.to_le_bytes());
        r[10..14].copy_from_slice(&len.to_le_bytes());
        r[25] = flags;
        r[32] = name.len() as u8;
        r[33..33 + name.len()].copy_from_slice(name);
        r
    };
    for (n, kind) in [(16usize, 1u8), (17, 2), (18, 255)] {
        img[n * 2048] = kind;
        img[n * 2048 + 1..n * 2048 + 6].copy_from_slice(b"CD001");
        img[n * 2048 + 40..n * 2048 + 46].copy_from_slice(b"cidata");
        img[n * 2048 + 88..n * 2048 + 91].copy_from_slice(b"%/E");
        let root = rec(19, 2048, 2, &[0]);
        img[n * 2048 + 156..n * 2048 + 156 + root.len()].copy_from_slice(&root);
    }
    let name: Vec<u8> = "user-data".encode_utf16().flat_map(u16::to_be_bytes).collect();
    let dir =
        [rec(19, 2048, 2, &[0]), rec(19, 2048, 2, &[1]), rec(20, user_data.len() as u32, 0, &name)]
            .concat();
    img[19 * 2048..19 * 2048 + dir.len()].copy_from_slice(&dir);
    img.truncate(20 * 2048);
    img.extend_from_slice(user_data);
    img
}

fn form(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, file, data) in parts {
        let file = file.map(|f| format!("; filename=\"{f}\"")).unwrap_or_default();
        out.extend(
            format!("--B0und\r\nContent-Disposition: form-data; name=\"{name}\"{file}\r\n\r\n")
                .as_bytes(),
        );
        out.extend(*data);
        out.extend(b"\r\n");
    }
    out.extend(b"--B0und--\r\n");
    out
}

fn upload(e: &ProxmoxEmulator, body: &[u8]) -> Answer {
    call(
        e,
        "POST",
        "/nodes/pve2/storage/local/upload",
        true,
        "multipart/form-data; boundary=B0und",
        body,
    )
}

#[test]
fn clones_tasks_seeds_and_the_agent() {
    let e = ProxmoxEmulator::start(ProxmoxConfig {
        clone_time: Duration::from_millis(100),
        ..ProxmoxConfig::default()
    });
    let upid = clone(&e, 900_001, "proxy-a").json["data"].as_str().unwrap().to_string();
    assert!(
        upid.starts_with("UPID:pve1:") && upid.contains(":qmclone:9000:egress@pve!operator:"),
        "{upid}"
    );
    let temp = api(&e, "GET", "/nodes/pve2/qemu/900001/status/current", None).json["data"].clone();
    assert_eq!(
        (temp["name"].as_str(), temp["lock"].as_str()),
        (Some("VM 900001"), Some("clone")),
        "the temporary config"
    );
    assert_eq!(
        api(&e, "GET", "/nodes/pve2/qemu/900001/config", None).json["data"],
        json!({"lock": "clone", "digest": "0".repeat(40)})
    );
    assert_eq!(
        clone(&e, 900_001, "proxy-b").json["message"],
        "unable to create VM 900001: config file already exists\n"
    );
    assert_eq!(wait(&e, &upid)["exitstatus"], "OK");
    let conf = api(&e, "GET", "/nodes/pve2/qemu/900001/config", None).json["data"].clone();
    assert_eq!((conf["name"].as_str(), conf["description"].as_str()), (Some("proxy-a"), Some("d")));
    assert_eq!(
        conf["ide0"], "local-lvm:vm-900001-cloudinit,media=cdrom",
        "the template's Cloud-Init drive"
    );
    assert_eq!(
        api(&e, "GET", "/nodes/pve1/qemu/900001/config", None).status,
        500,
        "on pve2, not pve1"
    );

    // pveproxy's order: content, checksum-algorithm, checksum, then the file named `filename`.
    let image = seed(b"#cloud-config\nruncmd: [x]\n");
    let sum = format!("{:x}", sha2::Sha256::digest(&image));
    let file = ("filename", Some("proxy-a-cidata.iso"), &image[..]);
    let wrong =
        upload(&e, &form(&[("checksum", None, sum.as_bytes()), ("content", None, b"iso"), file]));
    assert!(
        wrong.json["message"].as_str().unwrap().contains("out of pveproxy's order"),
        "{}",
        wrong.json
    );
    let named =
        upload(&e, &form(&[("content", None, b"iso"), ("file", Some("x.iso"), &image[..])]));
    assert!(
        named.json["message"].as_str().unwrap().contains("expected 'filename'"),
        "{}",
        named.json
    );
    let bad = upload(
        &e,
        &form(&[
            ("content", None, b"iso"),
            ("checksum-algorithm", None, b"sha256"),
            ("checksum", None, b"00"),
            file,
        ]),
    );
    assert!(
        wait(&e, bad.json["data"].as_str().unwrap())["exitstatus"]
            .as_str()
            .unwrap()
            .starts_with("checksum mismatch")
    );
    let ok = upload(
        &e,
        &form(&[
            ("content", None, b"iso"),
            ("checksum-algorithm", None, b"sha256"),
            ("checksum", None, sum.as_bytes()),
            file,
        ]),
    );
    assert_eq!(wait(&e, ok.json["data"].as_str().unwrap())["exitstatus"], "OK");
    assert_eq!(e.isos(), ["pve2/local:iso/proxy-a-cidata.iso"]);

    let tags = "egress.managed;egress.uid.u-1;egress.inst.inst-a;egress.created.1700000000;web";
    let put = |body: Value| api(&e, "PUT", "/nodes/pve2/qemu/900001/config", Some(body));
    assert_eq!(
        put(json!({"tags": "egress:uid"})).json["errors"]["tags"],
        "invalid format - invalid characters in tag\n"
    );
    assert_eq!(put(json!({"ide2": "local:iso/missing.iso,media=cdrom"})).status, 500);
    let set = put(
        json!({"tags": tags, "ide2": "local:iso/proxy-a-cidata.iso,media=cdrom", "agent": "1", "delete": "ide0"}),
    );
    assert_eq!((set.status, set.json["data"].clone()), (200, Value::Null));
    let dump = e.dump().instances;
    assert_eq!(
        dump[0].user_data, b"#cloud-config\nruncmd: [x]\n",
        "read from the seed by the emulator's own reader"
    );
    assert!(
        dump[0].labels.contains(&(crate::MARK_UID.to_string(), "u-1".to_string())),
        "{:?}",
        dump[0].labels
    );
    assert!(e.config("900001").unwrap().get("ide0").is_none());
    assert_eq!(e.seed("900001").unwrap().unwrap().label, "cidata");

    let agent = || api(&e, "GET", "/nodes/pve2/qemu/900001/agent/network-get-interfaces", None);
    assert_eq!(agent().json["message"], "VM 900001 is not running\n");
    let start = api(&e, "POST", "/nodes/pve2/qemu/900001/status/start", None).json["data"]
        .as_str()
        .unwrap()
        .to_string();
    let current =
        || api(&e, "GET", "/nodes/pve2/qemu/900001/status/current", None).json["data"].clone();
    assert_eq!(wait(&e, &start)["exitstatus"], "OK", "QEMU was started");
    assert_eq!(agent().json["message"], "QEMU guest agent is not running\n", "the guest boots");
    assert_eq!(current()["status"], "running");
    let ifaces = agent().json["data"]["result"].clone();
    assert_eq!(ifaces[1]["ip-addresses"][0]["ip-address"], "10.20.0.3", "{ifaces}");
    e.set_agent("900001", false);
    assert_eq!(agent().json["message"], "QEMU guest agent is not running\n");

    assert_eq!(
        api(&e, "DELETE", "/nodes/pve2/qemu/900001", None).json["message"],
        "VM 900001 is running - destroy failed\n"
    );
    e.set_locked("900001", true);
    let stop = api(&e, "POST", "/nodes/pve2/qemu/900001/status/stop", None).json["data"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wait(&e, &stop)["exitstatus"], "OK");
    let locked = api(&e, "DELETE", "/nodes/pve2/qemu/900001", None).json["data"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wait(&e, &locked)["exitstatus"], "VM is locked (backup)");
    e.set_locked("900001", false);
    let gone = api(&e, "DELETE", "/nodes/pve2/qemu/900001", None).json["data"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wait(&e, &gone)["exitstatus"], "OK");
    assert!(e.dump().instances.is_empty());
    let del = api(
        &e,
        "DELETE",
        "/nodes/pve2/storage/local/content/local%3Aiso%2Fproxy-a-cidata.iso",
        None,
    );
    assert_eq!(wait(&e, del.json["data"].as_str().unwrap())["exitstatus"], "OK");
    assert!(e.dump().secondary.is_empty());
    assert_eq!(
        api(&e, "GET", &format!("/nodes/pve1/tasks/{}/status", start.replace(':', "%3A")), None)
            .json["errors"]["upid"],
        "no such task\n"
    );
}

fn wait_status(e: &ProxmoxEmulator, upid: &str) -> String {
    api(e, "GET", &format!("/nodes/pve2/tasks/{upid}/status"), None).json["data"]["status"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn failed_clones_and_starts_and_nextid() {
    let e = ProxmoxEmulator::start(ProxmoxConfig::default());
    e.fail_next_clone("clone failed: Linked clone feature is not supported for 'local:9000/base-9000-disk-0.raw' (scsi0)");
    let upid = clone(&e, 900_002, "proxy-c").json["data"].as_str().unwrap().to_string();
    assert!(wait(&e, &upid)["exitstatus"].as_str().unwrap().contains("Linked clone feature"));
    assert!(e.dump().instances.is_empty(), "a failed clone leaves no VM");
    let nextid = |q: &str| api(&e, "GET", &format!("/cluster/nextid{q}"), None).json;
    assert_eq!(nextid("")["data"], "100");
    assert_eq!(nextid("?vmid=9000")["errors"]["vmid"], "VM 9000 already exists\n");
    assert_eq!(nextid("?vmid=900002")["data"], "900002");

    wait(&e, clone(&e, 900_002, "proxy-c").json["data"].as_str().unwrap());
    e.fail_next_start("start failed: QEMU exited with code 1");
    let start = api(&e, "POST", "/nodes/pve2/qemu/900002/status/start", None).json["data"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wait(&e, &start)["exitstatus"], "start failed: QEMU exited with code 1");
    assert_eq!(
        api(&e, "GET", "/nodes/pve2/qemu/900002/status/current", None).json["data"]["status"],
        "stopped"
    );
}

#[test]
fn resources_auth_failing_nodes_and_old_bodies() {
    let e = ProxmoxEmulator::start(ProxmoxConfig {
        messages_in_body: false,
        ..ProxmoxConfig::default()
    });
    let unauth = call(&e, "GET", "/cluster/resources?type=vm", false, "application/json", b"");
    assert_eq!((unauth.status, unauth.json.clone()), (401, Value::Null), "401 with an empty body");
    let id = e.plant(Plant {
        name: "proxy-p".into(),
        scope: "pve2".into(),
        managed: true,
        uid: Some("u/1".into()),
        installation: Some("inst".into()),
        created_at: Some(1_700_000_000),
    });
    let listed = api(&e, "GET", "/cluster/resources?type=vm", None).json["data"].clone();
    assert_eq!(listed[0]["template"], 1);
    assert_eq!(
        listed[1]["tags"],
        "egress.managed;egress.uid.u_2f1;egress.inst.inst;egress.created.1700000000"
    );
    assert_eq!(
        (listed[1]["vmid"].as_u64(), listed[1]["node"].as_str()),
        (Some(id.parse().unwrap()), Some("pve2"))
    );
    e.fail_scope("pve2", true);
    let down = api(&e, "GET", "/cluster/resources?type=vm", None).json["data"][1].clone();
    assert_eq!((down["status"].as_str(), down.get("name")), (Some("unknown"), None));
    let a = api(&e, "GET", &format!("/nodes/pve2/qemu/{id}/status/current"), None);
    assert_eq!(
        (a.status, a.json.clone()),
        (595, json!({"data": null})),
        "PVE 8: no message in the body"
    );
    assert_eq!(
        api(&e, "GET", "/nodes/pve1/status", None).json["data"]["memory"]["total"],
        68_719_476_736u64
    );
    assert_eq!(api(&e, "GET", "/nope", None).status, 501);
    let mut s = TcpStream::connect(e.addr()).unwrap();
    let chunked = "PUT /api2/json/nodes/pve1/qemu/100/config HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
        Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
    s.write_all(chunked.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(
        raw.starts_with("HTTP/1.1 501") && raw.ends_with("chunked transfer encoding not supported"),
        "{raw}"
    );
}

/// PVE's `vm_start` runs inside `lock_config` (qemu-server `PVE/QemuServer.pm`) and a synchronous config write
/// (`PUT .../config`, `update_vm_api` in `PVE/API2/Qemu.pm`) takes the same lock with `lock_config`'s 10 s timeout
/// (pve-guest-common `PVE/AbstractConfig.pm`), then fails as pve-common's `lock_file_full` words it. A stop and a
/// second start take the lock too. Until the start task ends the VM is stopped; then QEMU runs and the guest boots.
#[test]
fn a_start_holds_the_config_lock_until_its_task_ends() {
    assert_eq!(ProxmoxConfig::default().config_lock_wait, Duration::from_secs(10), "PVE's timeout");
    let e = ProxmoxEmulator::start(ProxmoxConfig {
        start_time: Duration::from_millis(700),
        config_lock_wait: Duration::from_millis(200),
        ..ProxmoxConfig::default()
    });
    wait(&e, clone(&e, 900_003, "proxy-s").json["data"].as_str().unwrap());
    let vm = "/nodes/pve2/qemu/900003";
    let post = |what: &str| {
        let a = api(&e, "POST", &format!("{vm}/status/{what}"), None);
        a.json["data"].as_str().unwrap_or_else(|| panic!("{}", a.json)).to_string()
    };
    let status =
        || api(&e, "GET", &format!("{vm}/status/current"), None).json["data"]["status"].clone();
    let locked = "can't lock file '/var/lock/qemu-server/lock-900003.conf' - got timeout";
    let since = Instant::now();
    let start = post("start");
    assert_eq!(wait_status(&e, &start), "running");
    assert_eq!(status(), "stopped", "QEMU does not run before the start's work is done");
    let put = api(&e, "PUT", &format!("{vm}/config"), Some(json!({"description": "x"})));
    assert_eq!((put.status, put.json["message"].as_str()), (500, Some(&*format!("{locked}\n"))));
    assert!(since.elapsed() >= Duration::from_millis(200), "it waited for the lock first");
    assert_eq!(e.config("900003").unwrap()["description"], "d", "nothing was written");
    assert_eq!(wait(&e, &post("start"))["exitstatus"], locked, "a second start waits as long");
    assert_eq!(wait(&e, &start)["exitstatus"], "OK");
    assert!(since.elapsed() >= Duration::from_millis(700), "{:?}", since.elapsed());
    assert_eq!(status(), "running", "QEMU runs once the start task has ended");
    let put = api(&e, "PUT", &format!("{vm}/config"), Some(json!({"description": "y"})));
    assert_eq!(put.status, 200, "{}", put.json);

    // A wait that outlasts the start gets the lock: the write goes through, a second start finds the VM running,
    // and a stop stops it after the start.
    let e = ProxmoxEmulator::start(ProxmoxConfig {
        start_time: Duration::from_millis(300),
        config_lock_wait: Duration::from_secs(5),
        ..ProxmoxConfig::default()
    });
    wait(&e, clone(&e, 900_004, "proxy-t").json["data"].as_str().unwrap());
    let vm = "/nodes/pve2/qemu/900004";
    let post = |what: &str| {
        api(&e, "POST", &format!("{vm}/status/{what}"), None).json["data"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let since = Instant::now();
    let start = post("start");
    let again = post("start");
    let put =
        api(&e, "PUT", &format!("{vm}/config"), Some(json!({"description": "z", "agent": "1"})));
    assert_eq!(put.status, 200, "{}", put.json);
    assert!(since.elapsed() >= Duration::from_millis(300), "{:?}", since.elapsed());
    assert_eq!(e.config("900004").unwrap()["description"], "z");
    assert_eq!(wait(&e, &start)["exitstatus"], "OK");
    assert_eq!(wait(&e, &again)["exitstatus"], "VM 900004 already running");
    let agent = api(&e, "GET", &format!("{vm}/agent/network-get-interfaces"), None);
    assert_eq!(agent.json["message"], "QEMU guest agent is not running\n", "the guest is booting");
    api(&e, "POST", &format!("{vm}/status/stop"), None);
    e.set_start_time(Duration::from_millis(300));
    let start = post("start");
    let stop = post("stop");
    assert_eq!(wait_status(&e, &stop), "running", "the stop waits for the start's lock");
    assert_eq!(wait(&e, &start)["exitstatus"], "OK");
    assert_eq!(wait(&e, &stop)["exitstatus"], "OK");
    let current = api(&e, "GET", &format!("{vm}/status/current"), None).json["data"].clone();
    assert_eq!(current["status"], "stopped", "{current}");
}
