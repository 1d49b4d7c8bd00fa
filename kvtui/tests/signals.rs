//! The real binary on a pseudo-terminal (util-linux `script`): SIGTERM and SIGHUP restore the
//! terminal as q does (leave the alternate screen, show the cursor).

mod common;

use common::Terminal;

/// Bytes that leave the alternate screen and show the cursor again.
const LEAVE_ALTERNATE_SCREEN: &[u8] = b"\x1b[?1049l";
const SHOW_CURSOR: &[u8] = b"\x1b[?25h";
const ENTER_ALTERNATE_SCREEN: &[u8] = b"\x1b[?1049h";

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn restores_the_terminal_on(signal: &str) {
    // A node that is not there (a port held for the test): the dashboard runs and shows it
    // down.
    let dead = kvtestkit::addr();
    let terminal = Terminal::start(&format!("--nodes {dead}"));
    // Once it has drawn in the alternate screen (the node's row)...
    terminal.wait_for(ENTER_ALTERNATE_SCREEN);
    terminal.wait_for(dead.as_bytes());
    let all = terminal.stop(signal);
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
