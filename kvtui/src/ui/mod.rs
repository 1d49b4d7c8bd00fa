//! Drawing. One file per widget; each takes plain state and returns or renders a widget.

mod bench;
mod charts;
mod detail;
mod help;
pub mod table;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::app::{App, Mode};

/// Colours of the nodes' lines in charts and their names in the table.
pub const NODE_COLORS: [Color; 8] = [
    Color::Cyan,
    Color::Yellow,
    Color::Green,
    Color::Magenta,
    Color::LightBlue,
    Color::LightRed,
    Color::LightGreen,
    Color::LightYellow,
];

pub fn node_color(i: usize) -> Color {
    NODE_COLORS[i % NODE_COLORS.len()]
}

/// Membership changes shown under the table, at most.
const CHANGE_LINES: usize = 3;
/// Hosts whose CPU split is shown under the table, at most.
const HOST_LINES: usize = 4;

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let problems: Vec<String> = app.view.layout_problems().iter().map(ToString::to_string).collect();
    let banner_height = problems.len().min(3) as u16;
    let bench_height = if app.bench.is_some() { 10 } else { 0 };
    // The table takes what it needs to show every node and the total; the charts get the
    // rest (and shrink to nothing on a short screen).
    let room = area.height.saturating_sub(1 + banner_height + bench_height);
    let table_height = table::wanted_height(&app.view).min(room);
    // Each host's CPU split and the groups' last membership changes (the shard manager's),
    // a line each, under the table while there is room for charts too.
    let mut notes: Vec<Line> = crate::hosts::hosts(&app.view)
        .iter()
        .take(HOST_LINES)
        .map(|h| Line::styled(format!(" {}", h.summary()), Style::default().fg(Color::Gray)))
        .collect();
    notes.extend(app.view.recent_changes(CHANGE_LINES).iter().map(|(shard, c)| {
        Line::styled(
            format!(" shard {shard}: {}", c.summary()),
            Style::default().fg(Color::Cyan),
        )
    }));
    let changes_height = match room.saturating_sub(table_height) >= 5 + notes.len() as u16 {
        true => notes.len() as u16,
        false => 0,
    };
    let [header, banner, bench_area, table_area, changes_area, rest] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(banner_height),
        Constraint::Length(bench_height),
        Constraint::Length(table_height),
        Constraint::Length(changes_height),
        Constraint::Min(0),
    ])
    .areas(area);
    frame.render_widget(header_line(app), header);
    if banner_height > 0 {
        let lines: Vec<Line> = problems
            .iter()
            .take(banner_height as usize)
            .map(|p| {
                Line::styled(
                    format!(" --nodes does not match the cluster: {p}"),
                    Style::default()
                        .fg(Color::White)
                        .bg(Color::Red)
                        .add_modifier(Modifier::BOLD),
                )
            })
            .collect();
        frame.render_widget(Paragraph::new(lines), banner);
    }
    if let Some(b) = &app.bench {
        bench::render(frame, bench_area, b);
    }
    table::render(frame, table_area, app);
    if changes_height > 0 {
        frame.render_widget(Paragraph::new(notes), changes_area);
    }
    if rest.height >= 5 {
        match app.screen_under_help() {
            Mode::Detail => detail::render(frame, rest, app),
            _ => charts::render(frame, rest, app),
        }
    }
    if app.mode == Mode::Help {
        let (w, h) = help::size();
        help::render(frame, centered(area, w, h));
    }
}

fn header_line(app: &App) -> Paragraph<'static> {
    let t = app.view.totals();
    let mut spans = vec![
        Span::styled(
            " kvtui ",
            Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED),
        ),
        Span::raw(format!(
            "  {}/{} nodes up   every {}   window {}s",
            t.up,
            t.nodes,
            humantime::format_duration(app.interval),
            app.window.as_secs()
        )),
    ];
    if let Some(speed) = app.replay {
        spans.push(Span::styled(
            format!("   REPLAY {speed}x"),
            Style::default().fg(Color::Black).bg(Color::Cyan),
        ));
    }
    if app.paused {
        spans.push(Span::styled(
            "   PAUSED",
            Style::default().fg(Color::Black).bg(Color::Yellow),
        ));
    }
    spans.push(Span::styled(
        "   ↑↓ select  ⏎ detail  p pause  +/- interval  w window  ? help  q quit",
        Style::default().fg(Color::DarkGray),
    ));
    Paragraph::new(Line::from(spans))
}

fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(area.width);
    let h = height.min(area.height);
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}
