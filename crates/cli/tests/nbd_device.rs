//! `serve --nbd-device`: the arguments a server refuses before it opens
//! anything (the kernel side runs in the VM lab, vmlab/guest/nbd-restart.sh).

use std::process::Command;

fn serve_fails_with(args: &[&str], expected: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .arg("serve")
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve {args:?} succeeded");
    assert!(err.contains(expected), "serve {args:?}: {err}");
}

#[test]
fn bad_nbd_device_arguments_are_refused_with_the_reason() {
    serve_fails_with(
        &["--backing", "mem:1M", "--nbd-device", "/dev/sda"],
        "give /dev/nbdN or EXPORT=/dev/nbdN",
    );
    serve_fails_with(
        &["--backing", "mem:1M", "--ublk", "--nbd-device", "/dev/nbd0"],
        "does not go with --ublk",
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("t.toml");
    std::fs::write(
        &cfg,
        "backing = \"mem:1M\"\nnbd_device = [\"nbd0\", \"x\"]\n",
    )
    .unwrap();
    serve_fails_with(&["--config", cfg.to_str().unwrap()], "--nbd-device \"x\"");
}

#[test]
fn a_pool_names_the_export_of_each_device() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let ctl = dir.path().join("s.ctl");
    serve_fails_with(
        &[
            "--volume",
            "a=mem:1M",
            "--volume",
            "b=mem:1M",
            "--cache",
            "mem:1M",
            "--socket",
            sock.to_str().unwrap(),
            "--control",
            ctl.to_str().unwrap(),
            "--nbd-device",
            "/dev/nbd0",
        ],
        "a pool has several exports; give EXPORT=/dev/nbd0",
    );
    serve_fails_with(
        &[
            "--volume",
            "a=mem:1M",
            "--volume",
            "b=mem:1M",
            "--cache",
            "mem:1M",
            "--socket",
            sock.to_str().unwrap(),
            "--control",
            ctl.to_str().unwrap(),
            "--nbd-device",
            "c=/dev/nbd0",
        ],
        "no export \"c\"",
    );
}
