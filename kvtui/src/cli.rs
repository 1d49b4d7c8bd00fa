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
        kvtui --once --json        # one sample per node as JSON, for scripts"
)]
pub struct Cli {
    #[command(flatten)]
    pub nodes: NodesArgs,
    /// How often to poll each node.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Chart window (60s or 5m; `w` toggles).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub window: Duration,
    /// Sample once (rates over one interval), print, and exit.
    #[arg(long)]
    pub once: bool,
    /// With --once: print JSON instead of the table.
    #[arg(long, requires = "once")]
    pub json: bool,
}
