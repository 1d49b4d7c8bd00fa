//! The benchmark panel of `kvbench run --tui`: progress (warm-up marked), live throughput
//! and latency.

use kvshared::units::si;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Gauge, Paragraph};

use super::charts::{TimeWindow, render_line_chart};
use crate::app::BenchView;

pub fn render(frame: &mut Frame, area: Rect, b: &BenchView) {
    let [info, tput, lat] = Layout::horizontal([
        Constraint::Percentage(34),
        Constraint::Percentage(33),
        Constraint::Percentage(33),
    ])
    .areas(area);
    let p = &b.progress;
    let [gauge_area, text_area] = Layout::vertical([Constraint::Length(3), Constraint::Min(0)]).areas(info);
    let ratio = if p.total.is_zero() {
        0.0
    } else {
        (p.elapsed.as_secs_f64() / p.total.as_secs_f64()).clamp(0.0, 1.0)
    };
    let warming = p.elapsed < p.warmup;
    let phase = if p.done {
        "done"
    } else if warming {
        "WARM-UP (not measured)"
    } else {
        "measuring"
    };
    let gauge = Gauge::default()
        .block(Block::default().borders(Borders::ALL).title(format!(" {} ", p.title)))
        .gauge_style(Style::default().fg(if warming { Color::Yellow } else { Color::Green }))
        .ratio(ratio)
        .label(format!(
            "{phase}  {:.0}s / {:.0}s",
            p.elapsed.as_secs_f64(),
            p.total.as_secs_f64()
        ));
    frame.render_widget(gauge, gauge_area);
    let current = b.throughput.back().map_or(0.0, |&(_, v)| v);
    let (p50, p99) = b.p50.back().zip(b.p99.back()).map_or((0.0, 0.0), |(a, c)| (a.1, c.1));
    let remaining = p.total.saturating_sub(p.elapsed);
    let text = vec![
        Line::from(format!("throughput  {} op/s", si(current))),
        Line::from(format!("batch p50   {p50:.0} us   p99 {p99:.0} us")),
        Line::from(format!(
            "measured    {} ops   failed {}   (+{} in warm-up)",
            si(p.measured_ops as f64),
            p.failed_ops,
            si(p.completed_ops.saturating_sub(p.measured_ops) as f64)
        )),
        Line::from(format!(
            "remaining   {:.0}s (warm-up {:.0}s excluded from results)",
            remaining.as_secs_f64(),
            p.warmup.as_secs_f64()
        )),
    ];
    frame.render_widget(
        Paragraph::new(text).block(Block::default().borders(Borders::ALL).title(" benchmark ")),
        text_area,
    );
    // The benchmark's charts cover the whole run so far.
    let end = b.throughput.back().map_or(1.0, |&(t, _)| t);
    let begin = b.throughput.front().map_or(0.0, |&(t, _)| t);
    let window = TimeWindow {
        start: begin.min(end - 1.0),
        end,
        start_label: format!("-{:.0}s", end - begin),
    };
    render_line_chart(
        frame,
        tput,
        " benchmark op/s ",
        &[("kvbench".to_string(), &b.throughput, Color::White)],
        &window,
        si,
    );
    render_line_chart(
        frame,
        lat,
        " batch latency ",
        &[
            ("p50".to_string(), &b.p50, Color::Green),
            ("p99".to_string(), &b.p99, Color::Red),
        ],
        &window,
        |us| {
            if us >= 1000.0 {
                format!("{:.1}ms", us / 1000.0)
            } else {
                format!("{us:.0}us")
            }
        },
    );
}
