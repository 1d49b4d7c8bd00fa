//! The node table: one row per node and a cluster total row.

use std::time::Instant;

use kvshared::stats::GroupRole;
use kvshared::units::{bytes, bytes_of, nanos, si, uptime};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState};

use super::node_color;
use crate::app::App;
use crate::state::{ClusterView, Health, NodeView, Origin, Series, Standing};

/// One column: its header, width, and how much it matters when the terminal is narrow
/// (0 is kept longest; columns are dropped from the highest rank down).
struct Column {
    header: &'static str,
    width: u16,
    rank: u8,
}

const fn col(header: &'static str, width: u16, rank: u8) -> Column {
    Column { header, width, rank }
}

/// The columns in display order. NODE's width is a most; it shrinks to the longest address.
const COLUMNS: [Column; 22] = [
    col("NODE", 21, 0),
    col("SHARD", 5, 4),
    col("STATE", 11, 1),
    col("UPTIME", 7, 7),
    col("KEYS", 7, 3),
    col("OP/S", 7, 0),
    col("GET/S", 7, 6),
    col("PUT/S", 7, 6),
    col("APPLY/S", 7, 6),
    col("ERR/S", 6, 1),
    col("REDIR/S", 7, 6),
    col("HIT%", 5, 5),
    col("P50", 8, 3),
    col("P99", 8, 2),
    col("CPU%", 5, 2),
    col("HOST%", 5, 7),
    col("RSS", 7, 4),
    col("HOST MEM", 13, 8),
    col("NET IN/OUT", 13, 5),
    col("NIC RX/TX", 13, 8),
    col("TREND", 12, 6),
    col("", 0, 9),
];

/// Every column header, in display order (the last, unnamed one holds a down node's error).
pub const HEADERS: [&str; 22] = {
    let mut h = [""; 22];
    let mut i = 0;
    while i < COLUMNS.len() {
        h[i] = COLUMNS[i].header;
        i += 1;
    }
    h
};

/// Index of the ERR/S column (drawn red when not zero).
const ERRORS: usize = 9;
/// Columns of a down node that show its last known figures, dimmed as stale.
const STALE_WHEN_DOWN: [usize; 6] = [1, 3, 4, 15, 16, 17];
/// Space between columns.
const SPACING: u16 = 1;

/// Which columns fit in `width` cells, in display order, and NODE's width: the most
/// important first (see `Column::rank`), the error text only when room is left over.
pub fn visible_columns(width: u16, node_width: u16) -> Vec<usize> {
    let node_width = node_width.clamp(4, COLUMNS[0].width);
    let mut order: Vec<usize> = (0..COLUMNS.len()).collect();
    order.sort_by_key(|&i| COLUMNS[i].rank);
    let mut used = 0u16;
    let mut shown = Vec::new();
    for i in order {
        let w = if i == 0 { node_width } else { COLUMNS[i].width };
        let need = if shown.is_empty() { w } else { w + SPACING };
        if w == 0 {
            // The error text: only with room for some of it.
            if used + SPACING + 10 <= width {
                shown.push(i);
            }
            continue;
        }
        if used + need > width {
            continue;
        }
        used += need;
        shown.push(i);
    }
    shown.sort_unstable();
    shown
}

