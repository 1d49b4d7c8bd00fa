//! The node table: one row per node and a cluster total row.

use std::time::Instant;

use kvshared::units::{bytes, si, uptime};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState};

use super::node_color;
use crate::app::App;
use crate::state::{ClusterView, Health, NodeView, Series};

pub const HEADERS: [&str; 17] = [
    "NODE",
    "SHARD",
    "STATE",
    "UPTIME",
    "KEYS",
    "OP/S",
    "GET/S",
    "PUT/S",
    "HIT%",
    "CPU%",
    "HOST%",
    "RSS",
    "HOST MEM",
    "NET IN/OUT",
    "NIC RX/TX",
    "TREND",
    "",
];

const WIDTHS: [u16; 17] = [21, 5, 9, 7, 7, 7, 7, 7, 6, 5, 5, 7, 11, 12, 12, 12, 0];

/// The cells of one node's row.
pub fn node_cells(n: &NodeView, now: Instant) -> Vec<String> {
    let s = n.stats.as_ref();
    let r = n.rates.as_ref();
    let state = match &n.health {
        Health::Up => "up".to_string(),
        Health::Waiting => "…".to_string(),
        Health::Down { .. } => match n.last_seen {
            Some(t) => format!("down {}", uptime(now.saturating_duration_since(t).as_secs())),
            None => "down".to_string(),
        },
    };
    let rate = |f: &dyn Fn(&kvshared::stats::NodeRates) -> f64| r.map_or("-".to_string(), |r| si(f(r)));
    vec![
        n.addr.clone(),
        s.map_or("-".into(), |s| s.shard.to_string()),
        state,
        s.map_or("-".into(), |s| uptime(s.uptime_ms / 1000)),
        s.map_or("-".into(), |s| si(s.keys as f64)),
        rate(&|r| r.ops_per_sec),
        rate(&|r| r.gets_per_sec),
        rate(&|r| r.puts_per_sec),
        r.and_then(|r| r.hit_ratio)
            .map_or("-".into(), |h| format!("{:.1}", h * 100.0)),
        r.map_or("-".into(), |r| format!("{:.0}", r.process_cpu_percent)),
        s.map_or("-".into(), |s| format!("{:.0}", s.system.host_cpu_percent)),
        s.map_or("-".into(), |s| bytes(s.system.process_rss_bytes as f64)),
        s.map_or("-".into(), |s| {
            format!(
                "{}/{}B",
                si(s.system.host_mem_used_bytes as f64),
                si(s.system.host_mem_total_bytes as f64)
            )
        }),
        r.map_or("-".into(), |r| {
            format!("{}/{}", si(r.bytes_in_per_sec), si(r.bytes_out_per_sec))
        }),
        r.map_or("-".into(), |r| {
            format!("{}/{}", si(r.host_rx_per_sec), si(r.host_tx_per_sec))
        }),
        trend(&n.ops, 12),
        match &n.health {
            Health::Down { error } => error.clone(),
            _ => String::new(),
        },
    ]
}

/// The cells of the cluster total row.
pub fn total_cells(view: &ClusterView) -> Vec<String> {
    let t = view.totals();
    vec![
        "TOTAL".into(),
        String::new(),
        format!("{}/{} up", t.up, t.nodes),
        String::new(),
        si(t.keys as f64),
        si(t.ops_per_sec),
        si(t.gets_per_sec),
        si(t.puts_per_sec),
        t.hit_ratio.map_or("-".into(), |h| format!("{:.1}", h * 100.0)),
        format!("{:.0}", t.cpu_percent),
        String::new(),
        bytes(t.rss_bytes as f64),
        String::new(),
        format!("{}/{}", si(t.bytes_in_per_sec), si(t.bytes_out_per_sec)),
        format!("{}/{}", si(t.nic_rx_per_sec), si(t.nic_tx_per_sec)),
        trend(&view.total_ops, 12),
        String::new(),
    ]
}

/// A sparkline of the last `width` points in block characters.
pub fn trend(series: &Series, width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let points: Vec<f64> = series.iter().rev().take(width).map(|&(_, v)| v).collect();
    let max = points.iter().cloned().fold(0.0, f64::max);
    points
        .iter()
        .rev()
        .map(|&v| {
            if max <= 0.0 {
                BARS[0]
            } else {
                BARS[((v / max) * 7.0).round().clamp(0.0, 7.0) as usize]
            }
        })
        .collect()
}

/// The table widget (also used, unselected, by the headless text output).
pub fn table(view: &ClusterView, now: Instant) -> Table<'static> {
    let header = Row::new(HEADERS.iter().map(|h| Cell::from(*h)))
        .style(Style::default().add_modifier(Modifier::BOLD).fg(Color::White))
        .bottom_margin(0);
    let mut rows: Vec<Row> = view
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let cells = node_cells(n, now);
            let style = match n.health {
                Health::Down { .. } => Style::default().fg(Color::Red),
                Health::Waiting => Style::default().fg(Color::DarkGray),
                Health::Up => Style::default(),
            };
            Row::new(cells.into_iter().enumerate().map(move |(c, text)| {
                let cell = Cell::from(text);
                if c == 0 && matches!(n.health, Health::Up) {
                    cell.style(Style::default().fg(node_color(i)))
                } else {
                    cell
                }
            }))
            .style(style)
        })
        .collect();
    rows.push(Row::new(total_cells(view)).style(Style::default().add_modifier(Modifier::BOLD)));
    let widths = WIDTHS.iter().map(|&w| {
        if w == 0 {
            Constraint::Min(10)
        } else {
            Constraint::Length(w)
        }
    });
    Table::new(rows, widths)
        .header(header)
        .column_spacing(1)
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
}

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let down: Vec<&NodeView> = app
        .view
        .nodes
        .iter()
        .filter(|n| matches!(n.health, Health::Down { .. }))
        .collect();
    let [table_area, problems] =
        Layout::vertical([Constraint::Min(3), Constraint::Length(down.len().min(3) as u16)]).areas(area);
    let mut state = TableState::default().with_selected(Some(app.selected));
    let block = Block::default().borders(Borders::ALL).title(" nodes ");
    frame.render_stateful_widget(table(&app.view, app.now).block(block), table_area, &mut state);
    let lines: Vec<Line> = down
        .iter()
        .take(3)
        .map(|n| {
            let error = match &n.health {
                Health::Down { error } => error.as_str(),
                _ => "",
            };
            let seen = n.last_seen.map_or("never seen".to_string(), |t| {
                format!(
                    "last seen {} ago",
                    uptime(app.now.saturating_duration_since(t).as_secs())
                )
            });
            Line::styled(
                format!(" {} is down ({seen}, retrying): {error}", n.addr),
                Style::default().fg(Color::Red),
            )
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), problems);
}

/// The table as plain text lines (for `kvtui --once`), drawn by the same widget.
pub fn as_text(view: &ClusterView, now: Instant, width: u16) -> String {
    use ratatui::buffer::Buffer;
    use ratatui::widgets::Widget;
    let height = view.nodes.len() as u16 + 2;
    let area = Rect::new(0, 0, width, height);
    let mut buf = Buffer::empty(area);
    table(view, now).render(area, &mut buf);
    let mut out = String::new();
    for y in 0..height {
        let line: String = (0..width).map(|x| buf[(x, y)].symbol().to_string()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
