//! A reader of ISO 9660 images as cloud-init's NoCloud datasource meets them, written from ECMA-119 and the Joliet
//! specification and independent of the plugin's writer, so a test that reads the user data back through it proves
//! the bytes on the virtual CD-ROM are the bytes sent. It walks the volume descriptors, takes the volume label,
//! and lists the root directory of the Joliet tree (UCS-2 names, what Linux mounts when there is no Rock Ridge) or,
//! without one, of the primary tree. Subdirectories, multi-extent files and Rock Ridge are not read.

use std::collections::BTreeMap;

const SECTOR: usize = 2048;

/// What a seed image holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The volume identifier (the label cloud-init looks for: `cidata`), trimmed.
    pub label: String,
    /// Whether the names came from a Joliet tree.
    pub joliet: bool,
    /// Root directory files by name (a version suffix `;1` removed), with their contents.
    pub files: BTreeMap<String, Vec<u8>>,
}

fn u32_le(b: &[u8], at: usize) -> Result<u32, String> {
    let s = b.get(at..at + 4).ok_or_else(|| format!("truncated at byte {at}"))?;
    Ok(u32::from_le_bytes(s.try_into().expect("4 bytes")))
}

/// The bytes of an extent, checked against the image's end.
fn extent(img: &[u8], lba: u32, len: u32) -> Result<&[u8], String> {
    let from = lba as usize * SECTOR;
    img.get(from..from + len as usize)
        .ok_or_else(|| format!("extent {lba}+{len} lies past the image end"))
}

fn decode(name: &[u8], joliet: bool) -> Result<String, String> {
    let text = match joliet {
        true => {
            let units: Vec<u16> =
                name.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
            String::from_utf16(&units).map_err(|e| format!("Joliet name: {e}"))?
        }
        false => String::from_utf8(name.to_vec()).map_err(|e| format!("name: {e}"))?,
    };
    let text = text.split(';').next().unwrap_or_default();
    Ok(text.strip_suffix('.').unwrap_or(text).to_string())
}

/// The files listed in the directory whose record (34+ bytes) is `root`.
fn directory(img: &[u8], root: &[u8], joliet: bool) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let dir = extent(img, u32_le(root, 2)?, u32_le(root, 10)?)?;
    let mut files = BTreeMap::new();
    let mut at = 0;
    while at < dir.len() {
        let len = dir[at] as usize;
        if len == 0 {
            at = (at / SECTOR + 1) * SECTOR; // records never cross a sector: the rest is padding
            continue;
        }
        let rec = dir
            .get(at..at + len)
            .filter(|r| r.len() >= 34)
            .ok_or("a directory record runs past its extent")?;
        let name = rec.get(33..33 + rec[32] as usize).ok_or("a name runs past its record")?;
        let is_dir = rec[25] & 2 != 0;
        if !is_dir && name != [0] && name != [1] {
            let data = extent(img, u32_le(rec, 2)?, u32_le(rec, 10)?)?;
            files.insert(decode(name, joliet)?, data.to_vec());
        }
        at += len;
    }
    Ok(files)
}

/// Reads `img`; an error names what is not as ECMA-119 says.
pub fn read(img: &[u8]) -> Result<Image, String> {
    let (mut primary, mut joliet) = (None, None);
    for n in 16.. {
        let d =
            img.get(n * SECTOR..(n + 1) * SECTOR).ok_or("no volume descriptor set terminator")?;
        if &d[1..6] != b"CD001" {
            return Err(format!("sector {n}: no CD001 signature"));
        }
        match d[0] {
            1 => primary = Some(d),
            2 if [&b"%/@"[..], b"%/C", b"%/E"].contains(&&d[88..91]) => joliet = Some(d),
            255 => break,
            _ => {}
        }
    }
    let primary = primary.ok_or("no primary volume descriptor")?;
    let label = String::from_utf8_lossy(&primary[40..72]).trim_end_matches([' ', '\0']).to_string();
    let tree = joliet.unwrap_or(primary);
    let files = directory(img, &tree[156..190], joliet.is_some())?;
    Ok(Image { label, joliet: joliet.is_some(), files })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made image: descriptors and one directory, laid out as the specification says, not as the plugin does.
    fn image(joliet: bool) -> Vec<u8> {
        let mut img = vec![0u8; 22 * SECTOR];
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
        let mut vd = |n: usize, kind: u8, root: Vec<u8>| {
            let d = &mut img[n * SECTOR..(n + 1) * SECTOR];
            d[0] = kind;
            d[1..6].copy_from_slice(b"CD001");
            d[40..72].copy_from_slice(b"CIDATA                          ");
            d[156..156 + root.len()].copy_from_slice(&root);
            if kind == 2 {
                d[88..91].copy_from_slice(b"%/E");
            }
        };
        vd(16, 1, rec(19, 2048, 2, &[0]));
        vd(17, if joliet { 2 } else { 3 }, rec(20, 2048, 2, &[0]));
        img[18 * SECTOR] = 255;
        img[18 * SECTOR + 1..18 * SECTOR + 6].copy_from_slice(b"CD001");
        let utf16: Vec<u8> = "user-data".encode_utf16().flat_map(u16::to_be_bytes).collect();
        for (lba, name) in [(19usize, b"USER_DAT.;1".to_vec()), (20, utf16)] {
            let dir = [
                rec(lba as u32, 2048, 2, &[0]),
                rec(lba as u32, 2048, 2, &[1]),
                rec(21, 5, 0, &name),
            ]
            .concat();
            img[lba * SECTOR..lba * SECTOR + dir.len()].copy_from_slice(&dir);
        }
        img[21 * SECTOR..21 * SECTOR + 5].copy_from_slice(b"hello");
        img
    }

    #[test]
    fn reads_joliet_names_or_falls_back_to_the_primary_tree() {
        let j = read(&image(true)).unwrap();
        assert_eq!((j.label.as_str(), j.joliet), ("CIDATA", true));
        assert_eq!(j.files.get("user-data").map(Vec::as_slice), Some(&b"hello"[..]));
        let p = read(&image(false)).unwrap();
        assert_eq!(
            (p.joliet, p.files.keys().map(String::as_str).collect::<Vec<_>>()),
            (false, vec!["USER_DAT"])
        );
    }

    #[test]
    fn malformed_images_are_named() {
        assert!(read(&[0u8; 100]).unwrap_err().contains("terminator"));
        let mut img = image(true);
        img[16 * SECTOR + 1] = b'X';
        assert!(read(&img).unwrap_err().contains("CD001"));
        let mut img = image(true);
        img[20 * SECTOR + 68 + 10..20 * SECTOR + 68 + 14].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read(&img).unwrap_err().contains("past the image end"), "{:?}", read(&img));
    }
}
