//! Package format: round trips, determinism, and rejection of truncated, corrupted
//! and inconsistent input.

use proptest::prelude::*;
use tessera_machine::Machine;
use tessera_package::*;

fn small_package() -> Package {
    let rx = Perms {
        read: true,
        write: false,
        execute: true,
    };
    let rw = Perms {
        read: true,
        write: true,
        execute: false,
    };
    let tile = |t: u32| TileImage {
        tile: t,
        segments: vec![
            Segment {
                name: "code".into(),
                addr: 0x4_C000,
                size: 16,
                bytes: vec![1, 2, 3, 4, 5, 6, 7, 8],
                perms: rx,
            },
            Segment {
                name: "data".into(),
                addr: 0x9_0000,
                size: 64,
                bytes: vec![9; 12],
                perms: rw,
            },
        ],
        entry: 0x4_C000,
        symbols: vec![
            Symbol {
                name: "main".into(),
                addr: 0x4_C000,
                size: 16,
                kind: SymbolKind::Code,
            },
            Symbol {
                name: "buf".into(),
                addr: 0x9_0000,
                size: 64,
                kind: SymbolKind::Data,
            },
        ],
    };
    Package {
        machine_toml: Machine::small().to_toml(),
        tiles: vec![tile(0), tile(2)],
        exchanges: vec![ExchangeProgram {
            id: 3,
            name: "halo".into(),
        }],
        bindings: vec![HostBinding {
            data: Vec::new(),
            name: "x".into(),
            kind: BindingKind::Input,
            bytes: 32,
            slices: vec![
                BindingSlice {
                    tile: 0,
                    tile_addr: 0x9_0000,
                    offset: 0,
                    bytes: 16,
                },
                BindingSlice {
                    tile: 2,
                    tile_addr: 0x9_0000,
                    offset: 16,
                    bytes: 16,
                },
            ],
        }],
    }
}

/// Recomputes every checksum after a deliberate edit of a section body, so that the
/// edit reaches the parser and validator instead of stopping at the CRC.
fn fix_checksums(data: &mut [u8]) {
    let table = 16;
    for i in 0..4 {
        let e = table + i * 24;
        let off = u64::from_le_bytes(data[e + 8..e + 16].try_into().unwrap()) as usize;
        let len = u64::from_le_bytes(data[e + 16..e + 24].try_into().unwrap()) as usize;
        let crc = crc32fast::hash(&data[off..off + len]);
        data[e + 4..e + 8].copy_from_slice(&crc.to_le_bytes());
    }
    let end = table + 4 * 24;
    let crc = crc32fast::hash(&data[..end]);
    data[end..end + 4].copy_from_slice(&crc.to_le_bytes());
}

fn rejected(p: &Package) -> PackageError {
    validate(p).expect_err("validate must reject");
    read_package(&write_package(p)).expect_err("read must reject")
}

#[test]
fn round_trip_and_determinism() {
    let p = small_package();
    validate(&p).unwrap();
    let a = write_package(&p);
    let b = write_package(&p.clone());
    assert_eq!(a, b);
    assert_eq!(&a[..8], b"TSRPKG\0\0");
    assert_eq!(read_package(&a).unwrap(), p);
}

#[test]
fn every_truncation_is_an_error() {
    let data = write_package(&small_package());
    for n in 0..data.len() {
        let err = read_package(&data[..n]).expect_err("a prefix must not load");
        assert!(
            matches!(err, PackageError::Truncated { .. } | PackageError::BadMagic),
            "prefix {n}: {err}"
        );
    }
    let mut longer = data.clone();
    longer.push(0);
    assert!(matches!(
        read_package(&longer),
        Err(PackageError::SectionTable(_))
    ));
}

#[test]
fn every_byte_flip_is_detected() {
    let data = write_package(&small_package());
    for i in 0..data.len() {
        for mask in [0x01u8, 0x80, 0xFF] {
            let mut bad = data.clone();
            bad[i] ^= mask;
            assert!(read_package(&bad).is_err(), "flip {mask:#x} at byte {i}");
        }
    }
}

