//! The help popup: keys and what the figures mean.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};

const LINES: [&str; 23] = [
    "q, Ctrl-C        quit",
    "Esc              back (from help or detail); quit from the table",
    "↑ ↓  (k j)       select a node",
    "Enter            the selected node's detail: every counter,",
    "                 errors by kind, latency by op, per-interface network",
    "p, space         pause / resume updates",
    "+ / -            poll slower / faster: 100 ms, 250 ms, 500 ms,",
    "                 1 s, 2 s, 5 s, 10 s",
    "w                chart window: 60 s or 5 min",
    "? h              this help (Esc or ? closes it)",
    "",
    "Rates come from each node's totals between two polls; a restarted",
    "node shows a reset, not a negative spike. ERR/S counts refused ops",
    "(malformed, out of memory, auth, ...); red when not zero. REDIR/S",
    "counts ops sent elsewhere (MOVED, TRYAGAIN: a slot move), not errors.",
    "P50/P99: the node's own service time per op over the last poll",
    "interval (start of its batch to its result), not the network.",
    "CPU % is of one core; NET is kvd's own sockets, NIC the host's",
    "interfaces. Sizes in KB/MB/GB are powers of 1000.",
    "A node that stops answering turns red, its last figures dim,",
    "and it is retried with backoff until it returns. A red banner",
    "says when --nodes does not match what the nodes serve.",
    "",
];

/// The popup's size: its text plus the border.
pub fn size() -> (u16, u16) {
    let width = LINES.iter().map(|l| l.chars().count()).max().unwrap_or(0) as u16 + 4;
    (width, LINES.len() as u16 + 2)
}

pub fn render(frame: &mut Frame, area: Rect) {
    let lines: Vec<Line> = LINES.iter().map(|l| Line::from(*l)).collect();
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(" help ")),
        area,
    );
}
