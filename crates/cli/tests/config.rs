//! The example config file in docs/ parses (with its devices replaced), and
//! unknown keys are refused with the file's name.

use std::process::Command;

#[test]
fn example_config_is_valid_and_typos_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/tiercache.toml.example"
    ))
    .unwrap();
    let text: String = example
        .lines()
        .map(|l| {
            if l.starts_with("backing") {
                "backing = \"/nonexistent/backing-from-config\"".to_string()
            } else if l.starts_with("socket") || l.starts_with("control") {
                String::new()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let cfg = dir.path().join("t.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Parsing succeeded: the failure is about opening the device it names.
    assert!(err.contains("/nonexistent/backing-from-config"), "{err}");

    std::fs::write(&cfg, "backing = \"mem:1M\"\nmdoe = \"writeback\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("t.toml") && err.contains("mdoe"), "{err}");
}
