//! The NoCloud seed: an ISO 9660 image with volume id `cidata` and the files `meta-data` and `user-data`, which
//! cloud-init finds on a CD-ROM and reads as it would from a datasource. Written from ECMA-119 and the Joliet
//! specification, because the Proxmox API cannot write snippet files and the image must be built inside the plugin.
//!
//! ISO 9660 level 1 names are `A-Z 0-9 _` in 8.3 form, so `user-data` cannot be a name there: the primary tree holds
//! `USER_DAT.;1` and `META_DAT.;1`, and a Joliet tree (UCS-2 names, what Linux mounts when there is no Rock Ridge)
//! holds the real names. Both trees point at the same extents. Layout, in 2048-byte sectors: 16 empty system sectors,
//! the primary descriptor, the Joliet descriptor, the terminator, four path tables (L and M of each tree), the two
//! root directories, then the files.

use std::io::{self, Write};

const SECTOR: usize = 2048;
/// The sector of the first file: 16 system + 3 descriptors + 4 path tables + 2 directories.
const DATA: u32 = 25;
/// One path table record: the root only.
const PATH_TABLE: u32 = 10;

fn both16(b: &mut [u8], v: u16) {
    b[..2].copy_from_slice(&v.to_le_bytes());
    b[2..4].copy_from_slice(&v.to_be_bytes());
}

fn both32(b: &mut [u8], v: u32) {
    b[..4].copy_from_slice(&v.to_le_bytes());
    b[4..8].copy_from_slice(&v.to_be_bytes());
}

fn sectors(len: usize) -> u32 {
    len.div_ceil(SECTOR) as u32
}

/// `YYYYMMDDHHMMSS` of Unix seconds, via the SDK's RFC 3339 formatter.
fn digits(unix: u64) -> Vec<u8> {
    let t = egress_guest_sdk::time::format_rfc3339(egress_guest_sdk::Datetime { seconds: unix, nanoseconds: 0 });
    t.bytes().filter(u8::is_ascii_digit).collect()
}

/// A directory record (ECMA-119 9.1) with the 7-byte recording date.
fn record(extent: u32, len: u32, dir: bool, name: &[u8], unix: u64) -> Vec<u8> {
    let mut r = vec![0u8; 33];
    r.extend_from_slice(name);
    if r.len() % 2 == 1 {
        r.push(0);
    }
    r[0] = r.len() as u8;
    both32(&mut r[2..10], extent);
    both32(&mut r[10..18], len);
    let d = digits(unix);
    let num = |i: usize| (d[i] - b'0') * 10 + (d[i + 1] - b'0');
    let year = u16::from(num(0)) * 100 + u16::from(num(2));
    r[18] = year.saturating_sub(1900).min(255) as u8;
    for (k, i) in [4, 6, 8, 10, 12].into_iter().enumerate() {
        r[19 + k] = num(i);
    }
    r[25] = if dir { 2 } else { 0 };
    both16(&mut r[28..32], 1);
    r[32] = name.len() as u8;
    r
}

/// Text in a descriptor field: ASCII padded with spaces, or for Joliet UCS-2 big-endian padded with UCS-2 spaces.
fn text(field: &mut [u8], s: &str, joliet: bool) {
    let units: Vec<u8> = match joliet {
        true => s.encode_utf16().chain(std::iter::repeat(0x20)).flat_map(u16::to_be_bytes).take(field.len()).collect(),
        false => s.bytes().chain(std::iter::repeat(b' ')).take(field.len()).collect(),
    };
    field[..units.len()].copy_from_slice(&units);
}

