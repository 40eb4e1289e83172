//! Running a tool from a test: its output, and a panic that shows it when
//! the tool fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `cmd` and returns its output whatever the exit status; panics only
/// if it cannot be started.
pub fn output(cmd: &mut Command) -> Output {
    retry_if_busy(|| cmd.output()).unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// `start()` again while it fails with ETXTBSY, for a while: a script a
/// test has just written cannot be executed while a child that another
/// test thread forked meanwhile still holds the script's write descriptor
/// (until that child's own exec closes it, a few microseconds).
pub fn retry_if_busy<T>(mut start: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let mut tries = 0;
    loop {
        match start() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// Runs `cmd`; panics with its exit status, stdout and stderr unless it
/// succeeds. Returns its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd`; whether it succeeded. Its output is printed either way (a
/// test that expects a failure still shows why it failed).
pub fn succeeds(cmd: &mut Command) -> bool {
    let out = output(cmd);
    eprintln!(
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.success()
}

/// The full path of `tool` on PATH (or the bare name when it is not there).
pub fn which(tool: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(tool))
                .find(|f| f.is_file())
        })
        .unwrap_or_else(|| PathBuf::from(tool))
}

/// Creates (or truncates) `path` as a sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_returns_stdout_and_panics_on_failure_with_the_output() {
        assert_eq!(run(Command::new("sh").args(["-c", "echo hi"])), "hi\n");
        let r = std::panic::catch_unwind(|| {
            run(Command::new("sh").args(["-c", "echo why >&2; exit 3"]))
        });
        let msg = *r.unwrap_err().downcast::<String>().unwrap();
        assert!(
            msg.contains("exit status: 3") && msg.contains("why"),
            "{msg}"
        );
        assert!(succeeds(&mut Command::new("true")));
        assert!(!succeeds(&mut Command::new("false")));
    }
}
