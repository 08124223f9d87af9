//! The binary package format, version 1 (specified in `docs/package.md`).
//!
//! Everything is little-endian. The reader trusts nothing: every length is checked
//! against the bytes that remain before anything is allocated, every enum tag and
//! flag word is checked, every section carries a CRC32, and the decoded package is
//! then checked against its own embedded machine by [`validate`].

use crate::model::*;
use tessera_machine::Machine;

/// The eight bytes every package starts with.
pub const MAGIC: [u8; 8] = *b"TSRPKG\0\0";
/// The format version this crate writes and reads.
pub const FORMAT_VERSION: u32 = 3;

const SECTION_MACHINE: u32 = 1;
const SECTION_TILES: u32 = 2;
const SECTION_EXCHANGES: u32 = 3;
const SECTION_BINDINGS: u32 = 4;
/// Version 1 has exactly these sections, in this order.
const SECTIONS: [(u32, &str); 4] = [
    (SECTION_MACHINE, "machine"),
    (SECTION_TILES, "tiles"),
    (SECTION_EXCHANGES, "exchanges"),
    (SECTION_BINDINGS, "bindings"),
];
const TABLE_ENTRY_BYTES: usize = 24;
const HEADER_FIXED_BYTES: usize = 16;

const PERM_READ: u8 = 1;
const PERM_WRITE: u8 = 2;
const PERM_EXECUTE: u8 = 4;

/// Why a package could not be read, or is not a consistent package.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    // The OS error is the source, not part of the message: reports that print the
    // chain (`{:#}`) would otherwise show it twice.
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A package file that is not a valid package: the file, then why.
    #[error("{path}: {error}")]
    File {
        path: String,
        error: Box<PackageError>,
    },
    #[error("not a tessera package: the file does not start with the package magic")]
    BadMagic,
    #[error("unsupported package format version {found} (this build reads version {supported})")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error(
        "truncated package: {what} at byte {offset} needs {needed} bytes but only {available} remain"
    )]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("package header is corrupt: checksum {stored:#010x} stored, {computed:#010x} computed")]
    HeaderChecksum { stored: u32, computed: u32 },
    #[error("package section table is invalid: {0}")]
    SectionTable(String),
    #[error(
        "{section} section is corrupt: checksum {stored:#010x} stored, {computed:#010x} computed"
    )]
    SectionChecksum {
        section: &'static str,
        stored: u32,
        computed: u32,
    },
    #[error("malformed {section} section at byte {offset} of the section: {message}")]
    Malformed {
        section: &'static str,
        offset: u64,
        message: String,
    },
    #[error("the embedded machine description is invalid: {0}")]
    Machine(String),
    #[error("tile {tile} does not exist: the machine has {tiles} tiles")]
    TileOutOfRange { tile: u32, tiles: u32 },
    #[error(
        "tile images must be in strictly increasing tile order: tile {tile} follows tile {prev}"
    )]
    TilesNotSorted { prev: u32, tile: u32 },
    #[error("tile {tile}: segment `{name}`: {reason}")]
    BadSegment {
        tile: u32,
        name: String,
        reason: String,
    },
    #[error("tile {tile}: segments `{first}` and `{second}` overlap")]
    SegmentOverlap {
        tile: u32,
        first: String,
        second: String,
    },
    #[error("tile {tile}: entry point {entry:#x} {reason}")]
    BadEntry {
        tile: u32,
        entry: u32,
        reason: String,
    },
    #[error("tile {tile}: symbol `{name}`: {reason}")]
    BadSymbol {
        tile: u32,
        name: String,
        reason: String,
    },
    #[error("exchange id {id} is used twice")]
    DuplicateExchange { id: u16 },
    #[error("host binding `{name}`: {reason}")]
    BadBinding { name: String, reason: String },
    #[error("host binding name `{name}` is used twice")]
    DuplicateBinding { name: String },
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

