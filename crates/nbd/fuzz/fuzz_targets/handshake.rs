//! Fuzzes option parsing and the whole server-side negotiation: the input
//! is the byte stream a client sends. Contract: never panics, never reads
//! or allocates beyond its limits, and only enters transmission for the one
//! export that exists.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::Cursor;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use tiercache_nbd::handshake::{negotiate, ExportEntry, HandshakeEnd, HandshakeParams, TlsPhase};
use tiercache_nbd::proto;
use tiercache_nbd::MemExport;

fn exports() -> &'static [ExportEntry] {
    static E: OnceLock<Vec<ExportEntry>> = OnceLock::new();
    E.get_or_init(|| {
        vec![ExportEntry::new("disk", Arc::new(MemExport::new(1 << 20))).with_description("d")]
    })
}

fuzz_target!(|data: &[u8]| {
    // The pure option parsers on their own.
    if data.len() >= 4 {
        let opt = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
        if let Ok(o) = proto::parse_option(opt, &data[4..]) {
            // Anything accepted re-encodes to something that parses the same.
            if !matches!(
                o,
                proto::ClientOption::Abort | proto::ClientOption::Unsupported(_)
            ) {
                assert_eq!(proto::parse_option(o.code(), &o.encode_data()), Ok(o));
            }
        }
    }
    let _ = proto::parse_option_header(data);
    let _ = proto::parse_client_flags(data, proto::SERVER_HANDSHAKE_FLAGS);

    // The negotiation state machine over the same bytes, in a TLS phase
    // picked by the input's length.
    let stop = AtomicBool::new(false);
    let phases = [
        TlsPhase::Unavailable,
        TlsPhase::Optional,
        TlsPhase::Required,
        TlsPhase::Active,
    ];
    let p = HandshakeParams {
        exports: exports(),
        max_block: 1 << 20,
        shutting_down: &stop,
        max_options: 64,
        tls: phases[data.len() % phases.len()],
    };
    let mut out = Vec::new();
    if let Ok(HandshakeEnd::Transmission(n)) = negotiate(&mut Cursor::new(data), &mut out, &p) {
        assert_eq!(n.export, 0);
        assert_eq!(n.ctx.size, 1 << 20);
    }
});
