//! Entering and leaving full-screen mode; the terminal is restored when the guard drops,
//! whether the dashboard returns normally, with an error, or by panicking (ratatui's init
//! also installs a panic hook that restores it before the panic message is printed).

use ratatui::DefaultTerminal;

pub struct TerminalGuard {
    terminal: DefaultTerminal,
}

impl TerminalGuard {
    pub fn enter() -> std::io::Result<TerminalGuard> {
        Ok(TerminalGuard {
            terminal: ratatui::try_init()?,
        })
    }

    pub fn terminal(&mut self) -> &mut DefaultTerminal {
        &mut self.terminal
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        ratatui::restore();
    }
}