/// The cells of one node's row, every column.
pub fn node_cells(n: &NodeView, now: Instant) -> Vec<String> {
    let down = matches!(n.health, Health::Down { .. });
    let s = n.stats.as_ref();
    let r = n.rates.as_ref();
    let state = match &n.health {
        // A node whose disk refuses writes says so first (its writes are refused).
        Health::Up if s.is_some_and(|s| s.durability.stalled_since_unix_ms != 0) => "disk stalled".to_string(),
        // Its group's leader no longer lists it (it may still believe it follows).
        Health::Up if n.standing == Standing::Removed => "removed".to_string(),
        // A replica group's member says its role.
        Health::Up => match s.map(|s| s.group.role) {
            // The leader stands out in its group's rows, with the group's size when it has
            // more than itself (voters and learners: the shard's replicas).
            Some(GroupRole::Leader) => match s.map_or(0, |s| s.group.members.len() + s.group.learners.len()) {
                0 | 1 => "★ leader".to_string(),
                n => format!("★ leader ×{n}"),
            },
            Some(role) if role.in_group() => role.to_string(),
            _ => "up".to_string(),
        },
        Health::Waiting => "…".to_string(),
        Health::Silent => match n.last_seen {
            Some(t) => format!("not answering {}", uptime(now.saturating_duration_since(t).as_secs())),
            None => "not answering".to_string(),
        },
        Health::Down { .. } => match n.last_seen {
            Some(t) => format!("down {}", uptime(now.saturating_duration_since(t).as_secs())),
            None => "down".to_string(),
        },
    };
    let rate = |f: &dyn Fn(&kvshared::stats::NodeRates) -> f64| r.map_or("-".to_string(), |r| si(f(r)));
    let quantiles = n.recent_quantiles_ns();
    vec![
        // A member learned from its group, not listed in --nodes, is marked.
        match n.origin {
            Origin::Listed => n.addr.clone(),
            Origin::Learned => format!("{}⁺", n.addr),
        },
        s.map_or("-".into(), |s| s.shard.to_string()),
        state,
        s.map_or("-".into(), |s| uptime(s.uptime_ms / 1000)),
        s.map_or("-".into(), |s| si(s.keys as f64)),
        rate(&|r| r.ops_per_sec),
        rate(&|r| r.gets_per_sec),
        rate(&|r| r.puts_per_sec),
        // Ops replayed from the log: on a follower, the leader's writes (not served here).
        rate(&|r| r.applied_per_sec),
        rate(&|r| r.errors_per_sec),
        // MOVED and TRYAGAIN: clients follow them (a slot move makes many); not errors.
        rate(&|r| r.redirects_per_sec),
        r.and_then(|r| r.hit_ratio)
            .map_or("-".into(), |h| format!("{:.1}", h * 100.0)),
        quantiles.map_or("-".into(), |(p50, _)| nanos(p50)),
        quantiles.map_or("-".into(), |(_, p99)| nanos(p99)),
        r.map_or("-".into(), |r| format!("{:.0}", r.process_cpu_percent)),
        s.map_or("-".into(), |s| format!("{:.0}", s.system.host_cpu_percent)),
        s.map_or("-".into(), |s| bytes(s.system.process_rss_bytes as f64)),
        s.map_or("-".into(), |s| {
            bytes_of(
                s.system.host_mem_used_bytes as f64,
                s.system.host_mem_total_bytes as f64,
            )
        }),
        r.map_or("-".into(), |r| {
            format!("{}/{}", si(r.bytes_in_per_sec), si(r.bytes_out_per_sec))
        }),
        r.map_or("-".into(), |r| {
            format!("{}/{}", si(r.host_rx_per_sec), si(r.host_tx_per_sec))
        }),
        if down { String::new() } else { trend(&n.ops, 12) },
        match &n.health {
            Health::Down { error } => error.clone(),
            Health::Silent => "no answer to the last poll yet: its figures are old".to_string(),
            _ => String::new(),
        },
    ]
}

/// The cells of the cluster total row, every column.
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
        String::new(),
        si(t.errors_per_sec),
        si(t.redirects_per_sec),
        t.hit_ratio.map_or("-".into(), |h| format!("{:.1}", h * 100.0)),
        String::new(),
        String::new(),
        format!("{:.0}", t.cpu_percent),
        String::new(),
        bytes(t.rss_bytes as f64),
        String::new(),
        format!("{}/{}", si(t.net_in_per_sec), si(t.net_out_per_sec)),
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

