//! The selected node's detail view: every counter, errors by kind, per-interface network.

use kvshared::units::{bytes, bytes_per_sec, grouped, nanos, si, uptime};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};

use crate::app::App;
use crate::state::Health;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let Some(n) = app.view.nodes.get(app.selected) else {
        return;
    };
    let [left, right] = Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(area);
    let title = format!(" {} (Enter or Esc: back) ", n.addr);
    let mut lines = Vec::new();
    if let Health::Down { error } = &n.health {
        lines.push(Line::styled(format!("DOWN: {error}"), Style::default().fg(Color::Red)));
    }
    match (&n.stats, &n.rates) {
        (None, _) => lines.push(Line::from("no stats received yet")),
        (Some(s), r) => {
            let (c, sys) = (&s.counts, &s.system);
            let errors: Vec<String> = c
                .errors_by_kind()
                .map(|(name, v)| format!("{} {}", name.replace('_', " "), grouped(v)))
                .collect();
            let per = |f: fn(&kvshared::stats::NodeRates) -> f64| r.as_ref().map_or("-".to_string(), |r| si(f(r)));
            let host = crate::hosts::hosts(&app.view)
                .into_iter()
                .find(|h| h.name == sys.host_name)
                .map_or_else(|| "host CPU split: not measured yet".to_string(), |h| h.summary());
            lines.extend([
                Line::styled(
                    format!(
                        "shard {}   kvd {}   pid {}   host {} ({} CPUs)",
                        s.shard, s.version, s.pid, sys.host_name, sys.host_cpus
                    ),
                    Style::default().add_modifier(Modifier::BOLD),
                ),
                Line::from(host),
                Line::from(format!(
                    "uptime {}   keys {}   map shards {}   worker threads {}",
                    uptime(s.uptime_ms / 1000),
                    grouped(s.keys),
                    s.map_shards,
                    s.worker_threads
                )),
                Line::from(format!("hash slots {}", s.slots_summary())),
                Line::from(format!(
                    "slot moves {}",
                    s.moves_summary(r.as_ref().map(|r| r.keys_loaded_per_sec))
                        .unwrap_or_else(|| "none".into())
                )),
                Line::from(""),
                Line::from(format!(
                    "gets      {:>16}   {:>8}/s",
                    grouped(c.gets),
                    per(|r| r.gets_per_sec)
                )),
                Line::from(format!(
                    "puts      {:>16}   {:>8}/s",
                    grouped(c.puts),
                    per(|r| r.puts_per_sec)
                )),
                Line::from(format!(
                    "deletes   {:>16}   {:>8}/s",
                    grouped(c.deletes),
                    per(|r| r.deletes_per_sec)
                )),
                Line::from(format!(
                    "data {}{}   evicted {}   refused for memory {}",
                    s.memory_summary(),
                    match s.eviction.as_str() {
                        "" => String::new(),
                        policy => format!(" (evicts {policy})"),
                    },
                    grouped(c.evicted),
                    grouped(c.out_of_memory)
                )),
                Line::from(format!("hits      {:>16}", grouped(c.hits))),
                Line::from(format!("misses    {:>16}", grouped(c.misses))),
                Line::from(format!("batches   {:>16}", grouped(c.batches))),
                Line::from(format!(
                    "bytes in  {:>16}   {:>10}",
                    bytes(c.bytes_in as f64),
                    r.as_ref().map_or("-".into(), |r| bytes_per_sec(r.bytes_in_per_sec))
                )),
                Line::from(format!(
                    "bytes out {:>16}   {:>10}",
                    bytes(c.bytes_out as f64),
                    r.as_ref().map_or("-".into(), |r| bytes_per_sec(r.bytes_out_per_sec))
                )),
                Line::from(format!(
                    "connections open {}   total {}",
                    c.connections_open(),
                    c.conns_opened
                )),
                Line::from(""),
                Line::from(format!(
                    "kvd CPU {:.0}% of one core   RSS {}   host CPU {:.0}%   host memory {} / {}",
                    r.as_ref()
                        .map_or(f64::from(sys.process_cpu_percent), |r| r.process_cpu_percent),
                    bytes(sys.process_rss_bytes as f64),
                    sys.host_cpu_percent,
                    bytes(sys.host_mem_used_bytes as f64),
                    bytes(sys.host_mem_total_bytes as f64)
                )),
                Line::from(""),
            ]);
            lines.extend(s.durability.summary_lines().into_iter().map(Line::from));
            let g = &s.group;
            if g.role.in_group() {
                let lag: Vec<String> = g
                    .lag
                    .iter()
                    .map(|l| format!("{} {} behind", l.addr, l.behind))
                    .collect();
                lines.push(Line::from(format!(
                    "replica group: {}   term {}   leader {}   log {}   commit {}   applied {}   elections seen {}",
                    g.role,
                    g.term,
                    if g.leader.is_empty() {
                        "unknown"
                    } else {
                        g.leader.as_str()
                    },
                    grouped(g.log_index),
                    grouped(g.commit_index),
                    grouped(g.applied_index),
                    g.elections
                )));
                lines.push(Line::from(format!(
                    "voters: {}{}",
                    g.members.join(", "),
                    match g.learners.is_empty() {
                        true => String::new(),
                        false => format!("   learners: {}", g.learners.join(", ")),
                    }
                )));
                if !lag.is_empty() {
                    lines.push(Line::from(format!("followers: {}", lag.join("   "))));
                }
                for change in g.changes.iter().rev().take(3) {
                    lines.push(Line::from(change.summary()));
                }
            }
            let recent = n.latency.as_ref();
            lines.extend([
                Line::from(format!(
                    "service time, last interval: {}",
                    recent.map_or("-".into(), |l| l.summary())
                )),
                Line::from(format!("service time, since start:   {}", s.latency.summary())),
                Line::from(format!(
                    "slowest map shards (p99, last interval): {}",
                    recent
                        .map(|l| l.slowest_map_shards(3))
                        .filter(|v| !v.is_empty())
                        .map_or("-".into(), |v| v
                            .iter()
                            .map(|(i, p99, n)| format!("#{i} {} ({n} batches)", nanos(*p99)))
                            .collect::<Vec<_>>()
                            .join("   "))
                )),
            ]);
            lines.extend([
                Line::from(""),
                Line::styled("errors by kind", Style::default().add_modifier(Modifier::BOLD)),
                Line::from(format!("  {}", errors[..errors.len().min(3)].join("   "))),
                Line::from(format!("  {}", errors[errors.len().min(3)..].join("   "))),
            ]);
        }
    }
    frame.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(title)),
        left,
    );

    let rows: Vec<Row> = n
        .stats
        .iter()
        .flat_map(|s| s.system.interfaces.iter())
        .map(|i| {
            let rate = n
                .rates
                .as_ref()
                .and_then(|r| r.interfaces.iter().find(|ir| ir.name == i.name));
            Row::new(vec![
                i.name.clone(),
                bytes(i.rx_bytes as f64),
                bytes(i.tx_bytes as f64),
                rate.map_or("-".into(), |r| bytes_per_sec(r.rx_per_sec)),
                rate.map_or("-".into(), |r| bytes_per_sec(r.tx_per_sec)),
            ])
        })
        .collect();
    let table = Table::new(
        rows,
        [
            Constraint::Length(10),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(11),
            Constraint::Length(11),
        ],
    )
    .header(Row::new(vec!["IFACE", "RX", "TX", "RX/s", "TX/s"]).style(Style::default().add_modifier(Modifier::BOLD)))
    .block(Block::default().borders(Borders::ALL).title(" host interfaces "));
    frame.render_widget(table, right);
}
