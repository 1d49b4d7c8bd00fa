//! The real binary on a pseudo-terminal (util-linux `script`): SIGTERM and SIGHUP restore the
//! terminal as q does (leave the alternate screen, show the cursor).

mod common;

use common::kvtui_below;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bytes that leave the alternate screen and show the cursor again.
const LEAVE_ALTERNATE_SCREEN: &[u8] = b"\x1b[?1049l";
const SHOW_CURSOR: &[u8] = b"\x1b[?25h";
const ENTER_ALTERNATE_SCREEN: &[u8] = b"\x1b[?1049h";

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn restores_the_terminal_on(signal: &str) {
    // A node that is not there: the dashboard runs and shows it down.
    let command = format!("{} --nodes 127.0.0.1:1", env!("CARGO_BIN_EXE_kvtui"));
    let mut script = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("util-linux `script` is needed to give kvtui a terminal");
    let mut out = script.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = out.read_to_end(&mut all);
        all
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let kvtui = loop {
        if let Some(pid) = kvtui_below(script.id()) {
            break pid;
        }
        assert!(Instant::now() < deadline, "kvtui did not start under script");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Let it draw a few frames in the alternate screen.
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Command::new("kill")
        .args([signal, &kvtui.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while script.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            // Ours to end: kvtui (by its pid) and then script.
            let _ = Command::new("kill").args(["-KILL", &kvtui.to_string()]).status();
            let _ = script.kill();
            let _ = script.wait();
            panic!("kvtui did not end after {signal}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let all = reader.join().unwrap();
    assert!(
        contains(&all, ENTER_ALTERNATE_SCREEN),
        "kvtui never entered the alternate screen"
    );
    let entered = all
        .windows(ENTER_ALTERNATE_SCREEN.len())
        .position(|w| w == ENTER_ALTERNATE_SCREEN)
        .unwrap();
    let after = &all[entered..];
    assert!(
        contains(after, LEAVE_ALTERNATE_SCREEN),
        "{signal}: the alternate screen was not left"
    );
    assert!(contains(after, SHOW_CURSOR), "{signal}: the cursor was not shown again");
}

#[test]
fn sigterm_restores_the_terminal() {
    restores_the_terminal_on("-TERM");
}

#[test]
fn sighup_restores_the_terminal() {
    restores_the_terminal_on("-HUP");
}
