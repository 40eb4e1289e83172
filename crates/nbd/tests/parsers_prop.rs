//! Property tests of the pure parsers: arbitrary bytes never panic, valid
//! encodings round-trip, and the request validator's verdicts respect the
//! spec's invariants. The handshake is also driven with arbitrary client
//! byte streams.

use proptest::prelude::*;
use std::io::Cursor;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tiercache_nbd::handshake::{negotiate, ExportEntry, HandshakeEnd, HandshakeParams, TlsPhase};
use tiercache_nbd::proto::*;
use tiercache_nbd::MemExport;

fn arb_name() -> impl Strategy<Value = String> {
    // Valid NBD strings: UTF-8 without NUL, short.
    "[a-zA-Z0-9 _./é-]{0,40}"
}

fn arb_option() -> impl Strategy<Value = ClientOption> {
    prop_oneof![
        arb_name().prop_map(ClientOption::ExportName),
        Just(ClientOption::Abort),
        Just(ClientOption::List),
        Just(ClientOption::StartTls),
        Just(ClientOption::StructuredReply),
        (arb_name(), proptest::collection::vec(any::<u16>(), 0..8))
            .prop_map(|(name, requests)| ClientOption::Info(InfoRequest { name, requests })),
        (arb_name(), proptest::collection::vec(any::<u16>(), 0..8))
            .prop_map(|(name, requests)| ClientOption::Go(InfoRequest { name, requests })),
        (12u32..).prop_map(ClientOption::Unsupported),
    ]
}

fn arb_ctx() -> impl Strategy<Value = TransmissionContext> {
    (any::<u64>(), any::<u16>(), 0u32..17, 9u32..27).prop_map(|(size, flags, mb, mx)| {
        TransmissionContext {
            size: size >> (size % 64),
            flags: flags | FLAG_HAS_FLAGS,
            min_block: 1 << mb,
            max_block: (1u32 << mx).max(1 << mb),
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), opt in any::<u32>()) {
        let _ = parse_option_header(&bytes);
        let _ = parse_request_header(&bytes);
        let _ = parse_client_flags(&bytes, SERVER_HANDSHAKE_FLAGS);
        let _ = parse_option(opt, &bytes);
        let _ = parse_option(OPT_GO, &bytes);
        let _ = parse_option(OPT_INFO, &bytes);
        let _ = parse_option(OPT_EXPORT_NAME, &bytes);
        let _ = parse_reply_header(&bytes);
        let _ = parse_option_reply_header(&bytes);
    }

    #[test]
    fn options_round_trip(o in arb_option()) {
        let wire = o.encode();
        let h = parse_option_header(&wire).unwrap();
        prop_assert_eq!(h.length as usize, wire.len() - OPTION_HEADER_LEN);
        let back = parse_option(h.option, &wire[OPTION_HEADER_LEN..]).unwrap();
        prop_assert_eq!(back, o);
    }

    #[test]
    fn request_headers_round_trip(flags: u16, kind: u16, handle: u64, offset: u64, length: u32) {
        let h = RequestHeader { flags, kind, handle, offset, length };
        prop_assert_eq!(parse_request_header(&h.encode()), Ok(h));
    }

    #[test]
    fn option_headers_round_trip(option: u32, length: u32) {
        let h = OptionHeader { option, length };
        prop_assert_eq!(parse_option_header(&h.encode()), Ok(h));
    }

    #[test]
    fn replies_round_trip(errno: u32, handle: u64, flags: u16, t: u16, len: u32) {
        prop_assert_eq!(
            parse_reply_header(&encode_simple_reply(errno, handle)),
            Ok((ReplyHeader::Simple { errno, handle }, 16))
        );
        prop_assert_eq!(
            parse_reply_header(&encode_structured_header(flags, t, handle, len)),
            Ok((ReplyHeader::Structured { flags, reply_type: t, handle, length: len }, 20))
        );
    }

    /// Whatever the request, an executed command lies inside the export,
    /// respects alignment and the maximum, and was advertised; a rejection
    /// always discards exactly the write payload; a disconnect only happens
    /// for oversized write payloads.
    #[test]
    fn validator_invariants(ctx in arb_ctx(), flags: u16, kind in 0u16..10, offset: u64, length: u32, near_end: bool) {
        let offset = if near_end { ctx.size.saturating_sub(u64::from(length) / 2) } else { offset };
        let h = RequestHeader { flags, kind, handle: 1, offset, length };
        let min = u64::from(ctx.min_block);
        match validate_request(&h, &ctx) {
            Verdict::Execute(cmd) => {
                let range = match cmd {
                    Command::Read { offset, len } => Some((offset, len, true)),
                    Command::Write { offset, len, .. } => Some((offset, len, true)),
                    Command::WriteZeroes { offset, len, .. } => Some((offset, len, false)),
                    Command::Trim { offset, len, .. } => Some((offset, len, false)),
                    Command::Flush => { prop_assert!(ctx.flags & FLAG_SEND_FLUSH != 0); None }
                    Command::Disconnect => { prop_assert_eq!(kind, CMD_DISC); None }
                };
                if let Some((o, l, capped)) = range {
                    prop_assert!(o + u64::from(l) <= ctx.size);
                    prop_assert_eq!(o % min, 0);
                    prop_assert_eq!(u64::from(l) % min, 0);
                    if capped { prop_assert!(l <= ctx.max_block); }
                    if kind != CMD_READ { prop_assert!(ctx.flags & FLAG_READ_ONLY == 0); }
                }
                if flags & CMD_FLAG_FUA != 0 && cmd != Command::Disconnect { prop_assert!(ctx.flags & FLAG_SEND_FUA != 0); }
            }
            Verdict::Reject { errno, discard, .. } => {
                prop_assert_eq!(discard, h.payload_len());
                prop_assert!([EINVAL, ENOSPC, EPERM].contains(&errno));
            }
            Verdict::Disconnect(_) => {
                prop_assert_eq!(kind, CMD_WRITE);
                prop_assert!(length > ctx.discard_limit());
            }
        }
    }

    /// The negotiation over arbitrary client bytes never panics and only
    /// enters transmission for an existing export.
    #[test]
    fn handshake_survives_arbitrary_clients(
        prefix in proptest::collection::vec(arb_option(), 0..4),
        junk in proptest::collection::vec(any::<u8>(), 0..80),
        flags in 0u32..4,
        tls in prop_oneof![Just(TlsPhase::Unavailable), Just(TlsPhase::Optional), Just(TlsPhase::Required), Just(TlsPhase::Active)],
    ) {
        let exports = vec![ExportEntry::new("x", Arc::new(MemExport::new(1 << 20)))];
        let stop = AtomicBool::new(false);
        let p = HandshakeParams { exports: &exports, max_block: 1 << 20, shutting_down: &stop, max_options: 8, tls };
        let mut input = flags.to_be_bytes().to_vec();
        for o in &prefix { input.extend_from_slice(&o.encode()); }
        input.extend_from_slice(&junk);
        let mut out = Vec::new();
        if let Ok(HandshakeEnd::Transmission(n)) = negotiate(&mut Cursor::new(&input), &mut out, &p) {
            prop_assert_eq!(n.export, 0);
            prop_assert_eq!(n.ctx.size, 1 << 20);
        }
        prop_assert!(out.len() >= 18);
    }
}
