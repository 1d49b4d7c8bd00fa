//! Time-series charts over the sliding window: op/s, server-side p99, CPU and network per
//! node (on a narrow screen only the first two).

use kvshared::units::{bytes_per_sec, micros, si};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::Span;
use ratatui::widgets::{Axis, Block, Borders, Chart, Dataset, GraphType, LegendPosition};

use super::node_color;
use crate::app::App;
use crate::state::Series;

/// Below this width only the op/s and p99 charts are drawn.
const ALL_CHARTS_WIDTH: u16 = 120;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let (ops, p99, cpu, net) = if area.width >= ALL_CHARTS_WIDTH {
        let [ops, p99, cpu, net] = Layout::horizontal([
            Constraint::Percentage(31),
            Constraint::Percentage(23),
            Constraint::Percentage(23),
            Constraint::Percentage(23),
        ])
        .areas(area);
        (ops, p99, Some(cpu), Some(net))
    } else {
        let [ops, p99] = Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(area);
        (ops, p99, None, None)
    };
    let mut ops_series: Vec<(String, &Series, Color)> = app
        .view
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.addr.clone(), &n.ops, node_color(i)))
        .collect();
    ops_series.push(("total".into(), &app.view.total_ops, Color::White));
    let per_node = |pick: fn(&crate::state::NodeView) -> &Series| -> Vec<(String, &Series, Color)> {
        app.view
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.addr.clone(), pick(n), node_color(i)))
            .collect()
    };
    let end = app.view.secs(app.now);
    let window = TimeWindow {
        start: end - app.window.as_secs_f64(),
        end,
        start_label: format!("-{}s", app.window.as_secs()),
    };
    render_line_chart(frame, ops, " op/s ", &ops_series, &window, si);
    render_line_chart(
        frame,
        p99,
        " kvd p99 service time ",
        &per_node(|n| &n.p99_us),
        &window,
        |v| micros(v.round() as u64),
    );
    if let Some(cpu) = cpu {
        render_line_chart(
            frame,
            cpu,
            " kvd CPU % (of one core) ",
            &per_node(|n| &n.cpu),
            &window,
            |v| format!("{v:.0}%"),
        );
    }
    if let Some(net) = net {
        render_line_chart(
            frame,
            net,
            " kvd network in+out ",
            &per_node(|n| &n.net),
            &window,
            bytes_per_sec,
        );
    }
}

/// The stretch of time a chart shows, in seconds since the dashboard started.
pub struct TimeWindow {
    pub start: f64,
    pub end: f64,
    pub start_label: String,
}

/// Draws named series over `window`, the y axis from 0 to just above the largest value.
pub fn render_line_chart(
    frame: &mut Frame,
    area: Rect,
    title: &str,
    series: &[(String, &Series, Color)],
    window: &TimeWindow,
    label: fn(f64) -> String,
) {
    let (start, end) = (window.start, window.end);
    let points: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|(_, s, _)| s.iter().copied().filter(|&(t, _)| t >= start).collect())
        .collect();
    let max = points
        .iter()
        .flat_map(|p| p.iter().map(|&(_, v)| v))
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.1;
    let datasets: Vec<Dataset> = series
        .iter()
        .zip(&points)
        .map(|((name, _, color), pts)| {
            Dataset::default()
                .name(name.clone())
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::default().fg(*color))
                .data(pts)
        })
        .collect();
    let label = |v: f64| Span::raw(label(v));
    let chart = Chart::new(datasets)
        .block(Block::default().borders(Borders::ALL).title(title))
        .legend_position(Some(LegendPosition::TopLeft))
        // The default hides a legend wider than a quarter of the chart, which is every
        // legend of a few nodes' addresses.
        .hidden_legend_constraints((Constraint::Percentage(70), Constraint::Percentage(70)))
        .x_axis(
            Axis::default()
                .bounds([start, end])
                .labels([window.start_label.clone(), "now".to_string()]),
        )
        .y_axis(
            Axis::default()
                .bounds([0.0, max])
                .labels([label(0.0), label(max / 2.0), label(max)]),
        );
    frame.render_widget(chart, area);
}