/// Serialises a package. The output depends only on the package (no timestamps, no
/// hash-map order), so equal packages give byte-identical files. The package is not
/// validated here: call [`validate`] first, or use [`write_package_file`].
pub fn write_package(p: &Package) -> Vec<u8> {
    let sections: [Vec<u8>; 4] = [
        machine_section(p),
        tiles_section(p),
        exchanges_section(p),
        bindings_section(p),
    ];
    let header_len = HEADER_FIXED_BYTES + SECTIONS.len() * TABLE_ENTRY_BYTES + 4;
    let total: usize = header_len + sections.iter().map(Vec::len).sum::<usize>();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&MAGIC);
    put_u32(&mut out, FORMAT_VERSION);
    put_u32(&mut out, SECTIONS.len() as u32);
    let mut offset = header_len as u64;
    for ((kind, _), body) in SECTIONS.iter().zip(&sections) {
        put_u32(&mut out, *kind);
        put_u32(&mut out, crc32fast::hash(body));
        put_u64(&mut out, offset);
        put_u64(&mut out, body.len() as u64);
        offset += body.len() as u64;
    }
    let header_crc = crc32fast::hash(&out);
    put_u32(&mut out, header_crc);
    for body in &sections {
        out.extend_from_slice(body);
    }
    out
}

fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}
fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
/// Lengths are u32 in the format; the model never holds anything near 4 GiB in one
/// field, and the reader rejects what does not fit in the file anyway.
fn put_len(out: &mut Vec<u8>, n: usize) {
    put_u32(out, u32::try_from(n).unwrap_or(u32::MAX));
}
fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_len(out, b.len());
    out.extend_from_slice(b);
}
fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

fn machine_section(p: &Package) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, &p.machine_toml);
    out
}

fn perms_bits(p: Perms) -> u8 {
    (if p.read { PERM_READ } else { 0 })
        | (if p.write { PERM_WRITE } else { 0 })
        | (if p.execute { PERM_EXECUTE } else { 0 })
}

fn tiles_section(p: &Package) -> Vec<u8> {
    let mut out = Vec::new();
    put_len(&mut out, p.tiles.len());
    for t in &p.tiles {
        put_u32(&mut out, t.tile);
        put_u32(&mut out, t.entry);
        put_len(&mut out, t.segments.len());
        for s in &t.segments {
            put_str(&mut out, &s.name);
            put_u32(&mut out, s.addr);
            put_u32(&mut out, s.size);
            put_u8(&mut out, perms_bits(s.perms));
            put_bytes(&mut out, &s.bytes);
        }
        put_len(&mut out, t.symbols.len());
        for s in &t.symbols {
            put_str(&mut out, &s.name);
            put_u32(&mut out, s.addr);
            put_u32(&mut out, s.size);
            put_u8(
                &mut out,
                match s.kind {
                    SymbolKind::Code => 0,
                    SymbolKind::Data => 1,
                },
            );
        }
    }
    out
}

fn exchanges_section(p: &Package) -> Vec<u8> {
    let mut out = Vec::new();
    put_len(&mut out, p.exchanges.len());
    for x in &p.exchanges {
        put_u16(&mut out, x.id);
        put_str(&mut out, &x.name);
    }
    out
}

fn bindings_section(p: &Package) -> Vec<u8> {
    let mut out = Vec::new();
    put_len(&mut out, p.bindings.len());
    for b in &p.bindings {
        put_str(&mut out, &b.name);
        put_u8(
            &mut out,
            match b.kind {
                BindingKind::Input => 0,
                BindingKind::Output => 1,
                BindingKind::Weight => 2,
            },
        );
        put_u32(&mut out, b.bytes);
        put_len(&mut out, b.slices.len());
        for s in &b.slices {
            put_u32(&mut out, s.tile);
            put_u32(&mut out, s.tile_addr);
            put_u32(&mut out, s.offset);
            put_u32(&mut out, s.bytes);
        }
        put_bytes(&mut out, &b.data);
    }
    out
}

// ---------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------

