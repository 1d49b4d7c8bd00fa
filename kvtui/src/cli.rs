//! The `kvtui` command line.

use std::time::Duration;

use clap::Parser;
use kvshared::cli::NodesArgs;

#[derive(Parser, Debug)]
#[command(
    name = "kvtui",
    version,
    about = "Live dashboard of a kvd cluster: op/s, CPU, memory and network per node",
    long_about = "Live dashboard of a kvd cluster: op/s, CPU, memory and network per node, in one screen\n\
        instead of htop and nethogs on every node.\n\n\
        Keys: q/Esc/Ctrl-C quit, up/down select, Enter detail, p pause, +/- interval, w window, ? help.\n\n\
        Exit status: 0 normally, and for --once when every node answered; 1 for --once when some\n\
        node did not answer (it is listed as down); 2 on an error (bad flags, no terminal).",
    after_help = "Examples:\n  kvtui --nodes 127.0.0.1:7070,127.0.0.1:7071\n  \
        kvtui --once --json        # one sample per node as JSON, for scripts\n  \
        kvtui --record today.jsonl # watch and keep every sample\n  \
        kvtui --replay today.jsonl --speed 10"
)]
pub struct Cli {
    #[command(flatten)]
    pub nodes: NodesArgs,
    /// How often to poll each node (100ms to 10s; `+`/`-` change it while running).
    #[arg(long, default_value = "500ms", value_parser = parse_interval)]
    pub interval: Duration,
    /// Chart window: 60s or 5m (`w` toggles).
    #[arg(long, default_value = "60s", value_parser = parse_window)]
    pub window: Duration,
    /// Sample once (rates over one interval), print, and exit.
    #[arg(long)]
    pub once: bool,
    /// With --once: print JSON instead of the table.
    #[arg(long, requires = "once")]
    pub json: bool,
    /// Append every sample (each node's stats or error, with the time) to FILE as JSON
    /// lines, for looking back further than the charts' five minutes (see --replay).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["once", "replay"])]
    pub record: Option<std::path::PathBuf>,
    /// Show a recording made with --record instead of polling the nodes (--nodes is not
    /// used; the nodes are the recording's).
    #[arg(long, value_name = "FILE", conflicts_with = "once")]
    pub replay: Option<std::path::PathBuf>,
    /// With --replay: play this many times as fast as recorded (e.g. 10 to see an hour in
    /// six minutes).
    #[arg(long, default_value_t = 1.0, requires = "replay", value_parser = parse_speed)]
    pub speed: f64,
}

/// `--interval`: a duration within the range `+`/`-` move in.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    let (low, high) = (
        crate::app::INTERVALS[0],
        crate::app::INTERVALS[crate::app::INTERVALS.len() - 1],
    );
    if d < low || d > high {
        return Err(format!(
            "must be between {} and {}",
            humantime::format_duration(low),
            humantime::format_duration(high)
        ));
    }
    Ok(d)
}

/// `--speed`: a positive factor.
fn parse_speed(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 10_000.0 => Ok(s),
        _ => Err("must be a number above 0 (1 is as recorded)".into()),
    }
}

/// `--window`: one of the two windows the charts keep.
fn parse_window(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text).map_err(|e| e.to_string())? {
        d if d == Duration::from_secs(60) || d == Duration::from_secs(300) => Ok(d),
        _ => Err("must be 60s or 5m (the charts keep five minutes)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_and_window_are_checked() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["kvtui"], args].concat());
        assert!(
            parse(&["--interval", "0s"])
                .unwrap_err()
                .to_string()
                .contains("between 100ms and 10s")
        );
        assert!(parse(&["--interval", "11s"]).is_err());
        assert_eq!(parse(&["--interval", "2s"]).unwrap().interval, Duration::from_secs(2));
        assert!(
            parse(&["--window", "2h"])
                .unwrap_err()
                .to_string()
                .contains("60s or 5m")
        );
        assert_eq!(parse(&["--window", "5m"]).unwrap().window, Duration::from_secs(300));
    }
}
