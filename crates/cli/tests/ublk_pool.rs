//! `tiercache serve --ublk` with a pool of volumes, on the host: the
//! options are checked before anything is served. The host kernel has no
//! ublk; serving a pool for real (one /dev/ublkbN per volume, isolation,
//! kill -9 and takeover, a failing backing device) is the VM lab's
//! vmlab/guest/ublk-pool.sh.

use std::path::Path;
use std::process::{Command, Output};

fn serve(args: &[&str], dir: &Path) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .arg("serve")
        .args(args)
        .arg("--control")
        .arg(dir.join("tc.ctl"))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "serve {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !dir.join("tc.ctl").exists(),
        "refused, but after binding the control socket"
    );
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `serve --cache mem:8M ARGS` is refused, saying `expected`.
fn refused(args: &[&str], expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec!["--cache", "mem:8M"];
    all.extend_from_slice(args);
    let e = stderr(&serve(&all, dir.path()));
    assert!(e.contains(expected), "serve {args:?}: {e}");
}

#[test]
fn a_device_number_per_volume_needs_ublk() {
    refused(
        &["--volume", "a=mem:4M,ublk-id=3", "--volume", "b=mem:4M"],
        "ublk-id=N goes with --ublk",
    );
}

#[test]
fn one_device_number_for_a_whole_pool_is_refused_with_the_per_volume_form() {
    refused(
        &[
            "--ublk",
            "--ublk-id",
            "3",
            "--volume",
            "a=mem:4M",
            "--volume",
            "b=mem:4M",
        ],
        "--volume NAME=BACKING,ublk-id=N",
    );
}

#[test]
fn two_volumes_may_not_ask_for_the_same_device() {
    refused(
        &[
            "--ublk",
            "--volume",
            "a=mem:4M,ublk-id=5",
            "--volume",
            "b=mem:4M,ublk-id=5",
        ],
        "ublk-id=5 is given to two volumes",
    );
}

#[test]
fn a_bad_device_number_is_refused() {
    refused(&["--ublk", "--volume", "a=mem:4M,ublk-id=x"], "ublk-id=x");
}

#[cfg(feature = "ublk")]
#[test]
fn a_pool_over_ublk_is_refused_only_for_want_of_kernel_support() {
    if Path::new("/dev/ublk-control").exists() {
        eprintln!("SKIPPED: this kernel has ublk (the VM lab serves pools over it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = serve(
        &[
            "--cache",
            "mem:8M",
            "--ublk",
            "--volume",
            "a=mem:4M,ublk-id=1",
            "--volume",
            "b=mem:4M",
        ],
        dir.path(),
    );
    let e = stderr(&out);
    assert!(e.contains("this kernel has no ublk"), "{e}");
    assert!(!e.contains("one volume"), "{e}");
}