/// Parses and validates a package. Any truncation, checksum mismatch, malformed
/// field or inconsistency with the embedded machine is an error; this function
/// never panics and never allocates more than the input could describe.
pub fn read_package(data: &[u8]) -> Result<Package, PackageError> {
    let bodies = read_header(data)?;
    let machine_toml = {
        let mut r = Reader::new(bodies[0], "machine");
        let s = r.string()?;
        r.finish()?;
        s
    };
    let tiles = read_tiles(bodies[1])?;
    let exchanges = read_exchanges(bodies[2])?;
    let bindings = read_bindings(bodies[3])?;
    let p = Package {
        machine_toml,
        tiles,
        exchanges,
        bindings,
    };
    validate(&p)?;
    Ok(p)
}

/// Checks magic, version, header checksum and section table; returns the section
/// bodies (already checksum-verified) in format order.
fn read_header(data: &[u8]) -> Result<[&[u8]; 4], PackageError> {
    let avail = data.len() as u64;
    if data.len() < MAGIC.len() {
        // A short prefix of the magic is still a truncated package, not a foreign file.
        if MAGIC.starts_with(data) {
            return Err(PackageError::Truncated {
                what: "header",
                offset: 0,
                needed: HEADER_FIXED_BYTES as u64,
                available: avail,
            });
        }
        return Err(PackageError::BadMagic);
    }
    if data[..8] != MAGIC {
        return Err(PackageError::BadMagic);
    }
    if data.len() < HEADER_FIXED_BYTES {
        return Err(PackageError::Truncated {
            what: "header",
            offset: 0,
            needed: HEADER_FIXED_BYTES as u64,
            available: avail,
        });
    }
    let version = le_u32(&data[8..12]);
    if version != FORMAT_VERSION {
        return Err(PackageError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let count = le_u32(&data[12..16]);
    if count as usize != SECTIONS.len() {
        // Checked before the checksum so that a huge count never drives a huge read;
        // the checksum below still covers this field for every other value.
        let header_len = (HEADER_FIXED_BYTES + SECTIONS.len() * TABLE_ENTRY_BYTES + 4) as u64;
        if avail < header_len {
            return Err(PackageError::Truncated {
                what: "section table",
                offset: HEADER_FIXED_BYTES as u64,
                needed: header_len - HEADER_FIXED_BYTES as u64,
                available: avail - HEADER_FIXED_BYTES as u64,
            });
        }
        return Err(PackageError::SectionTable(format!(
            "{count} sections listed, version {FORMAT_VERSION} has exactly {}",
            SECTIONS.len()
        )));
    }
    let table_end = HEADER_FIXED_BYTES + SECTIONS.len() * TABLE_ENTRY_BYTES;
    let header_len = table_end + 4;
    if data.len() < header_len {
        return Err(PackageError::Truncated {
            what: "section table",
            offset: HEADER_FIXED_BYTES as u64,
            needed: (header_len - HEADER_FIXED_BYTES) as u64,
            available: avail - HEADER_FIXED_BYTES as u64,
        });
    }
    let stored = le_u32(&data[table_end..header_len]);
    let computed = crc32fast::hash(&data[..table_end]);
    if stored != computed {
        return Err(PackageError::HeaderChecksum { stored, computed });
    }
    let mut bodies: [&[u8]; 4] = [&[]; 4];
    let mut expected_offset = header_len as u64;
    for (i, (kind, name)) in SECTIONS.iter().enumerate() {
        let e = &data[HEADER_FIXED_BYTES + i * TABLE_ENTRY_BYTES..][..TABLE_ENTRY_BYTES];
        let found_kind = le_u32(&e[0..4]);
        let crc = le_u32(&e[4..8]);
        let offset = le_u64(&e[8..16]);
        let len = le_u64(&e[16..24]);
        if found_kind != *kind {
            return Err(PackageError::SectionTable(format!(
                "entry {i} has kind {found_kind}, expected {kind} ({name})"
            )));
        }
        if offset != expected_offset {
            return Err(PackageError::SectionTable(format!(
                "{name} section starts at byte {offset}, expected {expected_offset} (sections are contiguous)"
            )));
        }
        let end = offset.checked_add(len).ok_or_else(|| {
            PackageError::SectionTable(format!("{name} section length {len} overflows"))
        })?;
        if end > avail {
            return Err(PackageError::Truncated {
                what: name,
                offset,
                needed: len,
                available: avail.saturating_sub(offset),
            });
        }
        // Both fit in the slice length, hence in usize.
        let body = &data[offset as usize..end as usize];
        let computed = crc32fast::hash(body);
        if computed != crc {
            return Err(PackageError::SectionChecksum {
                section: name,
                stored: crc,
                computed,
            });
        }
        bodies[i] = body;
        expected_offset = end;
    }
    if expected_offset != avail {
        return Err(PackageError::SectionTable(format!(
            "{} bytes follow the last section",
            avail - expected_offset
        )));
    }
    Ok(bodies)
}

/// Recomputes the section checksums and the header checksum of `data` in place,
/// for every section whose table entry lies inside `data`; returns `false`, leaving
/// `data` alone, when the input is too short to hold a section table. For tests and
/// fuzzing: a corrupted field behind valid checksums reaches the reader's field
/// checks instead of stopping at the first checksum.
pub fn reseal_checksums(data: &mut [u8]) -> bool {
    let table_end = HEADER_FIXED_BYTES + SECTIONS.len() * TABLE_ENTRY_BYTES;
    if data.len() < table_end + 4 {
        return false;
    }
    for i in 0..SECTIONS.len() {
        let e = HEADER_FIXED_BYTES + i * TABLE_ENTRY_BYTES;
        let offset = le_u64(&data[e + 8..e + 16]);
        let len = le_u64(&data[e + 16..e + 24]);
        if let Some(end) = offset.checked_add(len)
            && end <= data.len() as u64
        {
            // Both bounded by the slice length, hence in usize.
            let crc = crc32fast::hash(&data[offset as usize..end as usize]);
            data[e + 4..e + 8].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&data[..table_end]);
    data[table_end..table_end + 4].copy_from_slice(&crc.to_le_bytes());
    true
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}
fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// A cursor over one section body. Every read is bounds-checked; errors name the
/// section and the offset within it.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    section: &'static str,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8], section: &'static str) -> Self {
        Reader {
            data,
            pos: 0,
            section,
        }
    }
    fn malformed(&self, message: String) -> PackageError {
        PackageError::Malformed {
            section: self.section,
            offset: self.pos as u64,
            message,
        }
    }
    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], PackageError> {
        if n > self.remaining() {
            return Err(self.malformed(format!(
                "{what} needs {n} bytes but the section has {} left",
                self.remaining()
            )));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, PackageError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, PackageError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, PackageError> {
        Ok(le_u32(self.take(4, what)?))
    }
    /// A count of items each at least `min_item_bytes` long: rejected before any
    /// allocation if the section cannot possibly hold that many.
    fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize, PackageError> {
        let at = self.pos;
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_item_bytes) > self.remaining() {
            self.pos = at;
            return Err(self.malformed(format!(
                "{n} {what} cannot fit in the {} bytes left",
                self.remaining() - 4
            )));
        }
        Ok(n)
    }
    fn bytes(&mut self, what: &str) -> Result<Vec<u8>, PackageError> {
        let n = self.u32(what)? as usize;
        Ok(self.take(n, what)?.to_vec())
    }
    fn string(&mut self) -> Result<String, PackageError> {
        let at = self.pos;
        let b = self.bytes("string")?;
        String::from_utf8(b).map_err(|_| {
            self.pos = at;
            self.malformed("string is not valid UTF-8".into())
        })
    }
    fn finish(&self) -> Result<(), PackageError> {
        if self.remaining() != 0 {
            return Err(self.malformed(format!(
                "{} unexpected bytes after the last item",
                self.remaining()
            )));
        }
        Ok(())
    }
}

fn read_tiles(body: &[u8]) -> Result<Vec<TileImage>, PackageError> {
    let mut r = Reader::new(body, "tiles");
    // tile, entry, two counts.
    let n = r.count("tile images", 16)?;
    let mut tiles = Vec::with_capacity(n);
    for _ in 0..n {
        let tile = r.u32("tile id")?;
        let entry = r.u32("entry")?;
        // name length, addr, size, perms, byte length.
        let nseg = r.count("segments", 17)?;
        let mut segments = Vec::with_capacity(nseg);
        for _ in 0..nseg {
            let name = r.string()?;
            let addr = r.u32("segment address")?;
            let size = r.u32("segment size")?;
            let at = r.pos;
            let bits = r.u8("segment permissions")?;
            if bits & !(PERM_READ | PERM_WRITE | PERM_EXECUTE) != 0 {
                r.pos = at;
                return Err(r.malformed(format!("unknown permission bits {bits:#04x}")));
            }
            let bytes = r.bytes("segment contents")?;
            segments.push(Segment {
                name,
                addr,
                size,
                bytes,
                perms: Perms {
                    read: bits & PERM_READ != 0,
                    write: bits & PERM_WRITE != 0,
                    execute: bits & PERM_EXECUTE != 0,
                },
            });
        }
        // name length, addr, size, kind.
        let nsym = r.count("symbols", 13)?;
        let mut symbols = Vec::with_capacity(nsym);
        for _ in 0..nsym {
            let name = r.string()?;
            let addr = r.u32("symbol address")?;
            let size = r.u32("symbol size")?;
            let at = r.pos;
            let kind = match r.u8("symbol kind")? {
                0 => SymbolKind::Code,
                1 => SymbolKind::Data,
                k => {
                    r.pos = at;
                    return Err(r.malformed(format!("unknown symbol kind {k}")));
                }
            };
            symbols.push(Symbol {
                name,
                addr,
                size,
                kind,
            });
        }
        tiles.push(TileImage {
            tile,
            segments,
            entry,
            symbols,
        });
    }
    r.finish()?;
    Ok(tiles)
}

fn read_exchanges(body: &[u8]) -> Result<Vec<ExchangeProgram>, PackageError> {
    let mut r = Reader::new(body, "exchanges");
    // id, name length.
    let n = r.count("exchange programs", 6)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let id = r.u16("exchange id")?;
        let name = r.string()?;
        out.push(ExchangeProgram { id, name });
    }
    r.finish()?;
    Ok(out)
}

