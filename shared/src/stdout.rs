//! Printing results to stdout the way Unix tools do: a reader that has gone (`| head`) is
//! not a crash.
//!
//! The macros return the write's `io::Result`; binaries propagate it and end quietly on
//! `BrokenPipe` (see `cli::exit_code`). Library code never exits the process itself.

use std::io::Write;

/// Writes to stdout and flushes.
pub fn write_stdout(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)?;
    out.flush()
}

/// `print!` that returns the write's `io::Result` instead of panicking on a closed pipe.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdout::write_stdout(format_args!($($arg)*)) };
}

/// `println!` that returns the write's `io::Result` instead of panicking on a closed pipe.
#[macro_export]
macro_rules! outln {
    () => { $crate::stdout::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::stdout::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}