#[test]
fn header_errors_are_typed() {
    let data = write_package(&small_package());
    let mut bad = data.clone();
    bad[0] = b'X';
    assert!(matches!(read_package(&bad), Err(PackageError::BadMagic)));
    let mut bad = data.clone();
    bad[8] = 1; // the format before bindings carried weight images
    assert!(matches!(
        read_package(&bad),
        Err(PackageError::UnsupportedVersion { found: 1, .. })
    ));
    let mut bad = data.clone();
    bad[20] ^= 1; // inside the table: crc of the machine section
    assert!(matches!(
        read_package(&bad),
        Err(PackageError::HeaderChecksum { .. })
    ));
    let mut bad = data.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(
        read_package(&bad),
        Err(PackageError::SectionChecksum {
            section: "bindings",
            ..
        })
    ));
    let mut bad = data.clone();
    bad[12] = 9;
    assert!(matches!(
        read_package(&bad),
        Err(PackageError::SectionTable(_))
    ));
}

#[test]
fn malformed_sections_with_valid_checksums_are_rejected() {
    let data = write_package(&small_package());
    // A huge element count in the tiles section, checksums recomputed.
    let tiles_off = u64::from_le_bytes(data[16 + 24 + 8..16 + 24 + 16].try_into().unwrap());
    let mut bad = data.clone();
    let o = tiles_off as usize;
    bad[o..o + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    fix_checksums(&mut bad);
    let err = read_package(&bad).unwrap_err();
    assert!(
        matches!(
            err,
            PackageError::Malformed {
                section: "tiles",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("cannot fit"), "{err}");
}

#[test]
fn inconsistent_fields_are_rejected_with_the_right_error() {
    let base = small_package();

    let mut p = base.clone();
    p.machine_toml = "name = 3".into();
    assert!(matches!(rejected(&p), PackageError::Machine(_)));

    let mut p = base.clone();
    p.tiles[1].tile = 4;
    assert!(matches!(
        rejected(&p),
        PackageError::TileOutOfRange { tile: 4, tiles: 4 }
    ));

    let mut p = base.clone();
    p.tiles.swap(0, 1);
    assert!(matches!(rejected(&p), PackageError::TilesNotSorted { .. }));

    let mut p = base.clone();
    p.tiles[0].segments[1].addr = 0x4_C008;
    p.tiles[0].segments[1].perms.execute = false;
    assert!(matches!(rejected(&p), PackageError::SegmentOverlap { .. }));

    let mut p = base.clone();
    p.tiles[0].segments[1].addr = 0xE_7FF0;
    assert!(matches!(rejected(&p), PackageError::BadSegment { .. }));

    let mut p = base.clone();
    p.tiles[0].segments[1].addr = 0xE_7BA8;
    p.tiles[0].segments[1].size = 16;
    assert!(
        rejected(&p).to_string().contains("loader limit"),
        "initialised bytes past the loader limit"
    );

    let mut p = base.clone();
    p.tiles[0].segments[1].perms.execute = true;
    assert!(rejected(&p).to_string().contains("executable region"));

    let mut p = base.clone();
    p.tiles[0].segments[0].bytes = vec![0; 17];
    assert!(matches!(rejected(&p), PackageError::BadSegment { .. }));

    let mut p = base.clone();
    p.tiles[0].segments[0].size = 0;
    p.tiles[0].segments[0].bytes.clear();
    assert!(matches!(rejected(&p), PackageError::BadSegment { .. }));

    let mut p = base.clone();
    p.tiles[0].entry = 0x4_C002;
    assert!(matches!(rejected(&p), PackageError::BadEntry { .. }));
    let mut p = base.clone();
    p.tiles[0].entry = 0x9_0000;
    assert!(matches!(rejected(&p), PackageError::BadEntry { .. }));

    let mut p = base.clone();
    p.tiles[0].symbols[1].name = "main".into();
    assert!(matches!(rejected(&p), PackageError::BadSymbol { .. }));
    let mut p = base.clone();
    p.tiles[0].symbols[1].addr = 0x1000;
    assert!(matches!(rejected(&p), PackageError::BadSymbol { .. }));

    let mut p = base.clone();
    p.exchanges.push(p.exchanges[0].clone());
    assert!(matches!(
        rejected(&p),
        PackageError::DuplicateExchange { id: 3 }
    ));

    let mut p = base.clone();
    p.bindings.push(p.bindings[0].clone());
    assert!(matches!(
        rejected(&p),
        PackageError::DuplicateBinding { .. }
    ));
    let mut p = base.clone();
    p.bindings[0].slices[1].offset = 20;
    assert!(matches!(rejected(&p), PackageError::BadBinding { .. }));
    let mut p = base.clone();
    p.bindings[0].slices[1].tile = 7;
    assert!(matches!(rejected(&p), PackageError::BadBinding { .. }));
    let mut p = base.clone();
    p.bindings[0].kind = BindingKind::Output;
    p.bindings[0].slices[1].offset = 8;
    assert!(rejected(&p).to_string().contains("overlap"));
}

#[test]
fn files_round_trip_and_report_paths() {
    let dir = std::env::temp_dir().join(format!("tessera-pkg-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a.tpk");
    let p = small_package();
    write_package_file(&path, &p).unwrap();
    assert_eq!(read_package_file(&path).unwrap(), p);
    let mut bad = p.clone();
    bad.tiles[0].entry = 3;
    assert!(write_package_file(dir.join("b.tpk"), &bad).is_err());
    assert!(!dir.join("b.tpk").exists());
    let err = read_package_file(dir.join("missing.tpk")).unwrap_err();
    assert!(err.to_string().contains("missing.tpk"));
    // The OS error is the source, not repeated in the message: a report printing
    // the chain shows it once.
    let source = std::error::Error::source(&err)
        .expect("the OS error")
        .to_string();
    assert!(!err.to_string().contains(&source), "{err}");
    // A corrupt file: the file named, then why.
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.tpk");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = read_package_file(&cut).unwrap_err();
    assert!(
        matches!(&err, PackageError::File { error, .. } if matches!(**error, PackageError::Truncated { .. })),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with(&format!("{}: truncated package", cut.display())),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- properties ----

fn perms() -> impl Strategy<Value = Perms> {
    (any::<bool>(), any::<bool>()).prop_map(|(read, write)| Perms {
        read,
        write,
        execute: false,
    })
}

/// A valid tile image: one code segment in region 0 and up to three data segments
/// in disjoint 4 KiB windows of region 1.
fn tile_image(tile: u32) -> impl Strategy<Value = TileImage> {
    (
        1u32..64,
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::collection::vec(
            (
                0u32..8,
                1u32..4096,
                proptest::collection::vec(any::<u8>(), 0..48),
                perms(),
            ),
            0..4,
        ),
        0u32..64,
        proptest::collection::vec(("[a-z_]{1,10}", 0u32..4096, any::<bool>()), 0..5),
    )
        .prop_map(move |(words, code, data, entry, syms)| {
            let size = words * 4;
            let mut code = code;
            code.truncate(size as usize);
            let mut segments = vec![Segment {
                name: "code".into(),
                addr: 0x4_C000,
                size,
                bytes: code,
                perms: Perms {
                    read: true,
                    write: false,
                    execute: true,
                },
            }];
            let mut used = std::collections::BTreeSet::new();
            for (slot, size, mut bytes, perms) in data {
                if used.insert(slot) {
                    bytes.truncate(size as usize);
                    segments.push(Segment {
                        name: format!("d{slot}"),
                        addr: 0x8_0000 + slot * 4096,
                        size,
                        bytes,
                        perms,
                    });
                }
            }
            let mut names = std::collections::BTreeSet::new();
            let symbols = syms
                .into_iter()
                .filter(|(n, _, _)| names.insert(n.clone()))
                .map(|(name, off, code)| Symbol {
                    name,
                    addr: 0x4_C000 + off,
                    size: off % 64,
                    kind: if code {
                        SymbolKind::Code
                    } else {
                        SymbolKind::Data
                    },
                })
                .collect();
            TileImage {
                tile,
                segments,
                entry: 0x4_C000 + (entry % words) * 4,
                symbols,
            }
        })
}

fn package() -> impl Strategy<Value = Package> {
    (
        proptest::collection::btree_set(0u32..4, 0..4),
        proptest::collection::vec((any::<u16>(), "[a-z]{0,6}"), 0..3),
        proptest::collection::vec(
            (
                "[a-z]{1,6}",
                0u8..3,
                proptest::collection::vec((0u32..4, 0u32..1024, 1u32..64), 0..3),
            ),
            0..3,
        ),
    )
        .prop_flat_map(|(tiles, xs, bs)| {
            let images: Vec<_> = tiles.into_iter().map(tile_image).collect();
            (images, Just(xs), Just(bs))
        })
        .prop_map(|(tiles, xs, bs)| {
            let mut ids = std::collections::BTreeSet::new();
            let exchanges = xs
                .into_iter()
                .filter(|(id, _)| ids.insert(*id))
                .map(|(id, name)| ExchangeProgram { id, name })
                .collect();
            let mut names = std::collections::BTreeSet::new();
            let bindings = bs
                .into_iter()
                .filter(|(n, _, _)| names.insert(n.clone()))
                .map(|(name, kind, slices)| {
                    let mut offset = 0;
                    let slices: Vec<_> = slices
                        .into_iter()
                        .map(|(tile, a, bytes)| {
                            let s = BindingSlice {
                                tile,
                                tile_addr: 0xB_0000 + a * 4,
                                offset,
                                bytes,
                            };
                            offset += bytes;
                            s
                        })
                        .collect();
                    HostBinding {
                        data: Vec::new(),
                        name,
                        kind: [BindingKind::Input, BindingKind::Output, BindingKind::Weight]
                            [kind as usize],
                        bytes: offset + 5,
                        slices,
                    }
                })
                .collect();
            Package {
                machine_toml: Machine::small().to_toml(),
                tiles,
                exchanges,
                bindings,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, rng_seed: proptest::test_runner::RngSeed::Fixed(0x7e55e4a), ..ProptestConfig::default() })]

    #[test]
    fn random_packages_round_trip(p in package()) {
        validate(&p).unwrap();
        let bytes = write_package(&p);
        prop_assert_eq!(&write_package(&p), &bytes);
        prop_assert_eq!(read_package(&bytes).unwrap(), p);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut with_magic = b"TSRPKG\0\0\x01\0\0\0\x04\0\0\0".to_vec();
        with_magic.extend_from_slice(&data);
        let _ = read_package(&data);
        let _ = read_package(&with_magic);
    }

    /// Edits behind valid checksums reach the section parsers and the validator.
    #[test]
    fn edited_sections_never_panic(p in package(), edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut data = write_package(&p);
        let header = 16 + 4 * 24 + 4;
        for (i, v) in edits {
            let at = header + i.index(data.len() - header);
            data[at] = v;
        }
        fix_checksums(&mut data);
        let _ = read_package(&data);
    }
}

#[test]
fn only_weight_bindings_carry_data_of_their_size() {
    let mut p = small_package();
    let b = &mut p.bindings[0];
    b.data = vec![7; b.bytes as usize];
    let kind = b.kind;
    let res = validate(&p);
    if kind == BindingKind::Weight {
        assert!(res.is_ok());
    } else {
        assert!(matches!(res, Err(PackageError::BadBinding { .. })));
    }
    p.bindings[0].kind = BindingKind::Weight;
    assert!(validate(&p).is_ok());
    assert_eq!(read_package(&write_package(&p)).unwrap(), p);
    p.bindings[0].data.pop();
    assert!(matches!(validate(&p), Err(PackageError::BadBinding { .. })));
}

#[test]
fn reseal_checksums_matches_a_hand_fix_and_leaves_valid_files_alone() {
    let bytes = write_package(&small_package());
    let mut same = bytes.clone();
    assert!(reseal_checksums(&mut same));
    assert_eq!(same, bytes);
    // A field corrupted behind resealed checksums reaches the section parser.
    let mut corrupt = bytes.clone();
    let at = corrupt.len() - 3;
    corrupt[at] ^= 0x5a;
    let mut by_hand = corrupt.clone();
    fix_checksums(&mut by_hand);
    assert!(reseal_checksums(&mut corrupt));
    assert_eq!(corrupt, by_hand);
    assert!(!matches!(
        read_package(&corrupt),
        Err(PackageError::SectionChecksum { .. } | PackageError::HeaderChecksum { .. })
    ));
    // Too short for a section table: untouched.
    let mut short = bytes[..40].to_vec();
    assert!(!reseal_checksums(&mut short));
    assert_eq!(short, bytes[..40]);
}

/// Found by `tessera bench fuzz --target package`: a binding of 4 GiB with no
/// slices was accepted, and the simulator allocated its host buffer from the field.
#[test]
fn fuzz_found_a_host_buffer_larger_than_the_chip_is_refused() {
    let mut p = small_package();
    p.bindings[0].bytes = u32::MAX;
    p.bindings[0].slices.clear();
    let e = rejected(&p);
    assert!(
        matches!(&e, PackageError::BadBinding { reason, .. } if reason.contains("larger than the machine")),
        "{e}"
    );
    // The whole chip's SRAM is still a valid size.
    let m = Machine::small();
    p.bindings[0].bytes = m.tiles * m.sram_bytes();
    validate(&p).unwrap();
}