fn read_bindings(body: &[u8]) -> Result<Vec<HostBinding>, PackageError> {
    let mut r = Reader::new(body, "bindings");
    // name length, kind, bytes, slice count.
    let n = r.count("host bindings", 13)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let name = r.string()?;
        let at = r.pos;
        let kind = match r.u8("binding kind")? {
            0 => BindingKind::Input,
            1 => BindingKind::Output,
            2 => BindingKind::Weight,
            k => {
                r.pos = at;
                return Err(r.malformed(format!("unknown binding kind {k}")));
            }
        };
        let bytes = r.u32("binding length")?;
        let ns = r.count("slices", 16)?;
        let mut slices = Vec::with_capacity(ns);
        for _ in 0..ns {
            slices.push(BindingSlice {
                tile: r.u32("slice tile")?,
                tile_addr: r.u32("slice address")?,
                offset: r.u32("slice offset")?,
                bytes: r.u32("slice length")?,
            });
        }
        let data = r.bytes("binding data")?;
        out.push(HostBinding {
            name,
            kind,
            bytes,
            slices,
            data,
        });
    }
    r.finish()?;
    Ok(out)
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

/// Checks a package against its embedded machine: tile ids in range and strictly
/// increasing; segments non-empty, inside SRAM, initialised bytes below the loader
/// limit, executable segments only in executable regions, no two segments of a
/// tile overlapping; the entry point 4-aligned inside an executable segment;
/// symbols named, unique per tile and inside SRAM; exchange ids unique with valid,
/// in-SRAM transfers; binding names unique with slices inside both the host buffer
/// and the tile's SRAM.
pub fn validate(p: &Package) -> Result<(), PackageError> {
    let m = Machine::from_toml(&p.machine_toml, "package")
        .map_err(|e| PackageError::Machine(e.to_string()))?;
    let mut prev: Option<u32> = None;
    for t in &p.tiles {
        check_tile(&m, t.tile)?;
        if let Some(prev) = prev
            && t.tile <= prev
        {
            return Err(PackageError::TilesNotSorted { prev, tile: t.tile });
        }
        prev = Some(t.tile);
        validate_tile(&m, t)?;
    }
    let mut ids: Vec<u16> = p.exchanges.iter().map(|x| x.id).collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(PackageError::DuplicateExchange { id: w[0] });
    }
    let mut names: Vec<&str> = p.bindings.iter().map(|b| b.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(PackageError::DuplicateBinding {
            name: w[0].to_string(),
        });
    }
    for b in &p.bindings {
        validate_binding(&m, b)?;
    }
    Ok(())
}

