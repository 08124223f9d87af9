//! Every valid word encodes, decodes back to itself, and re-encodes to the same
//! bytes; arbitrary bytes never panic the decoder.

use proptest::prelude::*;
use tessera_isa::{Word, decode_word, encode, encode_word, testgen};

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, rng_seed: proptest::test_runner::RngSeed::Fixed(7), ..ProptestConfig::default() })]

    #[test]
    fn word_round_trip(w in testgen::word()) {
        let mut bytes = Vec::new();
        encode_word(&w, &mut bytes).unwrap();
        prop_assert_eq!(bytes.len(), w.byte_len());
        let (back, n) = decode_word(&bytes).unwrap();
        prop_assert_eq!(back, w);
        prop_assert_eq!(n, bytes.len());
    }

    #[test]
    fn sequence_round_trip(ws in proptest::collection::vec(testgen::word(), 0..40)) {
        let bytes = encode(&ws).unwrap();
        let back: Vec<Word> = tessera_isa::decode_all(&bytes).unwrap().into_iter().map(|(_, w)| w).collect();
        prop_assert_eq!(back, ws);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
        if let Ok((w, n)) = decode_word(&bytes) {
            let again = encode(&[w]).unwrap();
            prop_assert_eq!(&again[..], &bytes[..n]);
        }
    }
}