/// The primary (`joliet` false) or Joliet supplementary volume descriptor.
fn descriptor(joliet: bool, total: u32, path_l: u32, root: &[u8], unix: u64) -> Vec<u8> {
    let mut d = vec![0u8; SECTOR];
    d[0] = if joliet { 2 } else { 1 };
    d[1..6].copy_from_slice(b"CD001");
    d[6] = 1;
    text(&mut d[8..40], "", joliet);
    text(&mut d[40..72], "cidata", joliet);
    both32(&mut d[80..88], total);
    if joliet {
        d[88..91].copy_from_slice(b"%/E"); // UCS-2 level 3
    }
    both16(&mut d[120..124], 1);
    both16(&mut d[124..128], 1);
    both16(&mut d[128..132], SECTOR as u16);
    both32(&mut d[132..140], PATH_TABLE);
    d[140..144].copy_from_slice(&path_l.to_le_bytes());
    d[148..152].copy_from_slice(&(path_l + 1).to_be_bytes());
    d[156..156 + root.len()].copy_from_slice(root);
    for (from, to) in [(190, 318), (318, 446), (446, 574), (574, 702), (702, 739), (739, 776), (776, 813)] {
        text(&mut d[from..to], "", joliet);
    }
    let mut date = digits(unix);
    date.extend_from_slice(b"00\0");
    for at in [813, 830] {
        d[at..at + 17].copy_from_slice(&date);
    }
    for at in [847, 864] {
        d[at..at + 16].fill(b'0');
    }
    d[881] = 1;
    d
}

/// The L (little-endian) and M (big-endian) path tables of a tree whose only directory is the root at `root`.
fn path_tables(root: u32) -> Vec<u8> {
    let mut out = vec![0u8; 2 * SECTOR];
    out[0] = 1;
    out[2..6].copy_from_slice(&root.to_le_bytes());
    out[6..8].copy_from_slice(&1u16.to_le_bytes());
    out[SECTOR] = 1;
    out[SECTOR + 2..SECTOR + 6].copy_from_slice(&root.to_be_bytes());
    out[SECTOR + 6..SECTOR + 8].copy_from_slice(&1u16.to_be_bytes());
    out
}

/// A level 1 name: upper case, `_` for anything else, 8 characters, no extension, version 1.
fn iso_name(name: &str) -> Vec<u8> {
    let base: String = name.chars().take(8).map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    format!("{}.;1", base.to_ascii_uppercase()).into_bytes()
}

/// A root directory sector: `.`, `..`, then one record per file at its extent.
fn root_dir(at: u32, files: &[(&str, &[u8])], joliet: bool, unix: u64) -> Vec<u8> {
    let mut out = record(at, SECTOR as u32, true, &[0], unix);
    out.extend(record(at, SECTOR as u32, true, &[1], unix));
    let mut extent = DATA;
    for (name, data) in files {
        let name = match joliet {
            true => name.encode_utf16().flat_map(u16::to_be_bytes).collect(),
            false => iso_name(name),
        };
        out.extend(record(extent, data.len() as u32, false, &name, unix));
        extent += sectors(data.len());
    }
    out.resize(SECTOR, 0);
    out
}

/// Writes the image of `files` (name, contents; in name order, as directories must list them), recorded at `unix`
/// seconds. The contents go in unchanged, so cloud-init reads the user data byte for byte.
pub fn write(out: &mut impl Write, files: &[(&str, &[u8])], unix: u64) -> io::Result<()> {
    debug_assert!(files.windows(2).all(|w| w[0].0 < w[1].0) && files.len() <= 8);
    let total = DATA + files.iter().map(|(_, d)| sectors(d.len())).sum::<u32>();
    let root = |at| record(at, SECTOR as u32, true, &[0], unix);
    out.write_all(&[0u8; 16 * SECTOR])?;
    out.write_all(&descriptor(false, total, 19, &root(23), unix))?;
    out.write_all(&descriptor(true, total, 21, &root(24), unix))?;
    let mut terminator = vec![0u8; SECTOR];
    terminator[..7].copy_from_slice(b"\xffCD001\x01");
    out.write_all(&terminator)?;
    out.write_all(&path_tables(23))?;
    out.write_all(&path_tables(24))?;
    out.write_all(&root_dir(23, files, false, unix))?;
    out.write_all(&root_dir(24, files, true, unix))?;
    for (_, data) in files {
        out.write_all(data)?;
        out.write_all(&vec![0u8; sectors(data.len()) as usize * SECTOR - data.len()])?;
    }
    Ok(())
}