fn check_tile(m: &Machine, tile: u32) -> Result<(), PackageError> {
    if tile >= m.tiles {
        return Err(PackageError::TileOutOfRange {
            tile,
            tiles: m.tiles,
        });
    }
    Ok(())
}

/// Whether `[addr, addr + len)` lies inside SRAM (`len` may be zero).
fn in_sram(m: &Machine, addr: u32, len: u64) -> bool {
    let end = u64::from(addr) + len;
    addr >= m.sram_start() && end <= u64::from(m.sram_end())
}

/// Whether every byte of `[addr, addr + len)` is in an executable region.
fn all_executable(m: &Machine, addr: u32, len: u64) -> bool {
    let end = u64::from(addr) + len;
    m.regions.iter().all(|r| {
        let overlaps = u64::from(r.start) < end && addr < r.end;
        !overlaps || r.executable
    }) && in_sram(m, addr, len)
}

fn validate_tile(m: &Machine, t: &TileImage) -> Result<(), PackageError> {
    let seg_err = |s: &Segment, reason: String| PackageError::BadSegment {
        tile: t.tile,
        name: s.name.clone(),
        reason,
    };
    for s in &t.segments {
        let range = format!(
            "[{:#x}, {:#x})",
            s.addr,
            u64::from(s.addr) + u64::from(s.size)
        );
        if s.size == 0 {
            return Err(seg_err(s, "segment is empty".into()));
        }
        if s.bytes.len() as u64 > u64::from(s.size) {
            return Err(seg_err(
                s,
                format!(
                    "{} initial bytes exceed the segment size {}",
                    s.bytes.len(),
                    s.size
                ),
            ));
        }
        if !in_sram(m, s.addr, u64::from(s.size)) {
            return Err(seg_err(
                s,
                format!(
                    "{range} is outside tile SRAM [{:#x}, {:#x})",
                    m.sram_start(),
                    m.sram_end()
                ),
            ));
        }
        let init_end = u64::from(s.addr) + s.bytes.len() as u64;
        if !s.bytes.is_empty() && init_end > u64::from(m.loader_limit) {
            return Err(seg_err(
                s,
                format!(
                    "initialised bytes end at {init_end:#x}, past the loader limit {:#x}",
                    m.loader_limit
                ),
            ));
        }
        if s.perms.execute && !all_executable(m, s.addr, u64::from(s.size)) {
            return Err(seg_err(
                s,
                format!("executable segment {range} extends outside the executable region"),
            ));
        }
    }
    let mut order: Vec<&Segment> = t.segments.iter().collect();
    order.sort_by_key(|s| s.addr);
    for w in order.windows(2) {
        if u64::from(w[0].addr) + u64::from(w[0].size) > u64::from(w[1].addr) {
            return Err(PackageError::SegmentOverlap {
                tile: t.tile,
                first: w[0].name.clone(),
                second: w[1].name.clone(),
            });
        }
    }
    let entry_err = |reason: &str| PackageError::BadEntry {
        tile: t.tile,
        entry: t.entry,
        reason: reason.into(),
    };
    if !t.entry.is_multiple_of(4) {
        return Err(entry_err("is not 4-byte aligned"));
    }
    let in_code = t.segments.iter().any(|s| {
        s.perms.execute
            && s.addr <= t.entry
            && u64::from(t.entry) + 4 <= u64::from(s.addr) + u64::from(s.size)
    });
    if !in_code {
        return Err(entry_err("is not inside an executable segment"));
    }
    let mut names: Vec<&str> = Vec::with_capacity(t.symbols.len());
    for s in &t.symbols {
        let sym_err = |reason: String| PackageError::BadSymbol {
            tile: t.tile,
            name: s.name.clone(),
            reason,
        };
        if s.name.is_empty() {
            return Err(sym_err("symbol name is empty".into()));
        }
        if !in_sram(m, s.addr, u64::from(s.size)) {
            return Err(sym_err(format!(
                "[{:#x}, {:#x}) is outside tile SRAM",
                s.addr,
                u64::from(s.addr) + u64::from(s.size)
            )));
        }
        names.push(&s.name);
    }
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(PackageError::BadSymbol {
            tile: t.tile,
            name: w[0].to_string(),
            reason: "defined twice".into(),
        });
    }
    Ok(())
}

