//! `tiercache serve --ublk` on the host. The host kernel has no ublk, so
//! what is checked here is the refusal: a clear message and a non-zero
//! exit, before any device is opened. Serving for real is tested in the VM
//! lab (vmlab/guest/ublk.sh), whose kernel has ublk_drv.

use std::path::Path;
use std::process::Command;

fn tiercache() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
}

#[cfg(feature = "ublk")]
#[test]
fn serve_ublk_without_kernel_support_fails_with_a_clear_message() {
    if Path::new("/dev/ublk-control").exists() {
        eprintln!("SKIPPED: this kernel has ublk (the VM lab tests serving)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    std::fs::write(&backing, vec![0u8; 1 << 20]).unwrap();
    let out = tiercache()
        .args(["serve", "--ublk", "--ublk-queues", "2", "--cache", "mem:4M"])
        .arg("--backing")
        .arg(&backing)
        .arg("--control")
        .arg(dir.path().join("tc.ctl"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve --ublk succeeded: {stderr}");
    assert!(
        stderr.contains("this kernel has no ublk (modprobe ublk_drv; needs Linux >= 6.0"),
        "{stderr}"
    );
    // Refused before anything was served: no control socket left behind.
    assert!(!dir.path().join("tc.ctl").exists());
}

#[test]
fn ublk_options_without_ublk_are_refused() {
    let out = tiercache()
        .args(["serve", "--backing", "mem:1M", "--ublk-depth", "8"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("go with --ublk"), "{stderr}");
}