/// The table widget for `width` cells (also used, unselected, by the headless text output).
pub fn table(view: &ClusterView, now: Instant, width: u16) -> Table<'static> {
    let node_width = view
        .nodes
        .iter()
        .map(|n| n.addr.chars().count())
        .chain([5])
        .max()
        .unwrap_or(5) as u16;
    let shown = visible_columns(width, node_width);
    let pick = move |cells: Vec<String>| -> Vec<(usize, String)> {
        cells
            .into_iter()
            .enumerate()
            .filter(|(i, _)| shown.contains(i))
            .collect()
    };
    let header = Row::new(
        pick(HEADERS.iter().map(|h| h.to_string()).collect())
            .into_iter()
            .map(|(_, h)| Cell::from(h)),
    )
    .style(Style::default().add_modifier(Modifier::BOLD).fg(Color::White))
    .bottom_margin(0);
    let mut rows: Vec<Row> = view
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let down = matches!(n.health, Health::Down { .. });
            let style = match n.health {
                Health::Down { .. } => Style::default().fg(Color::Red),
                Health::Waiting => Style::default().fg(Color::DarkGray),
                Health::Silent => Style::default().fg(Color::Yellow),
                Health::Up => Style::default(),
            };
            let errors = n.rates.as_ref().is_some_and(|r| r.errors_per_sec > 0.0);
            Row::new(pick(node_cells(n, now)).into_iter().map(move |(c, text)| {
                let cell = Cell::from(text);
                match c {
                    0 if !down && n.is_up() => cell.style(Style::default().fg(node_color(i))),
                    ERRORS if errors => cell.style(Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)),
                    c if down && STALE_WHEN_DOWN.contains(&c) => cell.style(Style::default().fg(Color::DarkGray)),
                    _ => cell,
                }
            }))
            .style(style)
        })
        .collect();
    let total_errors = view.totals().errors_per_sec > 0.0;
    rows.push(
        Row::new(pick(total_cells(view)).into_iter().map(move |(c, text)| {
            let cell = Cell::from(text);
            if c == ERRORS && total_errors {
                cell.style(Style::default().fg(Color::Red))
            } else {
                cell
            }
        }))
        .style(Style::default().add_modifier(Modifier::BOLD)),
    );
    let widths: Vec<Constraint> = visible_columns(width, node_width)
        .into_iter()
        .map(|i| match (i, COLUMNS[i].width) {
            (0, _) => Constraint::Length(node_width.clamp(4, COLUMNS[0].width)),
            (_, 0) => Constraint::Min(10),
            (_, w) => Constraint::Length(w),
        })
        .collect();
    Table::new(rows, widths)
        .header(header)
        .column_spacing(SPACING)
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
}

/// Most lines saying which nodes are down, under the table.
const MAX_DOWN_LINES: usize = 3;

fn down_nodes(view: &ClusterView) -> Vec<&NodeView> {
    view.nodes
        .iter()
        .filter(|n| matches!(n.health, Health::Down { .. }))
        .collect()
}

/// The lines the table wants: every node, the header and total rows, the borders, and the
/// down nodes' lines.
pub fn wanted_height(view: &ClusterView) -> u16 {
    (view.nodes.len() + 4 + down_nodes(view).len().min(MAX_DOWN_LINES)) as u16
}

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let down = down_nodes(&app.view);
    // The down lines give way first when the table is short of room, so that every node
    // row and the total stay in view.
    let rows_needed = app.view.nodes.len() as u16 + 4;
    let down_lines = (down.len().min(MAX_DOWN_LINES) as u16).min(area.height.saturating_sub(rows_needed));
    let [table_area, problems] = Layout::vertical([Constraint::Min(3), Constraint::Length(down_lines)]).areas(area);
    let mut state = TableState::default().with_selected(Some(app.selected));
    let block = Block::default().borders(Borders::ALL).title(" nodes ");
    let width = table_area.width.saturating_sub(2);
    frame.render_stateful_widget(table(&app.view, app.now, width).block(block), table_area, &mut state);
    let lines: Vec<Line> = down
        .iter()
        .take(down_lines as usize)
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
    table(view, now, width).render(area, &mut buf);
    let mut out = String::new();
    for y in 0..height {
        let line: String = (0..width).map(|x| buf[(x, y)].symbol().to_string()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