fn validate_binding(m: &Machine, b: &HostBinding) -> Result<(), PackageError> {
    let err = |reason: String| PackageError::BadBinding {
        name: b.name.clone(),
        reason,
    };
    if b.name.is_empty() {
        return Err(err("binding name is empty".into()));
    }
    // A loader allocates the host buffer from this field alone; every host byte a
    // slice can carry lands in some tile's SRAM, so the chip's memory bounds it.
    let chip_bytes = u64::from(m.tiles) * u64::from(m.sram_bytes());
    if u64::from(b.bytes) > chip_bytes {
        return Err(err(format!(
            "a {}-byte host buffer is larger than the machine's {chip_bytes} bytes of SRAM",
            b.bytes
        )));
    }
    if !b.data.is_empty() {
        if b.kind != BindingKind::Weight {
            return Err(err("only a weight binding carries host data".into()));
        }
        if b.data.len() as u64 != u64::from(b.bytes) {
            return Err(err(format!(
                "carries {} bytes of data for a {}-byte buffer",
                b.data.len(),
                b.bytes
            )));
        }
    }
    for (i, s) in b.slices.iter().enumerate() {
        if s.bytes == 0 {
            return Err(err(format!("slice {i} is empty")));
        }
        if u64::from(s.offset) + u64::from(s.bytes) > u64::from(b.bytes) {
            return Err(err(format!(
                "slice {i} covers host bytes [{}, {}) past the buffer's {} bytes",
                s.offset,
                u64::from(s.offset) + u64::from(s.bytes),
                b.bytes
            )));
        }
        if s.tile >= m.tiles {
            return Err(err(format!(
                "slice {i}: tile {} does not exist ({} tiles)",
                s.tile, m.tiles
            )));
        }
        if !in_sram(m, s.tile_addr, u64::from(s.bytes)) {
            return Err(err(format!(
                "slice {i}: tile range {:#x}+{} on tile {} is outside tile SRAM",
                s.tile_addr, s.bytes, s.tile
            )));
        }
    }
    if b.kind == BindingKind::Output {
        // Two tiles writing the same host bytes would make the result order-dependent.
        let mut ranges: Vec<(u32, u64)> = b
            .slices
            .iter()
            .map(|s| (s.offset, u64::from(s.offset) + u64::from(s.bytes)))
            .collect();
        ranges.sort_unstable();
        if let Some(w) = ranges.windows(2).find(|w| w[0].1 > u64::from(w[1].0)) {
            return Err(err(format!(
                "output slices overlap in the host buffer at byte {}",
                w[1].0
            )));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------

/// Reads and validates a package file.
pub fn read_package_file(path: impl AsRef<std::path::Path>) -> Result<Package, PackageError> {
    let path = path.as_ref();
    let data = std::fs::read(path).map_err(|source| PackageError::Io {
        action: "read",
        path: path.display().to_string(),
        source,
    })?;
    read_package(&data).map_err(|e| PackageError::File {
        path: path.display().to_string(),
        error: Box::new(e),
    })
}

/// Validates a package, then writes it; an invalid package is never written.
pub fn write_package_file(
    path: impl AsRef<std::path::Path>,
    p: &Package,
) -> Result<(), PackageError> {
    validate(p)?;
    let path = path.as_ref();
    std::fs::write(path, write_package(p)).map_err(|source| PackageError::Io {
        action: "write",
        path: path.display().to_string(),
        source,
    })
}
