//! Printing results to stdout the way Unix tools do: when the reader has gone (`| head`),
//! the process ends quietly instead of panicking on a broken pipe.

use std::io::Write;

/// Writes to stdout; a closed pipe exits with status 0, any other write error with status 2.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("cannot write to stdout: {e}");
        std::process::exit(2);
    }
}

/// `print!` that survives a closed pipe (see [`write_stdout`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdout::write_stdout(format_args!($($arg)*)) };
}

/// `println!` that survives a closed pipe (see [`write_stdout`]).
#[macro_export]
macro_rules! outln {
    () => { $crate::stdout::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::stdout::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}
