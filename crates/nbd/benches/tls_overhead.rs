//! Benchmark: what TLS costs. The same in-process server (MemExport, 1 GiB)
//! on loopback TCP in plain text, with X.509 TLS (rustls) and with
//! pre-shared-key TLS (OpenSSL); libnbd (GnuTLS) on the client side:
//! fio's nbd engine, 4 KiB random reads (iodepth 8, 2 jobs), for IOPS, and
//! `nbdcopy URI null:` of the whole GiB for bandwidth. Prints each figure
//! and its ratio to plain text. fio's engine refuses URIs naming local
//! files, so X.509 finds its CA through HOME/.pki/libnbd and PSK (whose key
//! file must be in the URI) gets no IOPS figure.
//!
//! `cargo bench -p tiercache-nbd --bench tls_overhead`
//! Environment: TLS_BENCH_RUNTIME (seconds per run, default 5),
//! TLS_BENCH_ROUNDS (interleaved runs per mode, best kept, default 2).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use tiercache_nbd::{Listener, MemExport, RunningServer, Server, ServerConfig, TlsConfig, TlsMode};
use tiercache_testkit::Pki;

const SIZE: u64 = 1 << 30;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Runs fio's 4k random read job against `uri` (with `home` as HOME);
/// returns IOPS.
fn fio(uri: &str, home: &Path, runtime: u64) -> f64 {
    let out = Command::new("fio")
        .env("HOME", home)
        .args([
            "--name=bench",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randread",
            "--bs=4k",
            "--iodepth=8",
            "--numjobs=2",
            "--size=512M",
            "--offset_increment=512M",
            "--time_based",
            &format!("--runtime={runtime}"),
            "--group_reporting",
            "--output-format=json",
        ])
        .output()
        .expect("fio");
    assert!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value =
        serde_json::from_str(&text[text.find('{').unwrap_or(0)..]).expect("fio json");
    json["jobs"][0]["read"]["iops"].as_f64().unwrap_or(0.0)
}

/// CPU seconds (user + system) this process (the server) has used.
fn own_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Clock ticks; 100 per second on Linux.
    (num(11) + num(12)) / 100.0
}

/// Copies the whole export to `null:` with nbdcopy; returns (bytes per
/// second, server CPU seconds).
fn nbdcopy(uri: &str, home: &Path) -> (f64, f64) {
    let c0 = own_cpu_seconds();
    let t = std::time::Instant::now();
    let out = Command::new("nbdcopy")
        .env("HOME", home)
        .args([uri, "null:"])
        .output()
        .expect("nbdcopy");
    assert!(
        out.status.success(),
        "nbdcopy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        SIZE as f64 / t.elapsed().as_secs_f64(),
        own_cpu_seconds() - c0,
    )
}

struct Mode {
    name: &'static str,
    uri: String,
    /// fio can connect (see the module doc).
    fio: bool,
    _server: RunningServer,
}

fn serve(tls: TlsMode) -> (RunningServer, u16) {
    let listener = Listener::bind_tcp("127.0.0.1:0").unwrap();
    let port = listener.tcp_addr().unwrap().port();
    let cfg = ServerConfig {
        tls,
        ..ServerConfig::default()
    };
    let server = Server::single("", Arc::new(MemExport::new(SIZE)), cfg).unwrap();
    (server.spawn(listener).unwrap(), port)
}

/// Server credentials; the CA goes where libnbd looks by default,
/// `dir/.pki/libnbd/ca-cert.pem` (with HOME=dir).
fn x509(dir: &Path) -> TlsConfig {
    let pki = Pki::new(dir, ".pki/libnbd");
    std::fs::write(dir.join(".pki/libnbd/ca-cert.pem"), pki.ca_pem()).unwrap();
    let (cert, key) = pki.server_pem();
    TlsConfig::x509_from_pem(cert.as_bytes(), key.as_bytes(), None).unwrap()
}

fn main() {
    if !have("fio") || !have("nbdcopy") {
        eprintln!("SKIPPED: fio or nbdcopy is not installed (scripts/install-deps.sh)");
        return;
    }
    let runtime = env_num("TLS_BENCH_RUNTIME", 5);
    let rounds = env_num("TLS_BENCH_ROUNDS", 2);
    let dir = tempfile::tempdir().unwrap();

    let key: Vec<u8> = (0u8..32).collect();
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let psk_file = dir.path().join("keys.psk");
    std::fs::write(&psk_file, format!("bench:{hex}\n")).unwrap();

    let (plain, p0) = serve(TlsMode::Off);
    let (cert, p1) = serve(TlsMode::Required(x509(dir.path())));
    let (psk, p2) = serve(TlsMode::Required(
        TlsConfig::psk(vec![("bench".into(), key)]).unwrap(),
    ));
    let modes = [
        Mode {
            name: "plain TCP",
            uri: format!("nbd://127.0.0.1:{p0}/"),
            fio: true,
            _server: plain,
        },
        Mode {
            name: "TLS X.509 (rustls)",
            uri: format!("nbds://localhost:{p1}/"),
            fio: true,
            _server: cert,
        },
        Mode {
            name: "TLS PSK (OpenSSL)",
            uri: format!(
                "nbds://bench@127.0.0.1:{p2}/?tls-psk-file={}",
                psk_file.display()
            ),
            fio: false,
            _server: psk,
        },
    ];

    // Best of `rounds`, interleaved so that drift hits every mode alike.
    let mut iops = [0f64; 3];
    let mut bw = [0f64; 3];
    let mut cpu = [f64::MAX; 3];
    for _ in 0..rounds {
        for (i, m) in modes.iter().enumerate() {
            if m.fio {
                iops[i] = iops[i].max(fio(&m.uri, dir.path(), runtime));
            }
            let (b, c) = nbdcopy(&m.uri, dir.path());
            bw[i] = bw[i].max(b);
            cpu[i] = cpu[i].min(c);
        }
    }
    println!(
        "loopback TCP, best of {rounds}; fio 4k randread iodepth 8 x 2 jobs, {runtime} s; \
         nbdcopy of 1 GiB to null:"
    );
    println!(
        "{:<20} {:>10} {:>8} {:>12} {:>8} {:>18}",
        "mode", "4k IOPS", "ratio", "copy MiB/s", "ratio", "server CPU s/GiB"
    );
    for (i, m) in modes.iter().enumerate() {
        let (iops_text, ratio_text) = if m.fio {
            (
                format!("{:.0}", iops[i]),
                format!("{:.0}%", 100.0 * iops[i] / iops[0].max(1.0)),
            )
        } else {
            ("-".to_string(), "-".to_string())
        };
        println!(
            "{:<20} {:>10} {:>8} {:>12.0} {:>7.0}% {:>18.2}",
            m.name,
            iops_text,
            ratio_text,
            bw[i] / (1 << 20) as f64,
            100.0 * bw[i] / bw[0].max(1.0),
            cpu[i]
        );
    }
}
